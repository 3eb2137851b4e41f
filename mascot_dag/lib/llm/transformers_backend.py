"""Batched chat generation with Hugging Face transformers, with LoRA adapters switched per request.

Requests are grouped by (adapter, sampling settings), sorted by prompt length inside a group (less
padding), and generated in batches of `batch_size` with LEFT padding: decoder-only models continue
from the last position, so padding must sit before the prompt. Each batch seeds torch from its
requests' seeds, so the same request list always gives the same texts.

One base model holds every adapter (a single peft `PeftModel`); `set_adapter` switches between
them and `disable_adapter()` gives the base model, so N personas cost one model in memory.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from mascot_dag.lib.llm import ChatBackendError, validate_requests
from mascot_dag.lib.models import EMBEDDED_MODEL, resolve_model
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

    def generate(self, requests: list[ChatRequest]) -> list[ChatResult]:
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
            groups[(r.adapter, s.max_new_tokens, s.temperature, s.top_p)].append(i)
        results: list[ChatResult | None] = [None] * len(requests)
        with self._lock:
            for (adapter, *_), idxs in groups.items():
                # Similar lengths together: less padding, so less wasted compute per batch.
                idxs = sorted(idxs, key=lambda i: len(prompts[i]))
                for start in range(0, len(idxs), self.batch_size):
                    batch = idxs[start : start + self.batch_size]
                    outs = self._generate_batch(
                        [prompts[i] for i in batch], [requests[i] for i in batch], adapter
                    )
                    for i, out in zip(batch, outs, strict=True):
                        results[i] = out
        return results  # type: ignore[return-value]

    def _generate_batch(
        self, prompts: list[str], reqs: list[ChatRequest], adapter: str | None
    ) -> list[ChatResult]:
        import contextlib

        import torch
        from transformers import GenerationConfig

        s = reqs[0].sampling
        do_sample = s.temperature > 0
        gen = GenerationConfig(
            max_new_tokens=s.max_new_tokens,
            do_sample=do_sample,
            # top_k=0 disables top-k: only temperature and top_p apply, as in the OpenAI API.
            **({"temperature": s.temperature, "top_p": s.top_p, "top_k": 0} if do_sample else {}),
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=sorted(self._stop_ids),
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
        seed_blob = ",".join(str(r.sampling.seed) for r in reqs).encode()
        torch.manual_seed(int(hashlib.sha256(seed_blob).hexdigest()[:15], 16))
        if self.peft is None:
            model, ctx = self.base, contextlib.nullcontext()
        elif adapter is None:
            model, ctx = self.peft, self.peft.disable_adapter()
        else:
            self.peft.set_adapter(adapter)
            model, ctx = self.peft, contextlib.nullcontext()
        with ctx, torch.inference_mode():
            out = model.generate(**enc, generation_config=gen)
        prompt_len = enc["input_ids"].shape[1]
        prompt_counts = enc["attention_mask"].sum(dim=1).tolist()
        results = []
        for row, n_prompt in zip(out[:, prompt_len:].tolist(), prompt_counts, strict=True):
            n = next((k + 1 for k, t in enumerate(row) if t in self._stop_ids), len(row))
            text = self.tokenizer.decode(row[:n], skip_special_tokens=True).strip()
            results.append(ChatResult(text=text, prompt_tokens=int(n_prompt), completion_tokens=n))
        return results
