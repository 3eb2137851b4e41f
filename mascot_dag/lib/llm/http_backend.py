"""Chat through any OpenAI-compatible server (`POST {base_url}/chat/completions`).

Works with `mascot serve` (this package's server.py), vLLM's and llama.cpp's OpenAI servers, and
hosted APIs. One HTTP request per ChatRequest, up to `workers` in flight. 429 and 5xx answers and
connection errors are retried with exponential backoff (the server is busy or restarting); any
other 4xx is a mistake in the request and fails at once with the status and the server's body.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests as http

from mascot_dag.lib.llm import ChatBackendError, validate_requests
from mascot_dag.lib.types import ChatRequest, ChatResult

_RETRY_STATUS = {408, 409, 425, 429}


class OpenAIChat:
    """`generate(requests)` against an OpenAI-compatible `/chat/completions` endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        workers: int = 4,
        adapter_as_model: bool = False,
    ) -> None:
        """`adapter_as_model`: send a request's adapter as the `model` field (how vLLM's server
        selects a LoRA module); otherwise it goes in an extra `adapter` field (mascot serve)."""
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model_name = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.workers = max(1, workers)
        self.adapter_as_model = adapter_as_model
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        # requests.Session is not documented as thread-safe: one per worker thread.
        self._local = threading.local()

    def generate(self, requests: list[ChatRequest]) -> list[ChatResult]:
        validate_requests(requests)
        if len(requests) <= 1 or self.workers == 1:
            return [self._one(i, r) for i, r in enumerate(requests)]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(requests))) as pool:
            return list(pool.map(self._one, range(len(requests)), requests))

    def payload(self, req: ChatRequest) -> dict[str, Any]:
        s = req.sampling
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": list(req.messages),
            "max_tokens": s.max_new_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "seed": s.seed,
        }
        if req.json_schema is not None:
            # OpenAI's structured outputs, as vLLM, mascot serve and hosted APIs accept them.
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "response", "schema": json.loads(req.json_schema), "strict": True
                },
            }  # fmt: skip
        if req.adapter is not None:
            if self.adapter_as_model:
                body["model"] = req.adapter
            else:
                body["adapter"] = req.adapter
        return body

    def _session(self) -> http.Session:
        if not hasattr(self._local, "session"):
            self._local.session = http.Session()
        return self._local.session

    def _one(self, index: int, req: ChatRequest) -> ChatResult:
        body = self.payload(req)
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                resp = self._session().post(
                    self.url, json=body, headers=self._headers, timeout=self.timeout_s
                )
            except (http.ConnectionError, http.Timeout) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code in _RETRY_STATUS or resp.status_code >= 500:
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
                continue
            if resp.status_code >= 400:
                raise ChatBackendError(
                    f"request {index}: POST {self.url} answered HTTP {resp.status_code} "
                    f"(not retried: the request or endpoint is wrong): {resp.text[:500]}"
                )
            return _parse(index, self.url, resp, req)
        raise ChatBackendError(
            f"request {index}: POST {self.url} failed after {self.max_retries + 1} attempts; "
            f"last error: {last}. Is the server running and reachable?"
        )


def _parse(index: int, url: str, resp: http.Response, req: ChatRequest) -> ChatResult:
    try:
        data = resp.json()
        text = data["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ChatBackendError(
            f"request {index}: {url} returned no choices[0].message.content "
            f"({type(exc).__name__}: {exc}); body: {resp.text[:500]}"
        ) from exc
    usage = data.get("usage") or {}
    # Some servers omit usage: word counts are a rough but monotone stand-in for tokens.
    prompt_tokens = usage.get("prompt_tokens")
    if prompt_tokens is None:
        prompt_tokens = sum(len(m["content"].split()) for m in req.messages)
    completion_tokens = usage.get("completion_tokens")
    if completion_tokens is None:
        completion_tokens = len(text.split())
    return ChatResult(
        text=text.strip(),
        prompt_tokens=int(prompt_tokens),
        completion_tokens=int(completion_tokens),
    )
