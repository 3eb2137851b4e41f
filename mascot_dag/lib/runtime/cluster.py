"""What each asset's step asks a cluster for, and how that request reads for Ray and Kubernetes.

One table (`REQUESTS`) is the only place that says which steps need a GPU: the steps that train
(TRL/peft) or generate (a vLLM engine or the transformers backend, when a profile generates in
the step's own process), one CPU elsewhere. Two renderings of the same request travel as op tags
on every asset (`assets/common.cluster_tags`), inert for the in-process executor:

- `dagster-ray/config`: read by dagster-ray's executor, which submits each step as a Ray job
  with `entrypoint_num_cpus` / `entrypoint_num_gpus` (docs/DESIGN.md "Past one machine").
- `dagster-k8s/config`: read by dagster-k8s's `k8s_job_executor` (one Kubernetes Job per step):
  CPU and memory requests, and `nvidia.com/gpu` as both request and limit (Kubernetes only
  schedules whole GPUs, and a GPU is never overcommitted, so a GPU request must be an integer).

No dagster import here (lib/ is pure); tests/test_cluster_tags.py renders every asset's Job spec
with dagster-k8s and checks its GPU limit against this table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

RAY_TAG = "dagster-ray/config"
K8S_TAG = "dagster-k8s/config"


@dataclass(frozen=True)
class Request:
    """A step's share of a worker: whole CPUs and GPUs, and memory in GiB (a floor for the
    scheduler, not a cap the process is killed at on Ray)."""

    cpus: int = 1
    gpus: int = 0
    memory_gib: int = 2

    def __post_init__(self) -> None:
        if self.cpus < 1 or self.gpus < 0 or self.memory_gib < 1:
            raise ValueError(f"Request(cpus={self.cpus}, gpus={self.gpus}, "
                             f"memory_gib={self.memory_gib}): needs cpus >= 1, gpus >= 0, "
                             "memory_gib >= 1")


# One CPU for reading, writing and judging steps (the embedded judge runs MiniLM on CPU; an LLM
# judge is a server). Training and generation get a GPU; the memory floor covers the base model,
# its optimizer state for LoRA and a batch (SmolLM2-135M peaks at ~2 GB on CPU, STACK.md; a
# Qwen3-1.7B LoRA step fits in 16 GB of host memory beside the GPU).
CPU = Request()
GPU = Request(cpus=1, gpus=1, memory_gib=16)

REQUESTS: dict[str, Request] = {
    "contexts": CPU,
    "persona_cards": CPU,
    "persona_prompts": CPU,
    "policy_sft": GPU,  # trains pi_SFT
    "candidate_responses": GPU,  # generates K samples per context
    "persona_judgments": CPU,
    "persona_preference_pairs": CPU,
    "persona_reward_model": GPU,  # trains the reward model
    "persona_adapters": GPU,  # GRPO, then the probe generates
    "persona_roster_probe": CPU,
    "group_rollouts": GPU,  # director + agents generate
    "group_judgments": CPU,
    "director_adapter": GPU,  # GRPO
    "director_comparison": GPU,  # generates both arms' dialogues
    "eval_dialogues": GPU,  # generates every method's dialogues
    "eval_scores": CPU,
    "three_way_comparisons": CPU,
    "human_ratings": CPU,
    "eval_report": CPU,
}


def request_for(asset: str) -> Request:
    """The asset's request; an asset missing from the table is an error that says where to add
    it (a new asset must not silently run without the GPU it needs)."""
    try:
        return REQUESTS[asset]
    except KeyError:
        raise KeyError(f"asset {asset!r} has no cluster request: add it to REQUESTS in "
                       "mascot_dag/lib/runtime/cluster.py (CPU or GPU)") from None


def ray_config(req: Request) -> dict:
    """dagster-ray's per-step config (`RayExecutionConfig`): the Ray job's entrypoint resources.
    No `memory`: Ray's memory is a logical resource sized from the node's free memory at start
    (two 16 GiB requests would not fit a 24 GiB machine that runs both steps easily), so the
    memory floor is left to Kubernetes, which measures it."""
    cfg: dict = {"num_cpus": req.cpus}
    if req.gpus:
        cfg["num_gpus"] = req.gpus
    return cfg


def k8s_config(req: Request) -> dict:
    """dagster-k8s's per-step config (`container_config.resources`): requests, and limits where
    Kubernetes needs them (a GPU must be a limit; memory is limited at twice the request so a
    step that outgrows its estimate is OOM-killed, not the node)."""
    requests = {"cpu": str(req.cpus), "memory": f"{req.memory_gib}Gi"}
    limits = {"memory": f"{2 * req.memory_gib}Gi"}
    if req.gpus:
        requests["nvidia.com/gpu"] = str(req.gpus)
        limits["nvidia.com/gpu"] = str(req.gpus)
    return {"container_config": {"resources": {"requests": requests, "limits": limits}}}


def op_tags(asset: str) -> dict[str, str]:
    """Both renderings as op tags (JSON strings: dagster-ray and dagster-k8s `json.loads` them)."""
    req = request_for(asset)
    return {RAY_TAG: json.dumps(ray_config(req)), K8S_TAG: json.dumps(k8s_config(req))}
