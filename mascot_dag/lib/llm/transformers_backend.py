"""Batched chat generation with Hugging Face transformers, with LoRA adapters chosen per row.

Requests are grouped by sampling settings, sorted by prompt length inside a group (less padding),
and generated in batches with LEFT padding: decoder-only models continue from the last position,
so padding must sit before the prompt.

Adapters: one base model holds every adapter (a single peft `PeftModel`), and a batch may mix
them: peft's `adapter_names=[...]` applies each row's own LoRA ("__base__" = none). A dialogue
step where four personas speak is then ONE batch instead of four.

Parallel batches (CPU): measured on 2 cores with SmolLM2-135M, one generate call does not get
faster with a second torch thread (4x300-token prompts + 32 tokens: 15.2 s with 2 threads, 14.9 s
with 1), but two calls with one thread each in two Python threads finish together in about the
time of one. So a group is cut into `workers` chunks run side by side, each with one torch
thread; training code in the same process keeps its threads (restored after each call).

Structured outputs: a request with `json_schema` gets a constraint processor (structured.py)
ahead of the sampler, so its reply always parses and matches the schema (unless max_new_tokens
cuts it, which completion_tokens == max_new_tokens then says).

Sampling is seeded PER REQUEST: a logits processor draws each row's token with its own
`torch.Generator` (temperature, then top-p; no top-k, as in the OpenAI API). Texts therefore do
not depend on which batch or thread a request landed in, and parallel threads never share a
random stream.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mascot_dag.lib.llm import ChatBackendError, validate_requests
from mascot_dag.lib.llm.models import EMBEDDED_MODEL, resolve_model
from mascot_dag.lib.types import ChatRequest, ChatResult

# Longer prompts are cut from the LEFT (oldest turns go first, the latest turn always stays).
# 1536 keeps a batch of 8 well inside CPU memory and SmolLM2's 8k context; the dialogue prompts of
# this project are a few hundred tokens, so only runaway histories are ever cut.
MAX_PROMPT_TOKENS = 1536


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or Path(name).is_absolute()


def load_error(model: str, path: str, exc: Exception) -> ChatBackendError:
    """A message that says which model failed and why, instead of a hub stack trace."""
    if Path(path).exists():
        why = f"the folder {path} exists but does not hold a loadable model/tokenizer ({exc})"
    elif _looks_like_path(path):
        why = f"the folder {path} does not exist"
    elif _hub_offline():
        why = (
            "it is not a local folder and the Hugging Face hub is offline (HF_HUB_OFFLINE=1), "
            "so it cannot be downloaded; give a local model folder, use "
            f"{EMBEDDED_MODEL!r}, or unset HF_HUB_OFFLINE to download it"
        )
    else:
        why = f"it is neither a local folder nor a downloadable hub model ({exc})"
    return ChatBackendError(f"cannot load model {model!r}: {why}")


class TransformersChat:
    """`generate(requests)` with a local causal LM (float32 on CPU, bfloat16 on CUDA)."""

    def __init__(
        self,
        model: str,
        models_dir: str | os.PathLike,
        adapters: dict[str, str] | None = None,
        batch_size: int = 8,
        threads: int | None = None,
        max_prompt_tokens: int = MAX_PROMPT_TOKENS,
        workers: int | None = None,
    ) -> None:
        if "torch" not in sys.modules:
            # Spinning OpenMP workers make generation ~10x slower on a shared, busy CPU (measured
            # on 2 cores); passive waiting costs nothing when the CPU is free. Read at torch load.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if threads:
            torch.set_num_threads(threads)
        self.model_name = model
        self.batch_size = batch_size
        self.max_prompt_tokens = max_prompt_tokens
        self.path = resolve_model(model, models_dir)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        # One chunk per core on CPU (see the module docstring); a GPU batches better in one call.
        cpu_workers = min(2, os.cpu_count() or 1)
        self.workers = max(1, workers or (cpu_workers if self.device == "cpu" else 1))
        dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            base = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise load_error(model, self.path, exc) from exc
        tok = self.tokenizer
        tok.padding_side = "left"
        tok.truncation_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        self.base = base.to(self.device).eval()
        self.peft: Any = None  # a PeftModel once the first adapter is loaded
        self.adapters: dict[str, str] = {}
        eos = self.base.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self._stop_ids = (eos_ids | {tok.eos_token_id, tok.pad_token_id}) - {None}
        self._lock = threading.Lock()
        self._rows = threading.local()  # this thread's batch: its adapter per row
        self._hooked: set[int] = set()
        for name, path in (adapters or {}).items():
            self.add_adapter(name, path)

    def add_adapter(self, name: str, path: str | os.PathLike) -> None:
        """Load a PEFT LoRA adapter folder under `name` (requests select it by `adapter=name`)."""
        from peft import PeftModel

        path = str(path)
        if not (Path(path) / "adapter_config.json").exists():
            raise FileNotFoundError(
                f"adapter {name!r}: {path} has no adapter_config.json (not a saved PEFT adapter)"
            )
        with self._lock:
            if name in self.adapters:
                if self.adapters[name] == path:
                    return
                self.peft.delete_adapter(name)
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.base, path, adapter_name=name)
                self.peft.to(self.device).eval()
            else:
                self.peft.load_adapter(path, adapter_name=name)
            self.adapters[name] = path
            self._hook_lora_layers()

    def _hook_lora_layers(self) -> None:
        """Give every LoRA layer its batch's per-row adapters from a thread-local.

        peft's own `generate(adapter_names=...)` installs hooks on the shared model for the
        duration of a call, so two threads generating at once would see each other's adapter
        lists. These hooks are installed once and read the calling thread's list instead.
        """
        from peft.tuners.lora import LoraLayer

        def pre_hook(module: Any, args: Any, kwargs: dict) -> tuple:
            names = getattr(self._rows, "adapter_names", None)
            if names is not None:
                kwargs["adapter_names"] = names
            return args, kwargs

        for module in self.peft.modules():
            if isinstance(module, LoraLayer) and id(module) not in self._hooked:
                module.register_forward_pre_hook(pre_hook, with_kwargs=True)
                self._hooked.add(id(module))

    def generate(self, requests: list[ChatRequest]) -> list[ChatResult]:
        import torch

        validate_requests(requests, set(self.adapters))
        prompts = [
            self.tokenizer.apply_chat_template(
                list(r.messages), tokenize=False, add_generation_prompt=True
            )
            for r in requests
        ]
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            s = r.sampling
            # One schema per group: a batch shares its constraint processor's template.
            groups[(s.max_new_tokens, s.temperature, s.top_p, r.json_schema)].append(i)
        chunks = []
        for idxs in groups.values():
            # Similar lengths together: less padding, so less wasted compute per batch.
            idxs = sorted(idxs, key=lambda i: len(prompts[i]))
            n = max(math.ceil(len(idxs) / self.batch_size), min(self.workers, len(idxs)))
            size = math.ceil(len(idxs) / n)
            chunks += [idxs[k : k + size] for k in range(0, len(idxs), size)]
        results: list[ChatResult | None] = [None] * len(requests)

        def run(batch: list[int]) -> None:
            outs = self._generate_batch([prompts[i] for i in batch], [requests[i] for i in batch])
            for i, out in zip(batch, outs, strict=True):
                results[i] = out

        with self._lock:
            if self.workers > 1 and len(chunks) > 1:
                threads = torch.get_num_threads()
                torch.set_num_threads(1)
                try:
                    with ThreadPoolExecutor(self.workers) as pool:
                        list(pool.map(run, chunks))  # list() re-raises a chunk's exception
                finally:
                    torch.set_num_threads(threads)
            else:
                for batch in chunks:
                    run(batch)
        return results  # type: ignore[return-value]

    def _generate_batch(self, prompts: list[str], reqs: list[ChatRequest]) -> list[ChatResult]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        s = reqs[0].sampling
        gen = GenerationConfig(
            max_new_tokens=s.max_new_tokens,
            do_sample=False,  # sampling, when asked for, is done by _SeededSampler below
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=sorted(self._stop_ids),
        )
        processors = LogitsProcessorList()
        if any(r.json_schema for r in reqs):
            from mascot_dag.lib.llm.structured import SchemaProcessor, compile_schema

            # Before the sampler: disallowed tokens are -inf, so greedy and seeded sampling
            # both pick among the tokens that keep the reply schema-valid.
            templates = [compile_schema(r.json_schema) if r.json_schema else None for r in reqs]
            processors.append(SchemaProcessor(self.tokenizer, templates, self._stop_ids))
        if s.temperature > 0:
            processors.append(
                _SeededSampler(s.temperature, s.top_p, [r.sampling.seed for r in reqs])
            )
        enc = self.tokenizer(
            prompts,
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=self.max_prompt_tokens,
            # The chat template already wrote every special token the model expects.
            add_special_tokens=False,
        ).to(self.device)
        model = self.base if self.peft is None else self.peft
        # Each row's own LoRA ("__base__" = none), read by the hooks of _hook_lora_layers.
        self._rows.adapter_names = [r.adapter or "__base__" for r in reqs]
        try:
            with torch.inference_mode():
                out = model.generate(**enc, generation_config=gen, logits_processor=processors)
        finally:
            self._rows.adapter_names = None
        prompt_len = enc["input_ids"].shape[1]
        prompt_counts = enc["attention_mask"].sum(dim=1).tolist()
        results = []
        for row, n_prompt in zip(out[:, prompt_len:].tolist(), prompt_counts, strict=True):
            n = next((k + 1 for k, t in enumerate(row) if t in self._stop_ids), len(row))
            text = self.tokenizer.decode(row[:n], skip_special_tokens=True).strip()
            results.append(ChatResult(text=text, prompt_tokens=int(n_prompt), completion_tokens=n))
        return results


class _SeededSampler:
    """A logits processor that samples each row's next token with that row's own generator
    (temperature, then nucleus top-p) and returns scores where only that token is finite, so
    that greedy decoding emits it. Per-row generators make a request's text independent of its
    batch and thread (see the module docstring)."""

    def __init__(self, temperature: float, top_p: float, seeds: list[int]) -> None:
        import torch

        self.temperature = temperature
        self.top_p = top_p
        self.generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        logits = scores.float() / self.temperature
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        outside = probs.cumsum(dim=-1) - probs >= self.top_p
        probs = probs.masked_fill(outside, 0.0)
        picks = torch.empty(len(self.generators), 1, dtype=torch.long)
        for row, generator in enumerate(self.generators):
            picks[row] = torch.multinomial(probs[row].cpu(), 1, generator=generator)
        tokens = order.gather(-1, picks.to(order.device))
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, tokens, 0.0)
