"""Jobs, the weekly re-training schedule and the inbox sensor.

Stage jobs are asset jobs (one partitions definition each: personas for Stage 1, methods for
evaluation). The whole lineage mixes two partitionings, which one asset job cannot hold, so
`retrain_job` is one op that walks the stages in order (mascot_dag.pipeline), each stage and
partition recorded as its own run in the same instance - the same path as `make demo`.
"""

import dagster as dg

from mascot_dag.assets.common import persona_partitions
from mascot_dag.assets.evaluation import method_partitions
from mascot_dag.lib.home import Home
from mascot_dag.lib.inbox import process_inbox

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


@dg.op(description="Materialise the whole lineage stage by stage (every partition).")
def retrain_lineage(context: dg.OpExecutionContext) -> None:
    from mascot_dag.pipeline import run_lineage
    from mascot_dag.profiles import resources_for

    def log(stage: str, key: str | None, seconds: float) -> None:
        context.log.info(f"{stage} [{key or '-'}] done in {seconds:.0f} s")

    results = run_lineage(resources_for(), instance=context.instance, on_stage=log)
    if not all(r.success for r in results):
        raise dg.Failure(f"a stage failed (run {results[-1].run_id}); see that run's logs")


@dg.job(description="The whole lineage: contexts to champion gate.")
def retrain_job():
    retrain_lineage()


weekly_retrain = dg.ScheduleDefinition(
    name="weekly_retrain", job=retrain_job, cron_schedule="0 3 * * 1",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Re-train every Monday 03:00 (stopped by default: start it in the UI).",
)


@dg.sensor(job=retrain_job, minimum_interval_seconds=60,
           default_status=dg.DefaultSensorStatus.STOPPED,
           description="New context files in MASCOT_HOME/inbox/ -> contexts and everything downstream.")
def inbox_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    outcomes = process_inbox(Home.from_env(), min_age_s=2.0)
    accepted = [o for o in outcomes if o.accepted]
    for o in outcomes:
        if not o.accepted:
            context.log.warning(f"rejected {o.file.name}: {o.error} (moved to {o.moved_to})")
    if not accepted:
        return dg.SensorResult(skip_reason=dg.SkipReason(
            f"no new valid files ({len(outcomes)} rejected)" if outcomes else "inbox empty"))
    key = ",".join(sorted(o.moved_to.name for o in accepted))
    return dg.SensorResult(run_requests=[dg.RunRequest(
        run_key=key, tags={"mascot/inbox": key[:200]})])
