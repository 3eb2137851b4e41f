"""An OpenAI-compatible HTTP server over any chat backend (stdlib only).

Endpoints: `POST /v1/chat/completions` (messages, max_tokens, temperature, top_p, seed, and an
optional `adapter` naming a loaded LoRA adapter), `GET /v1/models`, `GET /health`. One lock
serialises generation: a local model is one piece of hardware, and torch is not re-entrant per
model. Run it with

    python -m mascot_dag.lib.llm.server --model embedded:smollm2-135m-instruct \
        --adapter anchor=/path/to/adapter --port 8000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mascot_dag.lib.llm import ChatBackend
from mascot_dag.lib.types import ChatRequest, SamplingParams

_DEFAULTS = SamplingParams()


class _BadRequest(ValueError):
    pass


def parse_chat_body(body: Any) -> ChatRequest:
    """Turn an OpenAI chat-completions body into a ChatRequest; _BadRequest says what is wrong."""
    if not isinstance(body, dict):
        raise _BadRequest("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty list of {role, content} objects")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or "role" not in m:
            raise _BadRequest(f"messages[{j}] must be an object with 'role' and string 'content'")
    try:
        sampling = SamplingParams(
            max_new_tokens=int(body.get("max_tokens") or _DEFAULTS.max_new_tokens),
            temperature=float(body.get("temperature", _DEFAULTS.temperature)),
            top_p=float(body.get("top_p", _DEFAULTS.top_p)),
            seed=int(body.get("seed") or 0),
        )
    except (TypeError, ValueError) as exc:
        raise _BadRequest(f"bad sampling parameter: {exc}") from exc
    adapter = body.get("adapter")
    return ChatRequest(
        messages=tuple({"role": str(m["role"]), "content": m["content"]} for m in messages),
        sampling=sampling,
        adapter=str(adapter) if adapter else None,
    )


def make_server(
    backend: ChatBackend, host: str = "127.0.0.1", port: int = 8000, model_name: str = "mascot"
) -> ThreadingHTTPServer:
    """A ready (bound, not yet serving) server; call `serve_forever()` and `shutdown()`."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:  # quiet: one line per error only
            pass

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?")[0].rstrip("/")
            if path == "/health":
                self._send(200, {"status": "ok", "model": model_name})
            elif path == "/v1/models":
                adapters = sorted(getattr(backend, "adapters", {}) or {})
                ids = [model_name, *adapters]
                data = [{"id": i, "object": "model", "owned_by": "mascot"} for i in ids]
                self._send(200, {"object": "list", "data": data})
            else:
                self._error(404, f"no such endpoint: GET {path}", "not_found")

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?")[0].rstrip("/")
            if path != "/v1/chat/completions":
                self._error(404, f"no such endpoint: POST {path}", "not_found")
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                req = parse_chat_body(body)
                # A client naming an adapter as its model (vLLM's convention) selects it too.
                adapters = getattr(backend, "adapters", {}) or {}
                if req.adapter is None and body.get("model") in adapters:
                    req = ChatRequest(req.messages, req.sampling, body["model"])
            except json.JSONDecodeError as exc:
                self._error(400, f"invalid JSON body: {exc}")
                return
            except _BadRequest as exc:
                self._error(400, str(exc))
                return
            try:
                with lock:
                    result = backend.generate([req])[0]
            except ValueError as exc:  # e.g. an unknown adapter
                self._error(400, str(exc))
                return
            except Exception as exc:  # noqa: BLE001 - the client must get an answer, not a hang
                self._error(500, f"{type(exc).__name__}: {exc}", "server_error")
                return
            self._send(
                200,
                {
                    "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": req.adapter or model_name,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": result.text},
                            "finish_reason": "length"
                            if result.completion_tokens >= req.sampling.max_new_tokens
                            else "stop",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": result.prompt_tokens,
                        "completion_tokens": result.completion_tokens,
                        "total_tokens": result.prompt_tokens + result.completion_tokens,
                    },
                },
            )

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def run_server(
    backend: ChatBackend, host: str = "127.0.0.1", port: int = 8000, model_name: str = "mascot"
) -> None:
    """Serve until interrupted (blocking)."""
    server = make_server(backend, host, port, model_name)
    bound_host, bound_port = server.server_address[:2]
    print(f"serving on http://{bound_host}:{bound_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _parse_adapter(spec: str) -> tuple[str, str]:
    """`name=path`, or a bare path named after its folder."""
    from pathlib import Path

    if "=" in spec:
        name, path = spec.split("=", 1)
        return name, path
    return Path(spec).name, spec


def main(argv: list[str] | None = None) -> None:
    from mascot_dag.lib.home import Home
    from mascot_dag.lib.models import EMBEDDED_MODEL

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=EMBEDDED_MODEL, help="embedded name, hub id or folder")
    ap.add_argument("--adapter", action="append", default=[], help="NAME=PATH (repeatable)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    ap.add_argument("--models-dir", default=None, help="where converted models live")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = ap.parse_args(argv)
    # Before torch loads: spinning OpenMP workers slow generation ~10x on a shared, busy CPU.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    from mascot_dag.lib.llm.transformers_backend import TransformersChat

    adapters = dict(_parse_adapter(s) for s in args.adapter)
    backend = TransformersChat(
        args.model,
        args.models_dir or Home.from_env().models,
        adapters=adapters,
        batch_size=args.batch_size,
        threads=args.threads,
    )
    run_server(backend, args.host, args.port, model_name=args.model)


if __name__ == "__main__":
    sys.exit(main())
