"""GPU smoke check: a few GRPO steps of a LoRA adapter in bf16 on CUDA, with the time of each step.

Runs the same `train_grpo_adapter` that the lineage uses (TRL GRPOTrainer + LoRA), on the embedded
SmolLM2-135M by default or on `--model` (a Hugging Face id or local folder). Meant to finish in well
under 5 minutes on one GPU. Exits with status 2 and a message when no CUDA device is visible;
`--cpu` runs a tiny float32 version instead, to check the script itself on a CPU machine.

    python scripts/gpu_check.py                      # embedded model, 4 steps, bf16
    python scripts/gpu_check.py --model Qwen/Qwen3-0.6B --steps 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [
    "I failed my driving test for the third time and I feel stupid.",
    "My best friend moved away and the evenings feel empty.",
    "I was passed over for a promotion I worked hard for.",
    "I can't sleep the night before exams.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF id or folder (default: embedded SmolLM2)")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps (the first one warms up)")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt")
    parser.add_argument("--completion-length", type=int, default=64, help="tokens per completion")
    parser.add_argument("--cpu", action="store_true", help="tiny float32 run on CPU (script check)")
    args = parser.parse_args(argv)

    t_start = time.perf_counter()
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device is visible (torch.cuda.is_available() is False, torch "
            f"{torch.__version__}). Run it on a GPU machine with a CUDA build of torch, or pass "
            "--cpu to check the script itself.",
            file=sys.stderr,
        )
        return 2

    from mascot_dag.lib.home import Home
    from mascot_dag.lib.models import EMBEDDED_MODEL, resolve_model
    from mascot_dag.lib.rewards import format_reward
    from mascot_dag.lib.training.callbacks import StepTimer
    from mascot_dag.lib.training.config import GRPOSettings, LoraSettings
    from mascot_dag.lib.training.grpo import train_grpo_adapter

    base = resolve_model(args.model or EMBEDDED_MODEL, Home.from_env().models)
    if args.cpu:
        # Shrunk so that the check finishes in a few minutes on 2 cores.
        settings = GRPOSettings(
            max_steps=2, batch_size=2, num_generations=2, max_completion_length=8, save_steps=1000
        )
    else:
        settings = GRPOSettings(
            max_steps=args.steps,
            batch_size=2 * args.generations,  # two prompts per step
            num_generations=args.generations,
            max_completion_length=args.completion_length,
            use_cpu=False,
            bf16=True,
            save_steps=1000,  # no checkpoints: this measures training, not disk
        )
        print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"gpu_check: model {base}, {settings}")

    prompts = [
        [{"role": "system", "content": "You are The Anchor, a calm emotional validator."},
         {"role": "user", "content": p}]
        for p in PROMPTS
    ]  # fmt: skip
    timer = StepTimer()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        result = train_grpo_adapter(
            base,
            prompts,
            [format_reward(other_names=["The Catalyst", "The Beacon", "Action Guide"])],
            None,
            settings,
            LoraSettings(),
            Path(tmp),
            resume=False,
            callbacks=[timer],
        )
    for i, seconds in enumerate(timer.durations, start=1):
        print(f"gpu_check: step {i}: {seconds:.2f} s")
    steady = timer.durations[1:] or timer.durations
    print(f"gpu_check: mean s/step after warm-up: {sum(steady) / len(steady):.2f}")
    print(f"gpu_check: reward curve {result.reward_curve}")
    print(f"gpu_check: trainable {result.trainable_percent:.3f}% of parameters")
    if torch.cuda.is_available() and not args.cpu:
        print(f"gpu_check: peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    print(f"gpu_check: done in {time.perf_counter() - t_start:.0f} s")
    return 0 if result.completed else 1


if __name__ == "__main__":
    sys.exit(main())
