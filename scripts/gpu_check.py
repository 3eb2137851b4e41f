"""GPU check: the bf16 training paths on CUDA (pi_SFT, reward model, GRPO), timed per stage.

The CPU tests train in float32 with `use_cpu=True`; the paper profile trains with
`use_cpu=False, bf16=True`, a path no CPU test can take. This script takes it with the project's
own trainers (lib/training), a few steps each, and prints per stage: seconds per step, the
LoRA's relative weight change, the loss or reward curve and the CUDA peak memory. It exits 1
when a stage fails, writes no adapter or leaves the weights unchanged, and 2 without CUDA
(`--cpu` runs a float32 version instead, to check the script itself on a CPU machine).

    python scripts/gpu_check.py                        # the embedded SmolLM2-135M
    python scripts/gpu_check.py --model Qwen/Qwen3-0.6B --steps 3
    python scripts/gpu_check.py --random-init DIR      # DIR: a model's config + tokenizer only;
                                                       # random weights of that architecture
                                                       # (a GPU machine that can neither
                                                       # download nor carry the weights)

With random weights the curves mean nothing; the path, dtypes, timings and weight change are
what is checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

SYSTEM = {"role": "system", "content": "You are The Anchor, an emotional validator. Reply in "
          "one or two sentences."}
SITUATIONS = ["I failed my driving test again.", "My best friend moved to another city.",
              "I was passed over for a promotion.", "My dog has been sick all week.",
              "I can't sleep before my exams.", "My parents keep arguing at home.",
              "I lost my wallet on the bus.", "My sister forgot my birthday."]


def prompt(text: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": text}]


class DistinctChars:
    """A reward that varies on any text (random weights write no sentence the format reward
    could grade): distinct characters / 20, so GRPO has advantages to follow."""

    __name__ = "distinct_chars"

    def __call__(self, completions, **kwargs) -> list[float]:
        from mascot_dag.lib.rewards import completion_text

        return [len(set(completion_text(c))) / 20 for c in completions]


def random_model(config_dir: Path, out: Path) -> Path:
    """Random weights of the architecture in `config_dir`, saved with its tokenizer files."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir))
    model.save_pretrained(out)
    for f in config_dir.iterdir():
        if f.is_file() and not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return out


def stage(name: str, fn, base: str, report: dict) -> None:
    import torch

    from mascot_dag.lib.training.common import lora_relative_change

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.monotonic()
    try:
        result = fn()
    except Exception as exc:  # reported, and the script fails at the end
        report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        return
    adapter = Path(result.adapter_dir)
    moved = lora_relative_change(adapter, base) if (adapter / "adapter_config.json").exists() \
        else float("nan")
    curve = getattr(result, "loss_curve", None) or getattr(result, "reward_curve", [])
    report[name] = {
        "ok": (adapter / "adapter_config.json").exists() and moved > 0,
        "seconds": round(time.monotonic() - t0, 1),
        "seconds_per_step": result.seconds_per_step,
        "steps": result.steps,
        "lora_delta_relative": moved,
        "curve": [(s, round(v, 4)) for s, v in curve],
        "cuda_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if torch.cuda.is_available() else None,
    }


def generation(base: str, work: Path, cpu: bool) -> dict:
    """Tokens/s of the serving backend (TransformersChat: bf16 on CUDA) at the width of one study
    evaluation turn (124 dialogues in lockstep; 16 on --cpu), 64 new tokens each."""
    from mascot_dag.lib.llm.transformers_backend import TransformersChat
    from mascot_dag.lib.types import ChatRequest, SamplingParams

    n = 16 if cpu else 124
    reqs = [ChatRequest(tuple(prompt(SITUATIONS[i % len(SITUATIONS)])),
                        SamplingParams(max_new_tokens=64, seed=i)) for i in range(n)]
    out: dict = {"requests": n}
    try:
        for batch in (8, 32, 124) if not cpu else (8,):
            chat = TransformersChat(base, models_dir=str(work), batch_size=batch)
            chat.generate(reqs[:batch])  # warm-up
            t0 = time.monotonic()
            res = chat.generate(reqs)
            seconds = time.monotonic() - t0
            tokens = sum(r.completion_tokens for r in res)
            out[f"batch_{batch}"] = {"seconds": round(seconds, 2), "tokens": tokens,
                                     "tokens_per_s": round(tokens / seconds, 1)}
        out["ok"] = True
    except Exception as exc:  # reported, and the script fails at the end
        out |= {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF id or folder (default: embedded SmolLM2)")
    ap.add_argument("--random-init", type=Path, default=None, metavar="CONFIG_DIR",
                    help="random weights of the architecture in CONFIG_DIR (config + tokenizer)")
    ap.add_argument("--steps", type=int, default=4, help="steps per stage")
    ap.add_argument("--cpu", action="store_true", help="tiny float32 run on CPU (script check)")
    ap.add_argument("--out", type=Path, default=None, help="write the report JSON here too")
    args = ap.parse_args(argv)

    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible (torch.cuda.is_available() is False, torch "
              f"{torch.__version__}). Run it on a GPU machine with a CUDA build of torch, or "
              "pass --cpu to check the script itself.", file=sys.stderr)
        return 2
    from mascot_dag.lib.home import Home
    from mascot_dag.lib.models import EMBEDDED_MODEL, resolve_model
    from mascot_dag.lib.rewards import format_reward
    from mascot_dag.lib.training.config import (
        GRPOSettings,
        LoraSettings,
        RewardModelSettings,
        SFTSettings,
    )
    from mascot_dag.lib.training.grpo import train_grpo_adapter
    from mascot_dag.lib.training.reward_model import train_reward_model
    from mascot_dag.lib.training.sft import train_sft_adapter

    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    if args.random_init:
        base = str(random_model(args.random_init, work / "base"))
    else:
        base = resolve_model(args.model or EMBEDDED_MODEL, Home.from_env().models)
    gpu = {"use_cpu": args.cpu, "bf16": not args.cpu, "max_steps": 2 if args.cpu else args.steps,
           "save_steps": 1000}  # no checkpoints: this measures training, not disk
    lora = LoraSettings()
    report: dict = {"device": "cpu" if args.cpu else torch.cuda.get_device_name(),
                    "torch": torch.__version__, "model": base,
                    "random_init": args.random_init is not None}
    examples = [{"messages": [*prompt(s), {"role": "assistant",
                                           "content": "That sounds hard; I'm here with you."}]}
                for s in SITUATIONS]
    pairs = [{"prompt": prompt(s), "chosen": "That sounds painful; it makes sense you feel this "
              "way.", "rejected": "As an AI language model, I cannot help."} for s in SITUATIONS]
    stage("sft", lambda: train_sft_adapter(
        base, examples, SFTSettings(**gpu, learning_rate=2e-4), lora, work / "sft"), base, report)
    stage("reward_model", lambda: train_reward_model(
        base, pairs, RewardModelSettings(**gpu, learning_rate=2e-4, heldout_fraction=0.25), lora,
        work / "rm"), base, report)
    rewards = [format_reward(other_names=["The Catalyst"])]
    if args.random_init:
        rewards.append(DistinctChars())
    grpo = GRPOSettings(**gpu, learning_rate=3e-4, batch_size=4 if args.cpu else 16,
                        num_generations=2 if args.cpu else 8,
                        max_completion_length=8 if args.cpu else 64)
    stage("grpo", lambda: train_grpo_adapter(
        base, [prompt(s) for s in SITUATIONS], rewards, None, grpo, lora, work / "grpo"),
        base, report)
    report["generation"] = generation(base, work, args.cpu)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0 if all(v.get("ok") for v in report.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
