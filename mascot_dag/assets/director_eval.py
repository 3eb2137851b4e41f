"""Stage 2 (group `collaboration`): the trained director against the base director, paired."""

import math
from types import SimpleNamespace

import dagster as dg
import polars.selectors as cs

from mascot_dag.assets.common import (
    DUCKDB_POOL,
    TRANSIENT_RETRY,
    cluster_tags,
    materialized,
    table_metadata,
    user_profiles,
)
from mascot_dag.assets.queries import pick_contexts, roster_ids, rosters
from mascot_dag.lib.dialogue.rollout import build_specs
from mascot_dag.lib.dialogue.spec import config_from_settings
from mascot_dag.lib.markdown import markdown_table
from mascot_dag.registry import DIRECTOR_MODEL, attach, attach_personas
from mascot_dag.resources.judge import JudgePanelResource
from mascot_dag.resources.llm import ChatModelResource
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore
from mascot_dag.resources.tracking import MLflowResource

PREFIX = "dircmp"
# What the director was trained with (its MLflow run's params), shown beside the comparison.
TRAINING_PARAMS = ("learning_rate", "max_steps", "num_generations", "beta", "lr_scheduler",
                   "lora", "director_reward_horizon", "reward_weights", "group_judge")


def training_params(tracking: MLflowResource, version: str) -> dict:
    params = tracking.version_run_params(DIRECTOR_MODEL, version)
    return {k: params.get(k, "n/a (not logged)") for k in TRAINING_PARAMS}


@dg.asset(op_tags=cluster_tags("director_comparison"),
          group_name="collaboration", deps=["director_adapter", "contexts", "persona_adapters",
                                             "persona_roster_probe"],
          kinds={"duckdb", "pytorch"}, pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY)
def director_comparison(
    store: DuckDBStore,
    chat: ChatModelResource,
    judges: JudgePanelResource,
    tracking: MLflowResource,
    settings: LineageSettings,
) -> dg.MaterializeResult:
    """Trained vs base director on the same held-out openings and seeds
    (lib/stage2/director_eval.py):
    valid-directive, retry and fallback rates, speaker diversity and the group reward, each with
    a paired bootstrap CI over contexts."""
    from mascot_dag.lib.stage2.director_eval import run_comparison, summarise

    director, version = attach(chat, tracking, DIRECTOR_MODEL)
    if director is None:
        raise ValueError(f"no {DIRECTOR_MODEL} version in MLflow: materialise director_adapter")
    roster = rosters(store)
    contexts = pick_contexts(store, "eval", settings.director_compare_contexts)
    specs = []
    for k in range(settings.director_compare_seeds):
        specs += build_specs(contexts, roster, user_profiles(), settings.agent_turns,
                             f"{PREFIX}:s{k}", settings.seed + k)
    adapters, versions = attach_personas(chat, tracking, roster_ids(roster))
    config = config_from_settings(settings, persona_adapters=adapters)
    # the group reward on the GRPO reward's terms: the panel's training judge
    reward_judge = judges.training()
    rows = run_comparison(specs, chat.backend().generate, config, director, reward_judge,
                          settings.block_size)
    store.replace("director_comparison", rows, None, None)
    summary = summarise(rows, seed=settings.seed)

    def num(x):
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, 4)

    by_metric = {r.metric: {"base": num(r.base), "trained": num(r.trained), "delta": num(r.delta),
                            "ci": [num(r.lo), num(r.hi)], "n_units": r.n_units,
                            "n_contexts": r.n_contexts}
                 for r in (SimpleNamespace(**row) for row in summary.iter_rows(named=True))}
    return materialized(metadata={
        **table_metadata(rows.drop("speakers", "statuses")),
        "summary": dg.MetadataValue.md(markdown_table(summary.with_columns(
            cs.float().round(4)))),
        "metrics": by_metric,
        "director_version": f"{DIRECTOR_MODEL}/{version}",
        "group_judge": reward_judge.name,
        "persona_adapter_versions": versions,
        "director_training": training_params(tracking, version),
        "units": rows["dialogue_id"].n_unique(),
        "contexts": rows["context_id"].n_unique(),
    })


@dg.asset_check(asset=director_comparison)
def director_not_worse(store: DuckDBStore, settings: LineageSettings) -> dg.AssetCheckResult:
    """Warns (never blocks: the comparison is small at demo sizes) when the trained director is
    significantly worse than the base director on any measured metric."""
    from mascot_dag.lib.stage2.director_eval import regressions, summarise

    summary = summarise(store.frame("SELECT * FROM director_comparison"), seed=settings.seed)
    worse = regressions(summary)
    return dg.AssetCheckResult(
        passed=not worse, severity=dg.AssetCheckSeverity.WARN,
        description=("trained director significantly worse on: " + "; ".join(worse)) if worse
        else "trained director not significantly worse than the base on any metric",
        metadata={"regressions": len(worse)})
