"""What every training wrapper shares: TRL config arguments, checkpoints, curves, counts.

Imports nothing heavy at module level.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mascot_dag.lib.training.config import TrainSettings

Curve = list[tuple[int, float]]
# A run of fewer optimizer steps is a smoke test: its curves are noise around the start (the
# MLflow run's description and the report's verdict say so).
SMOKE_TEST_STEPS = 20


def clean_messages(messages: Any, where: str) -> list[dict[str, str]]:
    """A chat prompt as exactly [{role, content}] dicts; errors name `where` (row, column).

    Arrow needs one struct type for a column of messages, so only these two keys are kept.
    """
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where} must be a non-empty list of {{role, content}} dicts")
    out = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"{where}: every message needs 'role' and 'content', got {m!r}")
        out.append({"role": str(m["role"]), "content": str(m["content"])})
    return out


def trainer_kwargs(settings: TrainSettings, checkpoint_dir: Path) -> dict[str, Any]:
    """Keyword arguments common to RewardConfig, GRPOConfig and SFTConfig."""
    return {
        "output_dir": str(checkpoint_dir),
        "max_steps": settings.max_steps,
        "per_device_train_batch_size": settings.batch_size,
        "gradient_accumulation_steps": 1,
        "learning_rate": settings.learning_rate,
        "lr_scheduler_type": settings.lr_scheduler,
        "seed": settings.seed,
        "data_seed": settings.seed,
        "use_cpu": settings.use_cpu,
        "bf16": settings.bf16,
        # The name transformers 5.17 (the pin vllm 0.31 allows) knows; 5.18+ renamed it
        # activation_checkpointing and keeps this one as a deprecated alias.
        "gradient_checkpointing": settings.gradient_checkpointing,
        # MLflow logging happens in the assets (lib.tracking), from the curves we return.
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": settings.save_steps,
        # Optimizer + scheduler + RNG states make a checkpoint resumable; keep two in case the
        # newest one was being written when the process died.
        "save_total_limit": 2,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def prepare_checkpoints(output_dir: Path, resume: bool) -> tuple[Path, str | None]:
    """(checkpoint_dir, last checkpoint to resume from or None); a fresh run clears old ones."""
    from transformers.trainer_utils import get_last_checkpoint

    ckpt_dir = Path(output_dir) / "checkpoints"
    if not resume and ckpt_dir.exists():
        # A fresh run must not leave stale checkpoints that a later resume would pick up.
        shutil.rmtree(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    last = get_last_checkpoint(str(ckpt_dir)) if resume else None
    return ckpt_dir, last


def curve(log_history: list[dict], key: str) -> Curve:
    """(step, value) points of one logged metric, in step order; NaN/None values are skipped."""
    points = []
    for entry in log_history:
        value = entry.get(key)
        if isinstance(value, int | float) and value == value and "step" in entry:
            points.append((int(entry["step"]), float(value)))
    return points


def reward_curves(log_history: list[dict]) -> dict[str, Curve]:
    """Per-reward-function mean curves that GRPO logs as `rewards/<name>/mean`."""
    names = {
        k.split("/")[1]
        for entry in log_history
        for k in entry
        if k.startswith("rewards/") and k.endswith("/mean")
    }
    return {name: curve(log_history, f"rewards/{name}/mean") for name in sorted(names)}


def trainable_percent(model: Any) -> float:
    """Share of parameters that receive gradients, in percent (LoRA r=8 q,v on SmolLM2: ~0.34%)."""
    total = trainable = 0
    for p in model.parameters():
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
    return 100.0 * trainable / total if total else 0.0


def save_adapter(trainer: Any, tokenizer: Any, output_dir: Path) -> Path:
    """Write the LoRA adapter (plus any modules_to_save) and the tokenizer to output_dir/adapter."""
    adapter_dir = Path(output_dir) / "adapter"
    tmp = adapter_dir.with_name(".adapter.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    trainer.model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    # Replace atomically-ish: a reader never sees a half-written adapter folder.
    if adapter_dir.exists():
        shutil.rmtree(adapter_dir)
    tmp.rename(adapter_dir)
    return adapter_dir


def policy_model(base_model: str, init_adapter: str | Path | None, bf16: bool) -> Any:
    """The causal LM a policy trainer starts from: the base model, or the base with a trainable
    LoRA adapter loaded from `init_adapter` (e.g. pi_SFT, then the persona warm start), so one
    adapter carries every stage and serves as one. Pass the result with peft_config=None."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        base_model, dtype=torch.bfloat16 if bf16 else torch.float32
    )
    if init_adapter is None:
        return model
    from peft import PeftModel

    init = Path(init_adapter)
    if not (init / "adapter_config.json").exists():
        raise FileNotFoundError(f"init adapter {init} has no adapter_config.json")
    return PeftModel.from_pretrained(model, str(init), is_trainable=True)


def load_tokenizer(base_model: str) -> Any:
    """The base model's tokenizer with a pad token (SmolLM2 and Llama-style models ship none)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def lora_relative_change(adapter_dir: str | Path, base_model: str) -> float:
    """Mean over adapted layers of ||scale * B @ A||_F / ||W||_F: how much an adapter changes
    the weights it sits on, relative to them. LoRA B starts at zero, so a run that leaves this
    near 1e-4 has changed no sampled token; around 1e-2 and up, outputs visibly change."""
    import json

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    scale = float(cfg["lora_alpha"]) / float(cfg["r"])
    lora = load_file(str(adapter_dir / "adapter_model.safetensors"))
    base_files = sorted(Path(base_model).glob("*.safetensors"))
    if not base_files:
        raise FileNotFoundError(f"{base_model} has no *.safetensors to compare the adapter with")
    handles = [safe_open(str(f), framework="pt") for f in base_files]
    keys = {k: h for h in handles for k in h.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    ratios = []
    for name, a in lora.items():
        if ".lora_A." not in name:
            continue
        b = lora[name.replace(".lora_A.", ".lora_B.")]
        # base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight -> model.layers.0...
        stem = name.split(".lora_A.")[0].removeprefix("base_model.model.")
        handle = keys.get(f"{stem}.weight")
        if handle is None:
            continue
        w = handle.get_tensor(f"{stem}.weight").float()
        delta = scale * (b.float() @ a.float())
        ratios.append(float(torch.linalg.matrix_norm(delta) / torch.linalg.matrix_norm(w)))
    if not ratios:
        raise ValueError(f"{adapter_dir}: no LoRA layer matches a weight of {base_model}")
    return sum(ratios) / len(ratios)


def quiet_trainer(trainer) -> None:
    """No per-step dict on stdout: with `disable_tqdm` transformers adds a PrinterCallback that
    prints every log line; the curves reach MLflow from the returned log history instead."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
