"""Chat backends: everything that generates text goes through `generate(requests) -> results`.

A backend is any object with `generate(requests: list[ChatRequest]) -> list[ChatResult]` returning
results in the order of the requests (see docs/CONTRACTS.md). Implementations:

- `TransformersChat` (transformers_backend): HF `generate`, batched, LoRA adapters (CPU/GPU).
- `OpenAIChat` (http_backend): any OpenAI-compatible `/chat/completions` server.
- `VLLMChat` (vllm_backend): vLLM offline engine with multi-LoRA (CUDA machines only).
- `CachedChat` (cache): a DuckDB-backed cache in front of any backend.
- `server`: an OpenAI-compatible HTTP server over any backend.

This module imports nothing heavy: the backends are loaded on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

from mascot_dag.lib.types import ChatRequest, ChatResult


@runtime_checkable
class ChatBackend(Protocol):
    def generate(self, requests: list[ChatRequest]) -> list[ChatResult]: ...


class ChatBackendError(RuntimeError):
    """A backend could not produce a result (model missing, server error, bad response)."""


def validate_requests(requests: list[ChatRequest], known_adapters: set[str] | None = None) -> None:
    """Reject requests no backend can serve, naming the request index and what to fix."""
    for i, req in enumerate(requests):
        if not isinstance(req, ChatRequest):
            raise TypeError(f"request {i} is a {type(req).__name__}, expected a ChatRequest")
        if not req.messages:
            raise ValueError(f"request {i} has no messages: give at least one user message")
        for j, msg in enumerate(req.messages):
            if "role" not in msg or "content" not in msg:
                raise ValueError(
                    f"request {i}, message {j} needs 'role' and 'content' keys, got {sorted(msg)}"
                )
        if req.json_schema is not None:
            from mascot_dag.lib.llm.structured import compile_schema

            if not isinstance(req.json_schema, str):
                raise TypeError(f"request {i}: json_schema must be JSON text (json.dumps(schema))")
            try:
                compile_schema(req.json_schema)
            except ValueError as exc:
                raise ValueError(f"request {i}: unsupported json_schema: {exc}") from exc
        if known_adapters is not None and req.adapter is not None:
            if req.adapter not in known_adapters:
                raise ValueError(
                    f"request {i} asks for adapter {req.adapter!r}, which is not loaded; "
                    f"loaded adapters: {sorted(known_adapters) or 'none'} (add it with add_adapter)"
                )


_LAZY = {
    "TransformersChat": "transformers_backend",
    "MAX_PROMPT_TOKENS": "transformers_backend",
    "OpenAIChat": "http_backend",
    "VLLMChat": "vllm_backend",
    "CachedChat": "cache",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ChatBackend", "ChatBackendError", "validate_requests", *_LAZY]
