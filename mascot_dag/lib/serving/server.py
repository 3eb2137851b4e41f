"""`mascot serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn, the stack of vLLM's own
OpenAI server) in front of vLLM's async engine (async_engine.py), or of any chat backend.

Endpoints: `POST /v1/chat/completions` (messages, model, max_tokens or max_completion_tokens,
temperature, top_p, seed, stop, n=1 only, stream, stream_options.include_usage, response_format,
and vLLM's `ignore_eos`), `GET /v1/models` (the base model's served names, then the loaded
adapters), `GET /health` (503 once the engine is dead) and `GET /metrics` (Prometheus text: vLLM's
`vllm:*` metrics, e.g. `vllm:generation_tokens_total`).

- Engines: `--engine vllm` (the default) generates with vLLM's AsyncLLM: continuous batching,
  LoRA adapters per request, tokens streamed as the engine makes them. `--engine transformers`
  keeps the TransformersChat backend behind batcher.py's worker thread for machines without vllm
  (whole texts, sent as one chunk when streamed).
- Adapters: the `model` field may name a loaded adapter (vLLM's LoRA convention), or a non-standard
  `adapter` field names one while `model` names the base model (what `OpenAIChat` sends).
- Errors are OpenAI-shaped, `{"error": {"message", "type", "param", "code"}}`: malformed JSON (also
  nested past the recursion limit, or holding a lone surrogate), missing fields, wrong types and
  out-of-range values (NaN, a seed beyond 64 bits, a prompt over the context length) are 400 (vLLM
  answers 400 too, not FastAPI's 422), an unknown model or adapter 404 `model_not_found`, a body
  over `max_body_bytes` 413 (decided from its length, never parsed), an unknown endpoint 404, a
  failure of the engine 500.
- A client that goes away cancels its generation: a closed stream aborts the engine request, and
  a non-streamed request polls `request.is_disconnected()` while it waits and aborts too.
- Streaming (`stream: true`) sends server-sent events in OpenAI's `chat.completion.chunk` format,
  then `data: [DONE]`. The first chunk waits for the first generated text, so a request the
  engine refuses still gets its 4xx status instead of a broken stream.
- `stop` strings end generation in the engine (the text excludes them; usage counts every token).
- Structured outputs: `response_format` `{"type": "json_schema", "json_schema": {"schema": ...}}`
  is enforced by constrained decoding (structured.py's schema subset); `{"type": "text"}` is the
  default; `json_object` and unsupported schemas are a 400 naming what is unsupported.

Request parsing and validation live in openai_protocol.py, the engines in async_engine.py.

Run it with `mascot serve` or

    python -m mascot_dag.lib.serving.server --model embedded:smollm2-135m-instruct \
        --adapter anchor=/path/to/adapter --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException

from mascot_dag.lib.llm.async_engine import (
    BatchedEngine,
    Delta,
    EngineRejected,
    Options,
    VLLMEngine,
)
from mascot_dag.lib.serving.openai_protocol import (
    MAX_BODY_BYTES,
    MAX_TOKENS_LIMIT,
    RequestError,
    parse_chat_body,
    parse_flag,
    parse_json,
    parse_stops,
)
from mascot_dag.lib.types import ChatRequest

DISCONNECT_POLL_S = 0.25  # how often a waiting non-streamed request checks for its client


class ClientGone(Exception):
    """The client closed its connection while its request waited on the engine."""


class _AbortingStream(StreamingResponse):
    """A StreamingResponse that closes its event generator however the response ends. Starlette
    cancels a stream whose client disconnects, possibly while the generator waits at a yield;
    closing it runs its `finally`, which aborts the engine request."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def until_disconnect(request: Request, work: Awaitable) -> Any:
    """`await work`, cancelling it (which aborts its engine request) if the client goes away."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def error(status: int, message: str, kind: str, param: str | None = None,
          code: str | None = None) -> Response:  # fmt: skip
    """An OpenAI-style error body. ASCII JSON: a message that quotes client text must still
    encode (Starlette's JSONResponse writes UTF-8, which a lone surrogate breaks)."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return Response(json.dumps(body), status_code=status, media_type="application/json")


def create_app(
    engine: Any,
    model_name: str = "mascot",
    adapters: Iterable[str] | None = None,
    *,
    served_names: Iterable[str] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_tokens_limit: int = MAX_TOKENS_LIMIT,
    max_batch: int = 16,
    on_ready: Callable[[], None] | None = None,
) -> FastAPI:
    """The FastAPI app over `engine`: a VLLMEngine or BatchedEngine (async_engine.py), or a plain
    ChatBackend, which is wrapped in a BatchedEngine of `max_batch`. The engine starts in the
    app's lifespan (inside the server's event loop) and shuts down with it. `served_names` are
    the names the base model answers to (default `[model_name]`); `adapters` the adapter names
    requests may select (default: the engine's, read per request)."""
    if not hasattr(engine, "stream"):
        engine = BatchedEngine(engine, max_batch=max_batch)
    base_names = list(served_names or [model_name])
    fixed_adapters = None if adapters is None else list(adapters)

    def adapter_names() -> list[str]:
        return fixed_adapters if fixed_adapters is not None else sorted(engine.adapters)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> Any:
        t0 = time.monotonic()
        await engine.start()
        print(f"engine {engine.name} ready in {time.monotonic() - t0:.1f} s", flush=True)
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="mascot serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine

    @app.exception_handler(RequestError)
    async def _request_error(_req: Request, exc: RequestError) -> Response:
        return error(exc.status, exc.message, exc.kind, exc.param, exc.code)

    @app.exception_handler(HTTPException)
    async def _http_error(req: Request, exc: HTTPException) -> Response:
        message = (
            f"no such endpoint: {req.method} {req.url.path}" if exc.status_code == 404
            else f"{exc.detail}: {req.method} {req.url.path}"
        )  # fmt: skip
        return error(exc.status_code, message, "invalid_request_error")

    @app.exception_handler(Exception)
    async def _server_error(_req: Request, exc: Exception) -> Response:
        # A bug of the server, never the client's input: still an OpenAI-style body.
        return error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req: Request, exc: RequestValidationError) -> Response:
        return error(400, str(exc), "invalid_request_error")

    @app.get("/health")
    async def health() -> Response:
        ok = engine.healthy()
        body = {"status": "ok" if ok else "engine dead", "model": model_name, **engine.stats()}
        return Response(json.dumps(body), 200 if ok else 503, media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(engine.metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        created = int(time.time())
        data = [
            {"id": n, "object": "model", "created": created, "owned_by": "mascot",
             "root": model_name, "parent": None}
            for n in base_names
        ] + [
            {"id": a, "object": "model", "created": created, "owned_by": "mascot",
             "root": a, "parent": base_names[0]}
            for a in adapter_names()
        ]  # fmt: skip
        return {"object": "list", "data": data}

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        too_big = RequestError(
            f"the request body is over this server's limit of {max_body_bytes} bytes",
            status=413,
            code="request_too_large",
        )
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            # Drain (and discard) what the client sends, so it reads our answer instead of a
            # connection reset; a body far over the limit is cut off.
            drained = 0
            async for chunk in request.stream():
                drained += len(chunk)
                if drained > 16 * max_body_bytes:
                    break
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    def resolve(body: dict, req: ChatRequest) -> tuple[ChatRequest, str]:
        """The request with its adapter set, and the model name to echo back."""
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise RequestError("'model' must be a string", "model")
        loaded = adapter_names()
        known = ", ".join(base_names + loaded)
        if req.adapter is not None and req.adapter not in loaded:
            raise RequestError(
                f"the adapter {json.dumps(req.adapter)[:80]} is not loaded on this server; "
                f"loaded: {', '.join(loaded) or 'none'}",
                "adapter", 404, "invalid_request_error", "model_not_found",
            )  # fmt: skip
        if model is None or model in base_names:
            return req, req.adapter or model or base_names[0]
        if model in loaded:
            if req.adapter not in (None, model):
                raise RequestError(
                    f"'model' names adapter '{model}' but 'adapter' names '{req.adapter}'",
                    "adapter",
                )
            return dataclasses.replace(req, adapter=model), model
        raise RequestError(
            f"the model {json.dumps(model)[:80]} does not exist on this server; served: {known}",
            "model", 404, "invalid_request_error", "model_not_found",
        )  # fmt: skip

    async def first_delta(deltas: AsyncIterator[Delta]) -> Delta:
        """The engine's first delta; its refusal of the request is the client's 400."""
        try:
            return await anext(deltas)
        except EngineRejected as exc:
            raise RequestError(str(exc), exc.param) from exc

    async def collect(deltas: AsyncIterator[Delta]) -> tuple[str, Delta]:
        first = await first_delta(deltas)
        texts, last = [first.text], first
        async for delta in deltas:
            texts.append(delta.text)
            last = delta
        return "".join(texts), last

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = parse_json(await read_body(request))
        req = parse_chat_body(body, max_tokens_limit)
        req, echo_model = resolve(body, req)
        options = Options(tuple(parse_stops(body)), parse_flag(body, "ignore_eos"))
        stream = parse_flag(body, "stream")
        stream_options = body.get("stream_options") or {}
        include_usage = (
            isinstance(stream_options, dict) and stream_options.get("include_usage") is True
        )
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "created": int(time.time()),
            "model": echo_model,
            "system_fingerprint": None,
        }
        deltas = engine.stream(req, options)
        try:
            if stream:
                first = await until_disconnect(request, first_delta(deltas))
            else:
                text, last = await until_disconnect(request, collect(deltas))
        except ClientGone:
            # Nobody reads this answer; the generation is already aborted.
            return error(499, "the client closed the connection", "client_closed_request")
        except RequestError:
            raise
        except Exception as exc:  # noqa: BLE001 - an engine failure is the server's, not the client's
            return error(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")

        def usage(d: Delta) -> dict:
            return {"prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens,
                    "total_tokens": d.prompt_tokens + d.completion_tokens}  # fmt: skip

        if not stream:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": last.finish_reason}  # fmt: skip
            return {**head, "object": "chat.completion", "choices": [choice],
                    "usage": usage(last)}  # fmt: skip

        def chunk(delta: dict, finish_reason: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            payload = {**head, "object": "chat.completion.chunk", "choices": [choice]}
            return f"data: {json.dumps(payload)}\n\n"

        async def events() -> AsyncIterator[str]:
            last = first
            try:
                yield chunk({"role": "assistant", "content": ""})
                if first.text:
                    yield chunk({"content": first.text})
                async for delta in deltas:
                    last = delta
                    if delta.text:
                        yield chunk({"content": delta.text})
            except Exception as exc:  # noqa: BLE001 - headers are sent: report in the stream
                err = {"message": f"generation failed: {type(exc).__name__}: {exc}",
                       "type": "server_error", "param": None, "code": None}  # fmt: skip
                yield f"data: {json.dumps({'error': err})}\n\n"
                return
            finally:
                await deltas.aclose()  # aborts the engine request if it has not finished
            yield chunk({}, last.finish_reason)
            if include_usage:
                payload = {**head, "object": "chat.completion.chunk", "choices": [],
                           "usage": usage(last)}  # fmt: skip
                yield f"data: {json.dumps(payload)}\n\n"
            yield "data: [DONE]\n\n"

        return _AbortingStream(events(), media_type="text/event-stream")

    return app


def run_server(
    engine: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str = "mascot",
    **app_options: Any,
) -> None:
    """Serve with uvicorn until SIGINT/SIGTERM (blocking). Prints `serving on URL` once the port
    is bound (port 0 picks a free one) AND the engine has started, so scripts and tests can read
    the address and get answers from it at once."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if family == socket.AF_INET6 else bound_host

    def ready() -> None:
        print(f"serving on http://{shown}:{bound_port}", flush=True)
        print(f"  OpenAI base_url: http://{shown}:{bound_port}/v1", flush=True)

    app = create_app(engine, model_name, on_ready=ready, **app_options)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    uvicorn.Server(config).run(sockets=[sock])


def _parse_adapter(spec: str) -> tuple[str, str]:
    """`name=path`, or a bare path named after its folder; a registry URI
    (`models:/<name>@<alias>`, `models:/<name>/<version>`) is named after its registered model."""
    from pathlib import Path

    if "=" in spec:
        name, path = spec.split("=", 1)
        return name, path
    if spec.startswith("models:/"):
        return spec.removeprefix("models:/").split("@")[0].split("/")[0], spec
    return Path(spec).name, spec


def _local_adapter(spec: str, home: Any) -> str:
    """A folder for `spec`: a registry or run URI is downloaded from the home's MLflow store."""
    if not spec.startswith(("models:/", "runs:/")):
        return spec
    import re

    from mlflow.exceptions import MlflowException

    from mascot_dag.lib.storage import tracking

    tracking.configure(home.mlflow_uri, home.mlflow_artifacts)
    dst = home.root / "served_adapters" / re.sub(r"[^\w.-]+", "_", spec)
    try:
        return str(tracking.download_adapter(spec, dst))
    except MlflowException as e:
        # one line, not MLflow's traceback: which adapter, why, and what to run instead
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        hint = (" (no evaluation has promoted a champion yet: name a version, "
                "models:/NAME/VERSION, or leave out --adapter to serve the latest versions)"
                if "@" in spec else "")
        raise SystemExit(f"--adapter {spec}: {why}{hint}") from None


def main(argv: list[str] | None = None) -> None:
    from mascot_dag.lib.llm.models import EMBEDDED_MODEL, resolve_model
    from mascot_dag.lib.storage.home import Home

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=EMBEDDED_MODEL, help="embedded name, hub id or folder")
    ap.add_argument("--adapter", action="append", default=[], help="NAME=PATH (repeatable)")
    ap.add_argument(
        "--served-model-name", action="append", default=[],
        help="name(s) the base model answers to (repeatable; default: --model)",
    )  # fmt: skip
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    ap.add_argument("--models-dir", default=None, help="where converted models live")
    ap.add_argument(
        "--engine", choices=("vllm", "transformers"), default="vllm",
        help="vllm: vLLM's async engine (default); transformers: for machines without vllm",
    )  # fmt: skip
    ap.add_argument("--max-lora-rank", type=int, default=16, help="vllm: largest adapter rank")
    ap.add_argument("--max-model-len", type=int, default=4096, help="vllm: context length")
    ap.add_argument("--batch-size", type=int, default=8, help="transformers: rows per batch")
    ap.add_argument("--threads", type=int, default=None, help="transformers: torch CPU threads")
    ap.add_argument("--max-tokens-limit", type=int, default=MAX_TOKENS_LIMIT)
    ap.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    args = ap.parse_args(argv)
    # Before torch loads: spinning OpenMP workers slow generation ~10x on a shared, busy CPU.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    from mascot_dag.lib.runtime.ports import port_problem

    if problem := port_problem(args.host, args.port):  # before a minute of model loading
        raise SystemExit(problem)
    home = Home.from_env()
    specs = map(_parse_adapter, args.adapter)
    adapters = {name: _local_adapter(spec, home) for name, spec in specs}
    models_dir = args.models_dir or home.models
    engine: Any
    max_batch = 16
    if args.engine == "vllm":
        engine = VLLMEngine(
            resolve_model(args.model, models_dir), adapters,
            max_lora_rank=args.max_lora_rank, max_model_len=args.max_model_len,
        )  # fmt: skip
    else:
        from mascot_dag.lib.llm.transformers_backend import TransformersChat

        engine = TransformersChat(args.model, models_dir, adapters=adapters,
                                  batch_size=args.batch_size, threads=args.threads)  # fmt: skip
        # One backend call takes what batch_size x workers rows can generate side by side.
        max_batch = args.batch_size * getattr(engine, "workers", 1)
    run_server(
        engine, args.host, args.port, model_name=args.model,
        served_names=args.served_model_name or None,
        max_tokens_limit=args.max_tokens_limit,
        max_body_bytes=args.max_body_bytes,
        max_batch=max_batch,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
