"""The `cluster` profile's execution: every Dagster step a Ray job, through dagster-ray.

Why the executor and not dagster-ray's run launcher: a run launcher makes a whole RUN one Ray job
with one resource request, so a run that judges (CPU) and then trains (GPU) would hold a GPU for
all of it; the executor submits each STEP as its own Ray job with that asset's request (op tag
`dagster-ray/config`, lib/runtime/cluster.py), and runs ready steps side by side. The walk
(pipeline.run_lineage) still decides which runs exist and in which order; on this profile it
starts one run per partition and several runs at once, so the personas of Stage 1 train on
different workers at the same time.

dagster-ray's own `ray_executor` is used as it is except for two things, which is why this module
builds the same StepDelegatingExecutor around the same RayStepHandler:
- the health check runs every 5 s instead of Dagster's default 20 s: a worker that dies is seen
  (and its step retried) within seconds;
- a failed Ray job's message names the worker: the node and the exit code, beside dagster-ray's
  step key and submission id ("persona_adapters ... worker node 127.0.0.1 ... exit code -9").

Workers run `dagster api execute_step` for the code location `mascot_dag.definitions` (a module
of the installed package, so no path has to match between machines); they need the virtualenv's
bin on PATH (the Ray head and nodes are started with it) and the environment listed in
WORKER_ENV, which the executor copies into every Ray job.
"""

from __future__ import annotations

import os

import dagster as dg
from dagster._core.definitions.executor_definition import multiple_process_executor_requirements
from dagster._core.execution.retries import RetryMode
from dagster._core.executor.step_delegating import (
    CheckStepHealthResult,
    StepDelegatingExecutor,
    StepHandlerContext,
)
from dagster_ray.core.executor import (
    _RAY_EXECUTOR_CONFIG_SCHEMA,
    RayExecutorConfig,
    RayStepHandler,
)

# What a worker needs from the orchestrator's environment (names; the values are read when a
# step is submitted). MASCOT_HOME must be storage every worker sees (docs/DESIGN.md).
WORKER_ENV = [
    "MASCOT_HOME", "MASCOT_PROFILE", "MASCOT_EXECUTOR", "MASCOT_RAY_ADDRESS", "MASCOT_SIZES",
    "MASCOT_SET", "MASCOT_MODEL",
    "MASCOT_MODELS_DIR", "MASCOT_MLFLOW_URI", "MASCOT_GENERATION_URL", "MASCOT_JUDGE_BASE_URL",
    "MASCOT_JUDGE_MODEL", "MASCOT_JUDGE_API_KEY", "MASCOT_JUDGE_MAX_TOKENS",
    "MASCOT_JUDGE_STRUCTURED", "DAGSTER_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
    "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MLFLOW_ENABLE_ASYNC_LOGGING",
]
HEALTH_CHECK_S = 5


class WorkerNamingRayStepHandler(RayStepHandler):
    """dagster-ray's step handler; an unhealthy step's reason also names the worker."""

    def check_step_health(self, step_handler_context: StepHandlerContext) -> CheckStepHealthResult:
        result = super().check_step_health(step_handler_context)
        if result.is_healthy:
            return result
        try:
            info = self.client.get_job_info(self._get_ray_job_submission_id(step_handler_context))
            worker = (f" Worker: Ray node {info.driver_node_id or '?'} "
                      f"({info.driver_agent_http_address or '?'}), entrypoint exit code "
                      f"{info.driver_exit_code}.")
        except Exception:  # the reason above already names the step and the Ray job
            worker = ""
        return CheckStepHealthResult.unhealthy(f"{result.unhealthy_reason}{worker}")


@dg.executor(name="ray", config_schema=_RAY_EXECUTOR_CONFIG_SCHEMA,
             requirements=multiple_process_executor_requirements())
def ray_step_executor(init_context) -> StepDelegatingExecutor:
    """Each step a Ray job (dagster-ray's RayStepHandler), health-checked every 5 s."""
    from ray.job_submission import JobSubmissionClient

    cfg = init_context.executor_config
    ray_cfg = RayExecutorConfig(**cfg["ray"])
    client = JobSubmissionClient(ray_cfg.address, metadata=ray_cfg.metadata,
                                 headers=ray_cfg.headers, cookies=ray_cfg.cookies)
    return StepDelegatingExecutor(
        WorkerNamingRayStepHandler(client=client, env_vars=ray_cfg.env_vars,
                                   runtime_env=ray_cfg.runtime_env, num_cpus=ray_cfg.num_cpus,
                                   num_gpus=ray_cfg.num_gpus, memory=ray_cfg.memory,
                                   resources=ray_cfg.resources),
        retries=RetryMode.from_config(cfg["retries"]),
        max_concurrent=cfg.get("max_concurrent"),
        tag_concurrency_limits=cfg.get("tag_concurrency_limits"),
        should_verify_step=True,
        check_step_health_interval_seconds=HEALTH_CHECK_S,
    )


def ray_address() -> str:
    """The Ray cluster's jobs API (the dashboard, port 8265), from MASCOT_RAY_ADDRESS."""
    address = os.environ.get("MASCOT_RAY_ADDRESS")
    if not address:
        raise ValueError("the ray executor needs MASCOT_RAY_ADDRESS: the Ray head's dashboard "
                         "address, e.g. http://127.0.0.1:8265 (ray start --head "
                         "--include-dashboard=true)")
    return address


def executor() -> dg.ExecutorDefinition:
    return ray_step_executor.configured({"ray": {"address": ray_address(),
                                                 "env_vars": list(WORKER_ENV)}})


def code_location_job():
    """The implicit asset job of the code location `mascot_dag.definitions`, as a reconstructable
    job: the orchestrator launches runs of it and each worker loads the module itself."""
    from dagster._core.definitions.reconstruct import ReconstructableRepository

    repo = ReconstructableRepository.for_module("mascot_dag.definitions", "defs",
                                                working_directory=os.getcwd())
    return repo.get_reconstructable_job("__ASSET_JOB")
