"""GRPO training of a LoRA adapter (persona adapters in Stage 1, the director in Stage 2).

Thin wrapper over TRL's GRPOTrainer (Shao et al. 2024, as implemented in TRL 1.16): for each prompt
it samples `num_generations` completions, scores them with the reward functions, normalises the
rewards within the group and takes a clipped policy-gradient step on the LoRA weights, with a KL
penalty (beta) against the base model (the same model with the adapter disabled, so no second copy).

Resumable: checkpoints go to output_dir/checkpoints every `save_steps`; with resume=True an
interrupted run continues from the last checkpoint and ends at the configured max_steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mascot_dag.lib.training.common import (
    Curve,
    clean_messages,
    curve,
    load_tokenizer,
    policy_model,
    prepare_checkpoints,
    quiet_trainer,
    reward_curves,
    save_adapter,
    trainable_percent,
    trainer_kwargs,
)
from mascot_dag.lib.training.config import GRPOSettings, LoraSettings


@dataclass
class GRPOResult:
    adapter_dir: Path
    reward_curve: Curve  # mean (weighted) reward over the step's completions
    kl_curve: Curve  # empty when beta == 0 (TRL skips the reference pass)
    loss_curve: Curve
    reward_func_curves: dict[str, Curve] = field(default_factory=dict)
    reward_start: float | None = None
    reward_end: float | None = None
    trainable_percent: float = 0.0
    steps: int = 0
    max_steps: int = 0
    seconds_per_step: float | None = None
    resumed_from: str | None = None

    @property
    def completed(self) -> bool:
        """False when a callback (or an error) stopped the run before max_steps."""
        return self.steps >= self.max_steps


def _clean_prompts(
    prompts: list[list[dict]], columns: dict[str, list] | None = None
) -> list[dict]:
    columns = columns or {}
    if "prompt" in columns:
        raise ValueError("GRPO column 'prompt' is reserved for the prompts themselves")
    for name, values in columns.items():
        if len(values) != len(prompts):
            raise ValueError(
                f"GRPO column {name!r} needs one value per prompt ({len(prompts)}), "
                f"got {len(values)}"
            )
    rows = []
    for i, prompt in enumerate(prompts):
        msgs = clean_messages(prompt, f"GRPO prompt #{i}")
        if msgs[-1]["role"] == "assistant":
            raise ValueError(
                f"GRPO prompt #{i} ends with an assistant message: the model would continue it; "
                "end prompts with the user (or system) turn to be answered"
            )
        row: dict[str, Any] = {"prompt": msgs}
        for name, values in columns.items():
            v = values[i]
            is_messages = isinstance(v, list)
            row[name] = clean_messages(v, f"GRPO column {name!r} #{i}") if is_messages else v
        rows.append(row)
    return rows


def train_grpo_adapter(
    base_model: str,
    prompts: list[list[dict]],
    reward_funcs: list[Callable[..., list[float | None]]],
    reward_weights: list[float] | None,
    settings: GRPOSettings,
    lora: LoraSettings,
    output_dir: Path,
    resume: bool = True,
    callbacks: list | None = None,
    columns: dict[str, list] | None = None,
    init_adapter: Path | str | None = None,
) -> GRPOResult:
    """Train a LoRA adapter with GRPO on conversational prompts; adapter -> output_dir/adapter.

    `reward_funcs` follow TRL's form (see lib/stage1/rewards.py); `reward_weights` (one per
    function,
    None = all 1.0) weight their sum. `columns` are extra per-prompt dataset columns that TRL hands
    to every reward function as keyword arguments (e.g. `reward_prompt`).
    `callbacks=[StopAfterSteps(n)]` simulates an interruption. `init_adapter`: continue that
    LoRA adapter (pi_SFT or the persona warm start) instead of starting one at B = 0; the KL
    reference (beta > 0) is then the base model with the adapter disabled.
    """
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from mascot_dag.lib.training.callbacks import StepTimer

    if not prompts:
        raise ValueError("train_grpo_adapter got no prompts")
    if not reward_funcs:
        raise ValueError("train_grpo_adapter needs at least one reward function")
    if reward_weights is not None and len(reward_weights) != len(reward_funcs):
        raise ValueError(
            f"reward_weights has {len(reward_weights)} entries for "
            f"{len(reward_funcs)} reward functions"
        )

    output_dir = Path(output_dir)
    ckpt_dir, last = prepare_checkpoints(output_dir, resume)
    tokenizer = load_tokenizer(base_model)
    tokenizer.padding_side = "left"  # generation appends to the right of the prompt
    args = GRPOConfig(
        **trainer_kwargs(settings, ckpt_dir),
        num_generations=settings.num_generations,
        max_completion_length=settings.max_completion_length,
        beta=settings.beta,
        temperature=settings.temperature,
        top_p=settings.top_p,
        reward_weights=list(reward_weights) if reward_weights is not None else None,
        use_vllm=settings.use_vllm,
        # constrained sampling exists only on TRL's vLLM path (see GRPOSettings.structured_regex)
        vllm_structured_outputs_regex=settings.structured_regex if settings.use_vllm else None,
    )
    timer = StepTimer()
    # float32 weights on CPU; bf16 weights (LoRA stays float32) when training in bf16 on a GPU.
    model = policy_model(base_model, init_adapter, settings.bf16)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=list(reward_funcs),
        args=args,
        train_dataset=Dataset.from_list(_clean_prompts(prompts, columns)),
        processing_class=tokenizer,
        peft_config=None if init_adapter is not None else lora.to_peft("CAUSAL_LM"),
        callbacks=[timer, *(callbacks or [])],
    )
    quiet_trainer(trainer)
    trainer.train(resume_from_checkpoint=last)

    adapter_dir = save_adapter(trainer, tokenizer, output_dir)
    history = trainer.state.log_history
    rewards = curve(history, "reward")
    return GRPOResult(
        adapter_dir=adapter_dir,
        reward_curve=rewards,
        kl_curve=curve(history, "kl"),
        loss_curve=curve(history, "loss"),
        reward_func_curves=reward_curves(history),
        reward_start=rewards[0][1] if rewards else None,
        reward_end=rewards[-1][1] if rewards else None,
        trainable_percent=trainable_percent(trainer.model),
        steps=trainer.state.global_step,
        max_steps=settings.max_steps,
        seconds_per_step=timer.seconds_per_step,
        resumed_from=last,
    )


def __getattr__(name: str) -> Any:
    # `from mascot_dag.lib.training.grpo import StopAfterSteps` without importing transformers
    # whenever this module is imported.
    if name in ("StopAfterSteps", "StepTimer"):
        from mascot_dag.lib.training import callbacks

        return getattr(callbacks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
