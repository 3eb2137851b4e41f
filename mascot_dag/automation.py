"""Jobs, the weekly re-training trigger and the inbox sensor.

Stage jobs are asset jobs (one partitions definition each: personas for Stage 1, methods for
evaluation). The whole lineage mixes two partitionings, which one run cannot hold, so whole-
lineage runs are *asset backfills* over every partition of every asset: the UI's "Materialize
all" (GraphQL `launchPartitionBackfill` with `allPartitions`), `weekly_retrain` and
`inbox_sensor` (both return `pipeline.lineage_backfill`, which the sensor daemon turns into a
backfill). The daemon then launches one asset run per partition group as soon as its upstreams
are materialised; a failed partition stops only what depends on it. `make demo` walks the same
graph in-process (mascot_dag.pipeline). There is no job that nests runs and no second list of
stages: the asset graph is the order.
"""

from datetime import UTC, datetime

import dagster as dg

from mascot_dag.assets.common import method_partitions, persona_partitions
from mascot_dag.lib.data.inbox import process_inbox
from mascot_dag.lib.storage.home import Home

stage1_job = dg.define_asset_job(
    "stage1_job",
    selection=dg.AssetSelection.groups("contexts", "personas", "feedback", "persona_alignment"),
    partitions_def=persona_partitions,
    description="Persona-aware alignment for one persona: data, reward model, GRPO adapter.",
)
stage2_job = dg.define_asset_job(
    "stage2_job", selection=dg.AssetSelection.groups("collaboration"),
    description="Director-led group rollouts, group judgments, director GRPO.",
)
eval_job = dg.define_asset_job(
    "eval_job", selection=dg.AssetSelection.groups("evaluation"),
    partitions_def=method_partitions,
    description="One method's eval dialogues, then scores, comparisons, report and champion gate.",
)


WEEKLY_CRON = "0 3 * * 1"  # Mondays 03:00 UTC


# A sensor that returns a backfill request must name the assets it may backfill.
@dg.sensor(name="weekly_retrain", minimum_interval_seconds=600,
           asset_selection=dg.AssetSelection.all(),
           default_status=dg.DefaultSensorStatus.STOPPED,
           description="Re-train every Monday 03:00 UTC: an asset backfill of the whole lineage "
                       "(stopped by default: start it in the UI).")
def weekly_retrain(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """A schedule cannot start a backfill (Dagster 1.13's scheduler launches runs of one job
    only), so this sensor keeps the cron: it fires once per tick passed since its cursor."""
    from dagster._utils.schedules import get_latest_completed_cron_tick

    from mascot_dag.pipeline import lineage_backfill

    tick = get_latest_completed_cron_tick(WEEKLY_CRON, datetime.now(UTC), "UTC").isoformat()
    if context.cursor is None or context.cursor >= tick:
        # first evaluation after being started: wait for the next tick, as a schedule would
        return dg.SensorResult(cursor=context.cursor or tick,
                               skip_reason=dg.SkipReason(f"next run after {WEEKLY_CRON} (UTC)"))
    return dg.SensorResult(cursor=tick, run_requests=[
        lineage_backfill(_asset_graph(context), tags={"mascot/trigger": f"weekly {tick}"})])


def _asset_graph(context: dg.SensorEvaluationContext):
    if context.repository_def is not None:
        return context.repository_def.asset_graph
    from mascot_dag.pipeline import lineage_definitions  # a sensor outside a code location
    from mascot_dag.profiles import resources_for

    return lineage_definitions(resources_for()).resolve_asset_graph()


@dg.sensor(minimum_interval_seconds=60, asset_selection=dg.AssetSelection.all(),
           default_status=dg.DefaultSensorStatus.STOPPED,
           description="New context files in MASCOT_HOME/inbox/ -> an asset backfill of the "
                       "whole lineage (contexts and everything downstream).")
def inbox_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    outcomes = process_inbox(Home.from_env(), min_age_s=2.0)
    accepted = [o for o in outcomes if o.accepted]
    for o in outcomes:
        if not o.accepted:
            context.log.warning(f"rejected {o.file.name}: {o.error} (moved to {o.moved_to})")
    if not accepted:
        return dg.SensorResult(skip_reason=dg.SkipReason(
            f"no new valid files ({len(outcomes)} rejected)" if outcomes else "inbox empty"))
    from mascot_dag.pipeline import lineage_backfill

    key = ",".join(sorted(o.moved_to.name for o in accepted))
    return dg.SensorResult(run_requests=[
        lineage_backfill(_asset_graph(context), tags={"mascot/inbox": key[:200]})])
