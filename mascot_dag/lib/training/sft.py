"""Supervised fine-tuning of a LoRA adapter: the `sft` evaluation baseline.

Wraps TRL's SFTTrainer. Each example is a conversation ending with the assistant reply to learn;
it is split into a conversational prompt/completion pair so that TRL computes the loss on the reply
only (`completion_only_loss`). TRL's `assistant_only_loss` would need `{% generation %}` markers
that the SmolLM2 chat template lacks; the split gives the same effect for the final turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mascot_dag.lib.training.common import (
    Curve,
    curve,
    load_tokenizer,
    policy_model,
    prepare_checkpoints,
    quiet_trainer,
    save_adapter,
    trainable_percent,
    trainer_kwargs,
)
from mascot_dag.lib.training.config import LoraSettings, SFTSettings


@dataclass
class SFTResult:
    adapter_dir: Path
    loss_curve: Curve
    trainable_percent: float
    steps: int
    seconds_per_step: float | None
    n_examples: int
    resumed_from: str | None = None


def _to_prompt_completion(examples: list[dict]) -> list[dict]:
    rows = []
    for i, ex in enumerate(examples):
        msgs = ex.get("messages") if isinstance(ex, dict) else None
        if not isinstance(msgs, list) or len(msgs) < 2:
            raise ValueError(
                f"SFT example #{i} needs 'messages': [..., user turn, assistant reply], "
                f"got {ex!r:.200}"
            )
        clean = []
        for m in msgs:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"SFT example #{i}: every message needs 'role' and 'content'")
            clean.append({"role": str(m["role"]), "content": str(m["content"])})
        if clean[-1]["role"] != "assistant":
            raise ValueError(f"SFT example #{i} must end with the assistant reply to learn")
        rows.append({"prompt": clean[:-1], "completion": clean[-1:]})
    return rows


def fitting_max_length(base_model: str, examples: list[dict], floor: int) -> int:
    """A max_length (at least `floor`) that keeps every example whole: TRL truncates from the
    end (keep_start is its only mode), so a prompt longer than max_length leaves no completion
    to learn and the trainer finds no sample (a meeting's transcript alone is ~1000 tokens)."""
    tokenizer = load_tokenizer(base_model)
    longest = max((len(tokenizer(tokenizer.apply_chat_template(
        r["prompt"] + r["completion"], tokenize=False))["input_ids"])
        for r in _to_prompt_completion(examples)), default=0)
    return max(floor, longest + 8)


def train_sft_adapter(
    base_model: str,
    examples: list[dict],
    settings: SFTSettings,
    lora: LoraSettings,
    output_dir: Path,
    resume: bool = True,
    callbacks: list | None = None,
    init_adapter: str | Path | None = None,
) -> SFTResult:
    """Fine-tune a LoRA adapter on `{"messages": [...]}` examples; adapter -> output_dir/adapter.

    `init_adapter`: continue training that adapter (its LoRA config wins over `lora`) instead of
    a fresh one, e.g. the persona warm start on top of pi_SFT."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from mascot_dag.lib.training.callbacks import StepTimer

    rows = _to_prompt_completion(examples)
    if not rows:
        raise ValueError("train_sft_adapter got no examples")
    output_dir = Path(output_dir)
    ckpt_dir, last = prepare_checkpoints(output_dir, resume)
    tokenizer = load_tokenizer(base_model)
    model = policy_model(base_model, init_adapter, settings.bf16)
    args = SFTConfig(
        **trainer_kwargs(settings, ckpt_dir),
        max_length=settings.max_length,
        completion_only_loss=True,
    )
    timer = StepTimer()
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=None if init_adapter is not None else lora.to_peft("CAUSAL_LM"),
        callbacks=[timer, *(callbacks or [])],
    )
    quiet_trainer(trainer)
    trainer.train(resume_from_checkpoint=last)
    adapter_dir = save_adapter(trainer, tokenizer, output_dir)
    return SFTResult(
        adapter_dir=adapter_dir,
        loss_curve=curve(trainer.state.log_history, "loss"),
        trainable_percent=trainable_percent(trainer.model),
        steps=trainer.state.global_step,
        seconds_per_step=timer.seconds_per_step,
        n_examples=len(rows),
        resumed_from=last,
    )
