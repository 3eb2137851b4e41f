"""The generation engines behind `mascot serve`, with one small async interface for server.py.

- `VLLMEngine` (the default): vLLM's `AsyncLLM`, continuous batching, LoRA adapters per request,
  output streamed token by token as the engine produces it; a cancelled or closed stream aborts
  its request in the engine, so an abandoned generation stops costing compute.
- `BatchedEngine`: any `ChatBackend` (TransformersChat for machines without vllm, or a proxied
  OpenAIChat) through batcher.py's worker thread; the whole text comes as one delta.

Both have `adapters`, `async start()`, `stream(req, options)` (an async iterator of `Delta`),
`stats()` for /health, `metrics()` for /metrics and `shutdown()`. A request the engine refuses
for its content (a prompt over the context length, sampling values vLLM rejects) raises
`EngineRejected`, which the server answers with a 400; anything else is the server's fault.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from mascot_dag.lib.llm import ChatBackend, ChatBackendError
from mascot_dag.lib.llm.batcher import Batcher
from mascot_dag.lib.llm.vllm_backend import (
    INSTALL_HINT,
    LoRARegistry,
    engine_kwargs,
    sampling_params,
    vllm_installed,
)
from mascot_dag.lib.types import ChatRequest


@dataclass(frozen=True)
class Options:
    """Per-request settings that ChatRequest does not carry (they never reach the cache key)."""

    stops: tuple[str, ...] = ()
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens whatever the model says


@dataclass(frozen=True)
class Delta:
    """New text of one generation step; the token counts are the totals so far."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None  # set on the last delta: "stop" or "length"


class EngineRejected(ValueError):
    """The engine refuses this request because of what it asks for: a 400, not a 500."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class VLLMEngine:
    """vLLM's AsyncLLM on one base model, adapters as LoRA requests selected by name."""

    name = "vllm"

    def __init__(self, path: str, adapters: dict[str, str] | None = None, **engine_options: Any):
        if not vllm_installed():
            raise ChatBackendError(INSTALL_HINT)
        self.path = path
        self._lora = LoRARegistry()
        for name, folder in (adapters or {}).items():
            self._lora.add(name, folder)  # a bad folder fails here, before the port is bound
        self._options = engine_options
        self.engine: Any = None
        self.requests = 0
        self.start_s: float | None = None

    @property
    def adapters(self) -> dict[str, str]:
        return self._lora.paths

    async def start(self) -> None:
        """Build the engine (~30 s on 2 cores: it spawns the engine-core process and loads the
        weights). Called inside the server's event loop: AsyncLLM binds its output handler to it."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        t0 = time.monotonic()
        args = AsyncEngineArgs(**engine_kwargs(self.path, **self._options))
        # log_stats stays on (AsyncEngineArgs' default): it registers the vllm:* Prometheus
        # metrics that /metrics exposes.
        self.engine = AsyncLLM.from_engine_args(args)
        self.tokenizer = self.engine.get_tokenizer()
        self.max_model_len = self.engine.model_config.max_model_len
        self.start_s = time.monotonic() - t0

    def prompt_ids(self, messages: tuple[dict, ...]) -> list[int]:
        """The chat template rendered as text, then tokenized without adding special tokens
        again: what vLLM's own `LLM.chat` does, so both paths see the same prompt."""
        from jinja2 import TemplateError

        try:
            text = self.tokenizer.apply_chat_template(
                list(messages), add_generation_prompt=True, tokenize=False
            )
        except TemplateError as exc:
            message = f"the chat template refused these messages: {exc}"
            raise EngineRejected(message, "messages") from exc
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def params(self, req: ChatRequest, options: Options) -> Any:
        import msgspec
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import RequestOutputKind

        try:
            # structs.replace reruns SamplingParams' __post_init__, which derives the stop-string
            # hold-back from `stop`; DELTA: each output carries only the new tokens.
            return msgspec.structs.replace(
                sampling_params(req), stop=list(options.stops), ignore_eos=options.ignore_eos,
                output_kind=RequestOutputKind.DELTA,
            )  # fmt: skip
        except VLLMValidationError as exc:
            raise EngineRejected(str(exc), getattr(exc, "parameter", None)) from exc

    async def stream(self, req: ChatRequest, options: Options) -> AsyncIterator[Delta]:
        from vllm.exceptions import VLLMClientError

        # Tokenizing a 1 MiB prompt takes a while: off the event loop, so /health stays quick.
        ids = await asyncio.to_thread(self.prompt_ids, req.messages)
        need = len(ids) + req.sampling.max_new_tokens
        if need > self.max_model_len:
            raise EngineRejected(
                f"this model's context length is {self.max_model_len} tokens; the messages take "
                f"{len(ids)} and max_tokens asks for {req.sampling.max_new_tokens} more",
                "messages",
            )  # fmt: skip
        params = self.params(req, options)
        request_id = f"mascot-{uuid.uuid4().hex}"
        lora = self._lora.request(req.adapter)
        self.requests += 1
        finished, count = False, 0
        try:
            async for out in self.engine.generate(
                {"prompt_token_ids": ids}, params, request_id, lora_request=lora
            ):
                step = out.outputs[0]
                count += len(step.token_ids)
                finished = out.finished
                reason = step.finish_reason if finished else None
                yield Delta(step.text, len(ids), count, reason)
        except VLLMClientError as exc:  # validation or admission, before any token
            raise EngineRejected(str(exc), getattr(exc, "parameter", None)) from exc
        finally:
            # A consumer that stops iterating (the client went away) closes this generator
            # here, at the yield, outside engine.generate: abort explicitly, or the engine
            # would go on generating the rest of max_tokens for nobody.
            if not finished:
                await self.engine.abort(request_id)

    def stats(self) -> dict:
        running = self.engine.get_num_unfinished_requests() if self.engine else 0
        return {"engine": self.name, "requests": self.requests, "running": running,
                "engine_start_s": self.start_s}  # fmt: skip

    def healthy(self) -> bool:
        return self.engine is not None and not self.engine.errored

    def metrics(self) -> bytes:
        from prometheus_client import generate_latest
        from vllm.v1.metrics.prometheus import get_prometheus_registry

        return generate_latest(get_prometheus_registry())

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


