"""`mascot serve`: an OpenAI-compatible HTTP server over any chat backend (FastAPI + uvicorn,
the stack of vLLM's own OpenAI server).

Endpoints: `POST /v1/chat/completions` (messages, model, max_tokens or max_completion_tokens,
temperature, top_p, seed, stop, n=1 only, stream, stream_options.include_usage), `GET /v1/models`
(the base model's served names, then the loaded adapters) and `GET /health`.

- Adapters: the `model` field may name a loaded adapter (vLLM's LoRA convention), or a non-standard
  `adapter` field names one while `model` names the base model (what `OpenAIChat` sends).
- Errors are OpenAI-shaped, `{"error": {"message", "type", "param", "code"}}`: malformed JSON,
  missing fields and wrong types are 400 (vLLM answers 400 too, not FastAPI's 422), an unknown
  model or adapter 404 `model_not_found`, a body over `max_body_bytes` 413 (decided from its
  length, never parsed), an unknown endpoint 404, a backend failure 500.
- Generation runs in a worker thread (batcher.py), off the event loop: /health answers during a
  generation, and requests that arrive together are generated as ONE batched backend call.
- Streaming (`stream: true`) sends server-sent events in OpenAI's `chat.completion.chunk` format,
  then `data: [DONE]`. The backend returns whole texts, so tokens are NOT streamed from the model
  yet: the finished text is cut into word pieces, sent as chunks once generation has ended.
- `stop` strings are applied to the finished text (usage still counts every generated token).
- Structured outputs: `response_format` `{"type": "json_schema", "json_schema": {"schema": ...}}`
  is enforced by constrained decoding (structured.py's schema subset); `{"type": "text"}` is the
  default; `json_object` and unsupported schemas are a 400 naming what is unsupported.

Request parsing and validation live in openai_protocol.py, batching in batcher.py.

Run it with `mascot serve` or

    python -m mascot_dag.lib.llm.server --model embedded:smollm2-135m-instruct \
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
from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from mascot_dag.lib.llm import ChatBackend
from mascot_dag.lib.llm.batcher import Batcher
from mascot_dag.lib.llm.openai_protocol import (
    MAX_BODY_BYTES,
    MAX_TOKENS_LIMIT,
    RequestError,
    _BadRequest,  # noqa: F401 - the name this module exported before
    parse_chat_body,
    parse_flag,
    parse_stops,
    text_pieces,
)
from mascot_dag.lib.types import ChatRequest


def create_app(
    backend: ChatBackend,
    model_name: str = "mascot",
    adapters: Iterable[str] | None = None,
    *,
    served_names: Iterable[str] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_tokens_limit: int = MAX_TOKENS_LIMIT,
    max_batch: int = 16,
) -> FastAPI:
    """The FastAPI app. `served_names` are the names the base model answers to (default
    `[model_name]`); `adapters` the adapter names requests may select (default: the backend's
    `adapters` dict, read per request so adapters added at run time count)."""
    base_names = list(served_names or [model_name])
    fixed_adapters = None if adapters is None else list(adapters)
    batcher = Batcher(backend, max_batch=max_batch)

    def adapter_names() -> list[str]:
        if fixed_adapters is not None:
            return fixed_adapters
        return sorted(getattr(backend, "adapters", {}) or {})

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> Any:
        yield
        await asyncio.to_thread(batcher.close)

    app = FastAPI(title="mascot serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.batcher = batcher

    def error(status: int, message: str, kind: str, param: str | None = None,
              code: str | None = None) -> JSONResponse:  # fmt: skip
        body = {"message": message, "type": kind, "param": param, "code": code}
        return JSONResponse({"error": body}, status_code=status)

    @app.exception_handler(RequestError)
    async def _request_error(_req: Request, exc: RequestError) -> JSONResponse:
        return error(exc.status, exc.message, exc.kind, exc.param, exc.code)

    @app.exception_handler(HTTPException)
    async def _http_error(req: Request, exc: HTTPException) -> JSONResponse:
        message = (
            f"no such endpoint: {req.method} {req.url.path}" if exc.status_code == 404
            else f"{exc.detail}: {req.method} {req.url.path}"
        )  # fmt: skip
        return error(exc.status_code, message, "invalid_request_error")

    @app.exception_handler(Exception)
    async def _server_error(_req: Request, exc: Exception) -> JSONResponse:
        # A bug of the server, never the client's input: still an OpenAI-style body.
        return error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, str(exc), "invalid_request_error")

    @app.get("/health")
    async def health() -> dict:
        return {
            "status": "ok",
            "model": model_name,
            "requests": batcher.requests,
            "batches": batcher.batches,
            "largest_batch": batcher.largest_batch,
        }

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
                f"the adapter '{req.adapter}' is not loaded on this server; loaded: "
                f"{', '.join(loaded) or 'none'}",
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
            f"the model '{model}' does not exist on this server; served: {known}",
            "model", 404, "invalid_request_error", "model_not_found",
        )  # fmt: skip

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        raw = await read_body(request)
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(f"invalid JSON body: {exc}") from exc
        req = parse_chat_body(body, max_tokens_limit)
        req, echo_model = resolve(body, req)
        stops = parse_stops(body)
        stream = parse_flag(body, "stream")
        options = body.get("stream_options") or {}
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        try:
            result = await asyncio.wrap_future(batcher.submit(req))
        except Exception as exc:  # noqa: BLE001 - a backend failure is the server's, not the client's
            return error(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")
        text = result.text
        finish = "length" if result.completion_tokens >= req.sampling.max_new_tokens else "stop"
        cut = [i for i in (text.find(s) for s in stops) if i >= 0]
        if cut:
            text, finish = text[: min(cut)], "stop"
        usage = {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
        }
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "created": int(time.time()),
            "model": echo_model,
            "system_fingerprint": None,
        }
        if not stream:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish}  # fmt: skip
            return {**head, "object": "chat.completion", "choices": [choice], "usage": usage}

        def chunk(delta: dict, finish_reason: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            payload = {**head, "object": "chat.completion.chunk", "choices": [choice]}
            return f"data: {json.dumps(payload)}\n\n"

        def events() -> Iterator[str]:
            yield chunk({"role": "assistant", "content": ""})
            for piece in text_pieces(text):
                yield chunk({"content": piece})
            yield chunk({}, finish)
            if include_usage:
                payload = {**head, "object": "chat.completion.chunk", "choices": [],
                           "usage": usage}  # fmt: skip
                yield f"data: {json.dumps(payload)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def run_server(
    backend: ChatBackend,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str = "mascot",
    **app_options: Any,
) -> None:
    """Serve with uvicorn until SIGINT/SIGTERM (blocking). Prints `serving on URL` once the port
    is bound (port 0 picks a free one), so scripts and tests can read the address."""
    import uvicorn

    app = create_app(backend, model_name, **app_options)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if family == socket.AF_INET6 else bound_host
    print(f"serving on http://{shown}:{bound_port}", flush=True)
    print(f"  OpenAI base_url: http://{shown}:{bound_port}/v1", flush=True)
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

    from mascot_dag.lib import tracking

    tracking.configure(home.mlflow_uri, home.mlflow_artifacts)
    dst = home.root / "served_adapters" / re.sub(r"[^\w.-]+", "_", spec)
    return str(tracking.download_adapter(spec, dst))


def main(argv: list[str] | None = None) -> None:
    from mascot_dag.lib.home import Home
    from mascot_dag.lib.models import EMBEDDED_MODEL

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
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--max-tokens-limit", type=int, default=MAX_TOKENS_LIMIT)
    ap.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    args = ap.parse_args(argv)
    # Before torch loads: spinning OpenMP workers slow generation ~10x on a shared, busy CPU.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    from mascot_dag.lib.llm.transformers_backend import TransformersChat

    home = Home.from_env()
    specs = map(_parse_adapter, args.adapter)
    adapters = {name: _local_adapter(spec, home) for name, spec in specs}
    backend = TransformersChat(
        args.model,
        args.models_dir or home.models,
        adapters=adapters,
        batch_size=args.batch_size,
        threads=args.threads,
    )
    run_server(
        backend, args.host, args.port, model_name=args.model,
        served_names=args.served_model_name or None,
        max_tokens_limit=args.max_tokens_limit,
        max_body_bytes=args.max_body_bytes,
        # One backend call takes what batch_size x workers rows can generate side by side.
        max_batch=args.batch_size * getattr(backend, "workers", 1),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
