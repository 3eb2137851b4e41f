"""Chat with vLLM's offline engine and multi-LoRA (CUDA machines; `pip install 'mascot-dag[gpu]'`).

Follows vLLM's documented LoRA usage: `LLM(model, enable_lora=True, max_lora_rank=...)`, then
`llm.chat(conversations, sampling_params, lora_request=LoRARequest(name, int_id, path))`. vLLM
batches internally (continuous batching), so each adapter's requests go in one `chat` call with
one `SamplingParams` per request (per-request seeds keep samples reproducible). A request's
`json_schema` becomes vLLM's structured outputs (xgrammar/guidance enforce it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mascot_dag.lib.llm import ChatBackendError, validate_requests
from mascot_dag.lib.models import resolve_model
from mascot_dag.lib.types import ChatRequest, ChatResult


def vllm_available() -> bool:
    """True when vllm imports and a CUDA device is visible."""
    try:
        import torch
        import vllm  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def structured_kwargs(json_schema: str | None) -> dict[str, Any]:
    """SamplingParams keywords that make vLLM enforce a JSON schema: `structured_outputs=
    StructuredOutputsParams(json=...)` (the pinned vllm 0.31; the only form since 0.12). Empty
    without a schema."""
    if json_schema is None:
        return {}
    import json

    from vllm.sampling_params import StructuredOutputsParams

    return {"structured_outputs": StructuredOutputsParams(json=json.loads(json_schema))}


class VLLMChat:
    """`generate(requests)` with a vLLM engine; adapters are LoRA folders selected per request."""

    def __init__(
        self,
        model: str,
        adapters: dict[str, str] | None = None,
        gpu_memory_utilization: float = 0.85,
        max_lora_rank: int = 16,
        models_dir: str | os.PathLike | None = None,
        max_model_len: int = 4096,
        max_loras: int = 8,
        seed: int = 0,
    ) -> None:
        try:
            import torch
            from vllm import LLM
        except ImportError as exc:
            raise ChatBackendError(
                "the vLLM backend needs vllm (GPU machines only): pip install 'mascot-dag[gpu]'; "
                "on CPU use the transformers backend"
            ) from exc
        if not torch.cuda.is_available():
            raise ChatBackendError(
                "the vLLM backend needs a CUDA GPU and none is visible; "
                "use the transformers backend"
            )
        from mascot_dag.lib.home import Home

        self.model_name = model
        self.path = resolve_model(model, models_dir or Home.from_env().models)
        self.llm = LLM(
            model=self.path,
            enable_lora=True,
            max_lora_rank=max_lora_rank,
            max_loras=max_loras,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
        )
        self._lora: dict[str, Any] = {}
        for name, path in (adapters or {}).items():
            self.add_adapter(name, path)

    @property
    def adapters(self) -> dict[str, str]:
        return {name: req.lora_path for name, req in self._lora.items()}

    def add_adapter(self, name: str, path: str | os.PathLike) -> None:
        from vllm.lora.request import LoRARequest

        if not (Path(path) / "adapter_config.json").exists():
            raise FileNotFoundError(f"adapter {name!r}: {path} has no adapter_config.json")
        # vLLM caches adapters by integer id: a re-added name gets a fresh id so the new
        # weights are loaded rather than the cached old ones.
        next_id = max((r.lora_int_id for r in self._lora.values()), default=0) + 1
        self._lora[name] = LoRARequest(name, next_id, str(path))

    def generate(self, requests: list[ChatRequest]) -> list[ChatResult]:
        from vllm import SamplingParams

        validate_requests(requests, set(self._lora))
        by_adapter: dict[str | None, list[int]] = {}
        for i, r in enumerate(requests):
            by_adapter.setdefault(r.adapter, []).append(i)
        results: list[ChatResult | None] = [None] * len(requests)
        for adapter, idxs in by_adapter.items():
            params = [
                SamplingParams(
                    max_tokens=requests[i].sampling.max_new_tokens,
                    temperature=requests[i].sampling.temperature,  # 0 = greedy in vLLM too
                    top_p=requests[i].sampling.top_p,
                    seed=requests[i].sampling.seed,
                    **structured_kwargs(requests[i].json_schema),
                )
                for i in idxs
            ]
            outputs = self.llm.chat(
                [list(requests[i].messages) for i in idxs],
                params,
                use_tqdm=False,
                lora_request=self._lora.get(adapter) if adapter else None,
            )
            for i, out in zip(idxs, outputs, strict=True):
                completion = out.outputs[0]
                results[i] = ChatResult(
                    text=completion.text.strip(),
                    prompt_tokens=len(out.prompt_token_ids or []),
                    completion_tokens=len(completion.token_ids),
                )
        return results  # type: ignore[return-value]
