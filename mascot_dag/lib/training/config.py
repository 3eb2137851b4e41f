"""Training settings: small dataclasses that the assets configure and the trainers translate.

Follows TRL's config style (`trl/trainer/grpo_config.py`): every field carries a help text and
`__post_init__` rejects bad values with a message that says how to fix them. TRL's own configs
(RewardConfig, GRPOConfig, SFTConfig) are built from these inside the training code
(`common.trainer_kwargs`), so this module imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class LoraSettings:
    """The LoRA adapter every stage trains (only these weights change; the base stays frozen)."""

    r: int = field(default=8, metadata={"help": "LoRA rank."})
    alpha: int = field(default=16, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input, in [0, 1)."})
    target_modules: tuple[str, ...] = field(
        default=("q_proj", "v_proj"),
        metadata={
            "help": "Names of the linear layers that get an adapter (Llama/Qwen naming), or "
            "('all-linear',) for every linear layer but the output head (peft's shorthand)."
        },
    )

    def __post_init__(self) -> None:
        _check(self.r >= 1, f"LoraSettings.r must be >= 1, got {self.r}")
        _check(self.alpha > 0, f"LoraSettings.alpha must be > 0, got {self.alpha}")
        _check(0 <= self.dropout < 1, f"LoraSettings.dropout must be in [0, 1), got {self.dropout}")
        _check(
            len(self.target_modules) > 0,
            "LoraSettings.target_modules is empty: name at least one layer, "
            "e.g. ('q_proj', 'v_proj')",
        )
        # A list would make the frozen dataclass unhashable; accept it and store a tuple.
        object.__setattr__(self, "target_modules", tuple(self.target_modules))

    def to_peft(self, task_type: str, modules_to_save: list[str] | None = None) -> Any:
        """A `peft.LoraConfig` for `task_type` ("CAUSAL_LM" or "SEQ_CLS")."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=(
                "all-linear" if self.target_modules == ("all-linear",)
                else list(self.target_modules)
            ),
            task_type=task_type,
            modules_to_save=modules_to_save,
        )


@dataclass(frozen=True)
class TrainSettings:
    """Fields that every trainer shares."""

    max_steps: int = field(
        default=20, metadata={"help": "Optimizer steps to train (the run ends there)."}
    )
    batch_size: int = field(default=4, metadata={"help": "Per-device batch size."})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate (LoRA)."})
    lr_scheduler: str = field(
        default="linear",
        metadata={"help": "transformers scheduler name: linear | cosine | constant | ..."},
    )
    save_steps: int = field(
        default=10, metadata={"help": "Checkpoint every N steps; an interrupted run resumes there."}
    )
    seed: int = field(default=0, metadata={"help": "Seed for data order, sampling and init."})
    use_cpu: bool = field(
        default=True, metadata={"help": "Train on CPU even when CUDA is present."}
    )
    bf16: bool = field(
        default=False, metadata={"help": "bf16 mixed precision (GPU only: ~7x slower on CPU)."}
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={"help": "Trade ~20% speed for memory; only worth it for large models on a GPU."},
    )

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check(self.max_steps >= 1, f"{name}.max_steps must be >= 1, got {self.max_steps}")
        _check(self.batch_size >= 1, f"{name}.batch_size must be >= 1, got {self.batch_size}")
        _check(
            0 < self.learning_rate < 1,
            f"{name}.learning_rate must be in (0, 1), got {self.learning_rate}",
        )
        _check(self.save_steps >= 1, f"{name}.save_steps must be >= 1, got {self.save_steps}")
        # Measured on the project's CPUs: bf16 autocast costs ~50 s/step instead of ~7.5 s/step.
        _check(
            not (self.use_cpu and self.bf16),
            f"{name}: bf16=True with use_cpu=True is ~7x slower than float32 on CPU; "
            "set bf16=False on CPU, or use_cpu=False on a GPU machine",
        )


