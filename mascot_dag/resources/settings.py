"""Sizes and knobs of the lineage. A profile (mascot_dag/profiles.py) fills them in."""

from __future__ import annotations

import dagster as dg
from pydantic import Field


class LineageSettings(dg.ConfigurableResource):
    """How big each stage is. The defaults ARE the embedded profile: the whole lineage in under
    15 minutes on 2 CPU cores. On CPU time is roughly proportional to tokens processed (prefill
    ~350 tokens/s, one decode step ~0.1-0.25 s for SmolLM2-135M), so these sizes are token budgets:
    4 train contexts x K=4, 24-token turns, zero-shot persona prompts, GRPO groups of 2, one
    dialogue per mode with 2 agent turns (the user replies between them), one eval context per
    mode. docs/DESIGN.md has the
    measured stage times."""

    seed: int = Field(default=0, description="Base seed of every sampled generation and split.")
    eval_ratio: float = Field(default=0.25, description="Share of contexts in the eval split.")
    train_persona_set: str = Field(
        default="support", description="Persona set that Stage 1 aligns (support | workplace)."
    )
    prompt_style: str = Field(
        default="zero_shot",
        description="Persona prompt style of the agents (zero_shot | few_shot). zero_shot by "
        "default: on CPU a forward pass costs time per token and the few-shot examples add ~120 "
        "tokens to every persona prompt; the aligned adapters are what carry the persona.",
    )
    max_train_contexts: int = Field(
        default=4, description="Train contexts sampled per persona in Stage 1 (0 = all)."
    )
    k_candidates: int = Field(default=4, description="K: candidates per (context, persona).")
    max_new_tokens: int = Field(default=24, description="Tokens per candidate / agent turn.")
    temperature: float = Field(default=0.9, description="Sampling temperature for candidates.")
    preference_delta: float = Field(
        default=0.5, description="Minimum mean-score gap (1-5 scale) for a preference pair."
    )
    reward_steps: int = Field(default=3, description="RewardTrainer optimisation steps.")
    reward_batch_size: int = Field(default=8, description="RewardTrainer batch size.")
    grpo_steps: int = Field(default=2, description="GRPO steps per persona adapter.")
    grpo_generations: int = Field(
        default=2, description="GRPO generations per prompt (a group; 2 is the smallest TRL takes)."
    )
    grpo_completion_tokens: int = Field(default=24, description="GRPO max completion length.")
    grpo_learning_rate: float = Field(default=5e-5, description="GRPO learning rate (LoRA).")
    reward_model_weight: float = Field(default=1.0, description="Weight of the reward-model score.")
    format_reward_weight: float = Field(default=0.5, description="Weight of the format reward.")
    lora_r: int = Field(default=8, description="LoRA rank for every adapter.")
    use_cpu: bool = Field(default=True, description="Train on CPU (no bf16).")
    rollout_dialogues: int = Field(default=1, description="Stage 2 dialogues per mode.")
    agent_turns: int = Field(default=2, description="Agent turns per dialogue.")
    agents_per_round: int = Field(
        default=1,
        description="Support mode: agent turns between two simulated-user replies (a round).",
    )
    block_size: int = Field(default=4, description="N: turns per judged block.")
    director_steps: int = Field(default=2, description="GRPO steps for the director.")
    eval_contexts: int = Field(default=1, description="Eval contexts per mode (0 = all).")
    sft_steps: int = Field(default=2, description="SFT baseline steps.")
