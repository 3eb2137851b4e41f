"""Paired evaluation on a finished Stage 1: methods on the same held-out support contexts.

Runs the named evaluation methods on N held-out EmpatheticDialogues contexts (support mode) with
T agent turns, using the persona adapters registered in MASCOT_HOME's MLflow store (the latest
versions; the director is the trained one if registered, else the base model), scores them with
the `eval_scores` asset, and prints every criterion's paired difference to MASCOT (cluster
bootstrap by context, n, significance mark). Every method sees the same contexts, simulated users
and seeds. Meant for a home where `mascot demo --profile study` finished Stage 1:

    MASCOT_HOME=/path/to/study-home python scripts/study_eval.py --contexts 24 --turns 4 \
        --methods mascot,zero_shot,few_shot,sft,multiagent_esc,mascot_c,mascot_p
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("MASCOT_PROFILE", "study")


def run(n_contexts: int, turns: int, methods: list[str]) -> None:
    import dagster as dg

    from mascot_dag.assets.collaboration import dialogue_config, rosters, write_dialogues
    from mascot_dag.assets.evaluation import eval_scores, eval_specs
    from mascot_dag.assets.registry import (
        DIRECTOR_MODEL,
        attach,
        attach_personas,
        attach_policy_sft,
    )
    from mascot_dag.lib.methods import run_method
    from mascot_dag.profiles import resources_for

    res = resources_for()
    s = res["settings"]
    fields = {k: getattr(s, k) for k in type(s).model_fields}
    fields.update(eval_contexts=n_contexts, agent_turns=turns, ood_valences=[], ood_domains=[])
    res["settings"] = settings = type(s)(**fields)
    store, chat, tracking = res["store"], res["chat"], res["tracking"]
    specs = [sp for sp in eval_specs(store, settings) if sp.mode == "support"]
    persona_ids = [c.persona_id for c in rosters(store)["support"]]
    adapters, versions = attach_personas(chat, tracking, persona_ids, None)
    director, director_version = attach(chat, tracking, DIRECTOR_MODEL, None)
    print(f"{len(specs)} dialogues per method, {turns} agent turns; personas {versions}; "
          f"director {director_version or 'base'}", flush=True)
    for m in methods:
        t0 = time.time()
        sft = attach_policy_sft(chat, tracking, "the sft baseline") if m == "sft" else None
        records = run_method(m, specs, chat.backend().generate, dialogue_config(settings),
                             persona_adapters=adapters, director_adapter=director,
                             sft_adapter=sft)
        write_dialogues(store, records, f"eval:{m}")
        print(f"{m}: {len(records)} dialogues in {time.time() - t0:.0f} s", flush=True)
    assert dg.materialize([eval_scores], resources=res).success


def report() -> None:
    from mascot_dag.lib.stats import paired_cluster_bootstrap, significance_mark
    from mascot_dag.resources.store import DuckDBStore

    rows = DuckDBStore().frame(
        "SELECT method, substr(dialogue_id, length('eval:' || method || ':') + 1) AS ctx, level, "
        "judge, criterion, value FROM eval_scores WHERE value IS NOT NULL").rows()
    by: dict = {}
    for m, ctx, level, judge, crit, v in rows:
        by.setdefault((level, judge, crit), {}).setdefault(m, {})[ctx] = v
    for key in sorted(by):
        d = by[key]
        if "mascot" not in d:
            continue
        cells = [f"{key[0]}/{key[2]} ({key[1]}): mascot "
                 f"{sum(d['mascot'].values()) / len(d['mascot']):.3f}"]
        for b in sorted(set(d) - {"mascot"}):
            common = sorted(set(d["mascot"]) & set(d[b]))
            r = paired_cluster_bootstrap(common, [d["mascot"][k] - d[b][k] for k in common])
            cells.append(f"vs {b} {r['mean']:+.3f} [{r['lo']:+.3f},{r['hi']:+.3f}]"
                         f"{significance_mark(r['lo'], r['hi'])} n={len(common)}")
        print(" | ".join(cells))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, default=24)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--methods", default="mascot,zero_shot,few_shot")
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args()
    if not a.report_only:
        run(a.contexts, a.turns, a.methods.split(","))
    report()
