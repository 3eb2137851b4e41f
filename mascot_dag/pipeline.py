"""Runs the whole lineage in order, in-process, against the Dagster instance in DAGSTER_HOME.

`dagster asset materialize --select '*'` cannot mix partitioned and unpartitioned assets in one
run, so the demo walks the lineage stage by stage and runs each per-persona / per-method stage
once per partition. Runs are recorded in the instance, so `make dev` shows them in the UI.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg

from mascot_dag.lib.home import Home


@dataclass(frozen=True)
class Stage:
    title: str
    assets: tuple[str, ...]


STAGES: tuple[Stage, ...] = (
    Stage("contexts and personas", ("contexts", "persona_cards", "persona_prompts")),
    Stage("supervised policy (pi_SFT)", ("policy_sft",)),
    # Every persona's candidates before any judging: a persona's judgments score the candidates
    # of all personas' prompts (cross-persona pairs).
    Stage("persona candidates", ("candidate_responses",)),
    Stage("persona feedback", ("persona_judgments", "persona_preference_pairs")),
    Stage("persona reward model", ("persona_reward_model",)),
    Stage("persona adapters", ("persona_adapters",)),
    Stage("group dialogue", ("group_rollouts", "group_judgments", "director_adapter")),
    Stage("evaluation dialogues", ("eval_dialogues",)),
    Stage("evaluation report", ("eval_scores", "three_way_comparisons", "eval_report")),
)


def prepare_home(home: Home | None = None) -> Home:
    """Create MASCOT_HOME and DAGSTER_HOME (with a dagster.yaml allowing one run at a time)."""
    home = (home or Home.from_env()).ensure()
    os.environ.setdefault("DAGSTER_HOME", str(home.dagster_home))
    dh = os.environ["DAGSTER_HOME"]
    os.makedirs(dh, exist_ok=True)
    cfg = os.path.join(dh, "dagster.yaml")
    if not os.path.exists(cfg):
        with open(cfg, "w", encoding="utf-8") as f:
            # One run at a time: DuckDB allows a single writer process per file.
            f.write("concurrency:\n  runs:\n    max_concurrent_runs: 1\n")
            f.write("telemetry:\n  enabled: false\n")
    return home


def run_lineage(
    resources: dict,
    instance: dg.DagsterInstance | None = None,
    stages: tuple[Stage, ...] = STAGES,
    on_stage: Callable[[str, str | None, float], None] | None = None,
) -> list[dg.ExecuteInJobResult]:
    """Materialise every stage whose assets exist, partition by partition, with their checks."""
    from mascot_dag.definitions import all_assets, all_checks

    by_name = {k.to_user_string(): a for a in all_assets for k in a.keys}
    results = []
    for stage in stages:
        names = [a for a in stage.assets if a in by_name]
        if not names:
            continue
        selection = dg.AssetSelection.assets(*names)
        first = by_name[names[0]]
        partitions = first.partitions_def.get_partition_keys() if first.partitions_def else [None]
        for key in partitions:
            t0 = time.monotonic()
            result = dg.materialize(
                [*all_assets, *all_checks],
                selection=selection,
                partition_key=key,
                resources=resources,
                instance=instance,
                tags={"mascot/stage": stage.title},
                raise_on_error=False,
            )
            results.append(result)
            if on_stage:
                on_stage(stage.title, key, time.monotonic() - t0)
        # A failed partition does not stop its siblings (every persona gets its adapter and
        # probe); later stages need this one's tables, so they wait for all of it.
        if not all(r.success for r in results):
            return results
    return results
