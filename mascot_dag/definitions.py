"""The one Definitions object of the code location: assets, checks, jobs, schedules, sensors."""

from __future__ import annotations

import dagster as dg

from mascot_dag import assets as _assets_pkg  # noqa: F401
from mascot_dag.assets import alignment, collaboration, contexts, evaluation, feedback, personas
from mascot_dag.automation import (
    eval_job,
    inbox_sensor,
    retrain_job,
    stage1_job,
    stage2_job,
    weekly_retrain,
)
from mascot_dag.profiles import resources_for

ASSET_MODULES = [contexts, personas, feedback, alignment, collaboration, evaluation]

all_assets = dg.load_assets_from_modules(ASSET_MODULES)
all_checks = dg.load_asset_checks_from_modules(ASSET_MODULES)

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    jobs=[stage1_job, stage2_job, eval_job, retrain_job],
    schedules=[weekly_retrain],
    sensors=[inbox_sensor],
    resources=resources_for(),
    # One process runs a whole run: DuckDB allows a single writer process per file, and models
    # loaded by a resource are reused by every step of the run instead of reloading per step.
    executor=dg.in_process_executor,
)
