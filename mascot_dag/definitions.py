"""The one Definitions object of the code location: assets, checks, jobs, schedules, sensors."""

from __future__ import annotations

import dagster as dg

from mascot_dag.automation import (
    eval_job,
    inbox_sensor,
    stage1_job,
    stage2_job,
    weekly_retrain,
)
from mascot_dag.lineage import all_assets, all_checks
from mascot_dag.profiles import executor_for, resources_for

__all__ = ["all_assets", "all_checks", "defs"]

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    # Whole-lineage runs are asset backfills (UI: Materialize all; the sensors below), not a job.
    jobs=[stage1_job, stage2_job, eval_job],
    sensors=[weekly_retrain, inbox_sensor],
    resources=resources_for(),
    # In-process by default: models loaded by a resource are reused by every step of a run
    # instead of reloading per step process (faster on 2 cores). MASCOT_EXECUTOR=multiprocess
    # runs steps in parallel processes on bigger machines; the DuckDB pool keeps writers apart.
    executor=executor_for(),
)
