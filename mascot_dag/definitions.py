"""The one Definitions object of the code location: assets, checks, jobs, schedules, sensors."""

from __future__ import annotations

import dagster as dg

from mascot_dag import assets as _assets_pkg  # noqa: F401
from mascot_dag.assets import (
    alignment,
    collaboration,
    contexts,
    director_eval,
    evaluation,
    feedback,
    human,
    personas,
)
from mascot_dag.automation import (
    eval_job,
    inbox_sensor,
    stage1_job,
    stage2_job,
    weekly_retrain,
)
from mascot_dag.profiles import executor_for, resources_for

ASSET_MODULES = [contexts, personas, feedback, alignment, collaboration, director_eval,
                 evaluation, human]

all_assets = dg.load_assets_from_modules(ASSET_MODULES)
all_checks = dg.load_asset_checks_from_modules(ASSET_MODULES)

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
