"""Paired evaluation on a finished Stage 1: methods on the same held-out contexts.

Runs the named evaluation methods on N held-out contexts per mode (support: EmpatheticDialogues,
meeting: QMSum; `--modes`) with T agent turns, using the persona adapters registered in
MASCOT_HOME's MLflow store (the latest versions; the director is the trained one if registered,
else the base model), scores them with
the `eval_scores` asset after each method (so a run stopped early keeps what finished), and
prints every criterion's paired difference to MASCOT (cluster bootstrap by context, n,
significance mark). Every method sees the same contexts, simulated users and seeds. `--report`
then materialises `eval_scores`, `three_way_comparisons`, `human_ratings` and `eval_report` (the
paper-layout report, with the champion gate) on what was generated. Meant for a home where
`mascot demo --profile study` finished Stage 1; it replaces that home's eval dialogues:

    MASCOT_HOME=/path/to/study-home python scripts/study_eval.py --contexts 32 --turns 6 \
        --modes support,meeting --methods mascot,zero_shot,sft,few_shot,mascot_c,mascot_p --report

Adding methods to a finished evaluation, paired with its stored MASCOT dialogues (the profile's
contexts, OOD included, restricted to those MASCOT has):

    MASCOT_HOME=/path/to/study-home python scripts/study_eval.py --paired-with mascot \
        --methods few_shot,zero_shot_cot --report

Stage 2 on that home (`--stage2`: group_rollouts, group_judgments, director_adapter and
director_comparison as assets; `--set KEY=VALUE` changes a lineage setting as `mascot demo --set`
does, for every step of this call), then MASCOT again with the trained director, paired with the
stored base-director dialogues (back the DuckDB file up first to compare the two):

    MASCOT_HOME=/path/to/study-home python scripts/study_eval.py --stage2 --set director_steps=24 \
        --set rollout_dialogues=4 --set director_compare_contexts=6 --report-only
    MASCOT_HOME=/path/to/study-home python scripts/study_eval.py --paired-with mascot \
        --methods mascot

A/B of a lineage setting (e.g. group-aware Stage 1): copy the DuckDB file after the first
evaluation, change the setting and retrain, evaluate the same method again, then

    MASCOT_HOME=/path/to/study-home python scripts/study_eval.py --against before.duckdb \
        --ab-method mascot_c
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("MASCOT_PROFILE", "study")


def resources(assignments: list[str]) -> dict:
    """The profile's resources with `--set` assignments applied to its settings."""
    from mascot_dag.profiles import override_settings, resources_for

    res = resources_for()
    res["settings"] = override_settings(res["settings"], assignments)
    return res


def stage2(res: dict) -> None:
    """Stage 2 on a finished Stage 1, as assets: rollouts, group judgments, the director's GRPO,
    and the trained-vs-base director comparison (with its check)."""
    import dagster as dg

    from mascot_dag.assets.collaboration import (
        director_adapter,
        group_judgments,
        group_rollouts,
        group_rollouts_directive_every_agent_turn_check,
    )
    from mascot_dag.assets.director_eval import director_comparison, director_not_worse

    # the checks run with their assets (the rollout check blocks the director on bad rollouts)
    assert dg.materialize([group_rollouts, group_rollouts_directive_every_agent_turn_check,
                           group_judgments, director_adapter, director_comparison,
                           director_not_worse], resources=res).success


def run(res: dict, methods: list[str], modes: list[str], n_contexts: int | None,
        turns: int | None, paired_with: str | None) -> None:
    """Each method through the `eval_dialogues` asset's own per-method step (`eval_method`), then
    `eval_scores`. `n_contexts`/`turns` override the profile's (the OOD split then stays out);
    `paired_with` keeps only the contexts that method's stored eval dialogues have, so a method
    added to a finished evaluation pairs with it (same contexts, users and seeds)."""
    import dagster as dg

    from mascot_dag.assets.evaluation import eval_method, eval_scores, eval_specs
    from mascot_dag.assets.queries import rosters
    from mascot_dag.registry import DIRECTOR_MODEL, attach, attach_personas

    s = res["settings"]
    fields = {k: getattr(s, k) for k in type(s).model_fields}
    if n_contexts is not None:
        fields.update(eval_contexts=n_contexts, ood_valences=[], ood_domains=[])
    if turns is not None:
        fields.update(agent_turns=turns)
    res["settings"] = settings = type(s)(**fields)
    store, chat, tracking = res["store"], res["chat"], res["tracking"]
    specs = [sp for sp in eval_specs(store, settings) if sp.mode in modes]
    if paired_with:
        # only the modes asked for: a support-only addition pairs with a two-mode evaluation
        have = {r[0]: r[1] for r in store.frame(
            "SELECT context_id, seed FROM dialogues WHERE stage = 'eval' AND method = ? "
            "AND list_contains(?, mode)", [paired_with, modes]).rows()}
        if not have:
            raise SystemExit(f"--paired-with {paired_with}: no stored eval dialogues of it")
        specs = [sp for sp in specs if sp.context.context_id in have]
        stale = [sp.context.context_id for sp in specs if have[sp.context.context_id] != sp.seed]
        if stale or len(specs) < len(have):
            raise SystemExit(f"--paired-with {paired_with}: {len(have)} stored contexts, "
                             f"{len(specs)} rebuilt, seeds differ for {stale[:3]}: the settings "
                             "(contexts, turns, OOD, seed) are not the ones it ran with")
    persona_ids = [c.persona_id for c in rosters(store)["support"]]
    models = (*attach_personas(chat, tracking, persona_ids, None),
              *attach(chat, tracking, DIRECTOR_MODEL, None))
    print(f"{len(specs)} dialogues per method, {settings.agent_turns} agent turns; personas "
          f"{models[1]}; director {models[3] or 'base'}", flush=True)
    for m in methods:
        t0 = time.time()
        meta = eval_method(m, specs, store, chat, tracking, settings, models)
        print(f"{m}: {meta['dialogues']} dialogues in {time.time() - t0:.0f} s", flush=True)
        assert dg.materialize([eval_scores], resources=res).success