@dataclass(frozen=True)
class RewardModelSettings(TrainSettings):
    """Pairwise (Bradley-Terry) reward model on the preference pairs (TRL RewardTrainer)."""

    max_steps: int = field(default=50, metadata={"help": "Optimizer steps to train."})
    batch_size: int = field(default=8, metadata={"help": "Preference pairs per device and step."})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate (LoRA)."})
    save_steps: int = field(default=25, metadata={"help": "Checkpoint every N steps."})
    heldout_fraction: float = field(
        default=0.2,
        metadata={"help": "Share of pairs held out (deterministic split) to measure accuracy."},
    )
    max_length: int = field(
        default=384, metadata={"help": "Pairs whose prompt+response is longer are dropped (TRL)."}
    )
    train_accuracy_pairs: int = field(
        default=256,
        metadata={"help": "Train pairs scored after training for train accuracy (0 skips it)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(
            0 <= self.heldout_fraction < 1,
            f"RewardModelSettings.heldout_fraction must be in [0, 1), got {self.heldout_fraction}",
        )
        _check(
            self.max_length >= 16,
            f"RewardModelSettings.max_length must be >= 16 tokens, got {self.max_length}",
        )
        _check(
            self.train_accuracy_pairs >= 0,
            "RewardModelSettings.train_accuracy_pairs must be >= 0, "
            f"got {self.train_accuracy_pairs}",
        )


@dataclass(frozen=True)
class GRPOSettings(TrainSettings):
    """Group Relative Policy Optimization of a LoRA adapter (TRL GRPOTrainer)."""

    batch_size: int = field(
        default=4,
        metadata={
            "help": "Completions per device and step (TRL counts completions, not prompts): "
            "batch_size / num_generations prompts per step; must be a multiple of num_generations."
        },
    )
    learning_rate: float = field(default=5e-5, metadata={"help": "AdamW learning rate (LoRA)."})
    num_generations: int = field(
        default=4, metadata={"help": "Completions sampled per prompt (the group, >= 2)."}
    )
    max_completion_length: int = field(
        default=32, metadata={"help": "Tokens generated per completion."}
    )
    beta: float = field(
        default=0.04,
        metadata={
            "help": "KL coefficient against the base model (adapter disabled); 0 skips the "
            "reference pass and then no KL is logged."
        },
    )
    temperature: float = field(default=0.9, metadata={"help": "Sampling temperature (> 0)."})
    top_p: float = field(
        default=0.95,
        metadata={"help": "Nucleus sampling; the same as candidate generation, so GRPO samples "
                  "the distribution the reward model was trained on."},
    )
    use_vllm: bool = field(
        default=False, metadata={"help": "Generate with vLLM (GPU machines with the gpu extra)."}
    )
    structured_regex: str | None = field(
        default=None,
        metadata={"help": "Completions must match this regex (vLLM structured outputs, so only "
                  "with use_vllm: TRL's transformers generation takes no logits processor, and "
                  "on CPU the completions stay unconstrained). The director sets its directive "
                  "schema's pattern, so on a GPU it trains on the constrained outputs it serves."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(
            self.num_generations >= 2,
            f"GRPOSettings.num_generations must be >= 2 (advantages compare a group), "
            f"got {self.num_generations}",
        )
        _check(
            self.batch_size % self.num_generations == 0,
            f"GRPOSettings.batch_size ({self.batch_size}) must be a multiple of num_generations "
            f"({self.num_generations}): each step holds whole groups of completions",
        )
        _check(
            self.max_completion_length >= 1,
            f"GRPOSettings.max_completion_length must be >= 1, got {self.max_completion_length}",
        )
        _check(self.beta >= 0, f"GRPOSettings.beta must be >= 0, got {self.beta}")
        _check(
            self.temperature > 0, f"GRPOSettings.temperature must be > 0, got {self.temperature}"
        )
        _check(0 < self.top_p <= 1, f"GRPOSettings.top_p must be in (0, 1], got {self.top_p}")
        _check(
            not (self.use_vllm and self.use_cpu),
            "GRPOSettings.use_vllm=True needs a GPU: set use_cpu=False (and install the gpu extra)",
        )


@dataclass(frozen=True)
class SFTSettings(TrainSettings):
    """Supervised fine-tuning of a LoRA adapter on chosen responses (the `sft` baseline)."""

    max_length: int = field(
        default=384, metadata={"help": "Examples are truncated to this many tokens."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(
            self.max_length >= 16, f"SFTSettings.max_length must be >= 16, got {self.max_length}"
        )


# From a profile's settings (the mapping the assets use; settings are duck-typed so that lib
# stays free of dagster).
def lora_settings(settings) -> LoraSettings:
    """The LoRA of a profile's settings (`resources.settings.LineageSettings` or any object with
    its fields): alpha = 2 r on the listed target modules."""
    targets = tuple(t.strip() for t in settings.lora_targets.split(",") if t.strip())
    return LoraSettings(r=settings.lora_r, alpha=2 * settings.lora_r, target_modules=targets)


def grpo_settings(settings, max_completion_length: int) -> GRPOSettings:
    """GRPO settings shared by the persona adapters and the director (LoRA, CPU or bf16)."""
    return GRPOSettings(
        max_steps=settings.grpo_steps, batch_size=settings.grpo_generations,
        num_generations=settings.grpo_generations, max_completion_length=max_completion_length,
        learning_rate=settings.grpo_learning_rate, lr_scheduler=settings.grpo_scheduler,
        beta=settings.grpo_beta, temperature=settings.temperature, top_p=settings.top_p,
        save_steps=max(1, settings.grpo_steps // 2), seed=settings.seed,
        use_cpu=settings.use_cpu, bf16=not settings.use_cpu,
    )


def sft_settings(settings, steps: int, learning_rate: float) -> SFTSettings:
    """SFT of a profile's settings: pi_SFT and the `sft` baseline."""
    return SFTSettings(max_steps=steps, batch_size=4, learning_rate=learning_rate,
                       lr_scheduler="cosine", save_steps=max(1, steps // 2), seed=settings.seed,
                       use_cpu=settings.use_cpu, bf16=not settings.use_cpu)