class BatchedEngine:
    """A ChatBackend behind batcher.py's worker thread; stops are cut from the finished text."""

    name = "batched"

    def __init__(self, backend: ChatBackend, max_batch: int = 16) -> None:
        self.backend = backend
        self.batcher = Batcher(backend, max_batch=max_batch)

    @property
    def adapters(self) -> dict[str, str]:
        return dict(getattr(self.backend, "adapters", {}) or {})

    async def start(self) -> None:
        """Nothing to start: the backend loaded its model when it was built."""

    async def stream(self, req: ChatRequest, options: Options) -> AsyncIterator[Delta]:
        if options.ignore_eos:
            raise EngineRejected("'ignore_eos' needs the vLLM engine (mascot serve --engine vllm)",
                                 "ignore_eos")  # fmt: skip
        fut = self.batcher.submit(req)
        try:
            result = await asyncio.wrap_future(fut)
        finally:
            fut.cancel()  # a client gone before its batch started: the batcher skips it
        text = result.text
        finish = "length" if result.completion_tokens >= req.sampling.max_new_tokens else "stop"
        cut = [i for i in (text.find(s) for s in options.stops) if i >= 0]
        if cut:
            text, finish = text[: min(cut)], "stop"
        yield Delta(text, result.prompt_tokens, result.completion_tokens, finish)

    def stats(self) -> dict:
        b = self.batcher
        return {"engine": self.name, "requests": b.requests, "batches": b.batches,
                "largest_batch": b.largest_batch}  # fmt: skip

    def healthy(self) -> bool:
        return True

    def metrics(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest()  # this process's default metrics; no engine counters here

    def shutdown(self) -> None:
        self.batcher.close()