def full_report(res: dict) -> None:
    import dagster as dg

    from mascot_dag.assets.evaluation import eval_report, eval_scores, three_way_comparisons
    from mascot_dag.assets.human import human_ratings

    # scores again first: what was scored while the methods ran came from that process's code
    assets = [eval_scores, three_way_comparisons, human_ratings, eval_report]
    assert dg.materialize(assets, resources=res).success


def report() -> None:
    from mascot_dag.lib.evaluation.stats import paired_cluster_bootstrap, significance_mark
    from mascot_dag.resources.store import DuckDBStore

    rows = DuckDBStore().frame(
        "SELECT s.method, d.context_id, d.mode, s.level, s.judge, s.criterion, s.value "
        "FROM eval_scores s JOIN dialogues d USING (dialogue_id) "
        "WHERE s.value IS NOT NULL").rows()
    by: dict = {}
    for m, ctx, mode, level, judge, crit, v in rows:
        for group in (mode, "all"):  # per mode, and both modes pooled (clustered by context)
            by.setdefault((group, level, judge, crit), {}).setdefault(m, {})[ctx] = v
    for key in sorted(by):
        d = by[key]
        if "mascot" not in d:
            continue
        cells = [f"{key[0]} {key[1]}/{key[3]} ({key[2]}): mascot "
                 f"{sum(d['mascot'].values()) / len(d['mascot']):.3f}"]
        for b in sorted(set(d) - {"mascot"}):
            common = sorted(set(d["mascot"]) & set(d[b]))
            r = paired_cluster_bootstrap(common, [d["mascot"][k] - d[b][k] for k in common])
            cells.append(f"vs {b} {r['mean']:+.3f} [{r['lo']:+.3f},{r['hi']:+.3f}]"
                         f"{significance_mark(r['lo'], r['hi'], len(common))} n={len(common)}")
        print(" | ".join(cells))


def ab(against: str, method: str) -> None:
    """This home's `method` minus the same method in `against` (a DuckDB file: another home's,
    or this one's copied before a lineage change), paired by context (lib.ab)."""
    import polars as pl

    from mascot_dag.lib.evaluation.ab import compare, load_scores
    from mascot_dag.lib.markdown import markdown_table
    from mascot_dag.resources.store import DuckDBStore

    here = DuckDBStore().db_path
    table = compare(load_scores(against, method), load_scores(here, method))
    print(f"{method}: {here} (treatment) minus {against} (control), paired by context")
    print(markdown_table(table.with_columns(pl.col(pl.Float64).round(3))))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, help="per mode (default: the profile's, with OOD)")
    ap.add_argument("--turns", type=int, help="agent turns (default: the profile's)")
    ap.add_argument("--paired-with", help="only the contexts this method's eval dialogues have")
    ap.add_argument("--methods", default="mascot,zero_shot,few_shot")
    ap.add_argument("--modes", default="support,meeting", help="support and/or meeting (commas)")
    ap.add_argument("--report-only", action="store_true", help="print the paired figures only")
    ap.add_argument("--report", action="store_true", help="also build the eval_report asset")
    ap.add_argument("--stage2", action="store_true",
                    help="first Stage 2: rollouts, group judgments, director, director comparison")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a lineage setting over the profile's (repeatable), as mascot demo --set")
    ap.add_argument("--against", metavar="OTHER.duckdb",
                    help="A/B: --ab-method here minus in this DuckDB file (e.g. a copy taken "
                    "before a lineage change), paired by context; prints only that")
    ap.add_argument("--ab-method", default="mascot", help="the method --against compares")
    a = ap.parse_args()
    if a.against:
        ab(a.against, a.ab_method)
        raise SystemExit(0)
    res = resources(a.set)
    if a.stage2:
        stage2(res)
    if not a.report_only:
        run(res, a.methods.split(","), a.modes.split(","), a.contexts, a.turns, a.paired_with)
    if a.report:
        full_report(res)
    report()
