"""Chat through a running vLLM OpenAI server, with LoRA adapters loaded into it at run time.

What a step on a cluster worker uses instead of an engine of its own (docs/DESIGN.md "Past one
machine"): the worker sends HTTP requests and the model stays loaded in the server. Adapters the
lineage trains in the same run (pi_SFT, the persona adapters, the director) reach the server
through vLLM's runtime LoRA API, `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` (the
server must run with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=true` and `--enable-lora`, as
`server_command` + `server_env` start it); a request then names the adapter in its `model`
field (vLLM's multi-LoRA convention).

The path is read by the SERVER, so adapter folders must be on storage the server sees (the
shared MASCOT_HOME). vLLM keeps an adapter by name for the server's lifetime and refuses to load
a second folder under a name it has; the lineage's names carry the registry version
(`mascot-persona-anchor@v1`), and two homes (two runs, two test homes) both have a v1, so the
name sent to the server also carries a hash of the folder: a name is never reused for other
weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import requests as http

from mascot_dag.lib.llm import ChatBackendError, validate_requests
from mascot_dag.lib.llm.http_backend import OpenAIChat
from mascot_dag.lib.types import ChatRequest, ChatResult

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def server_env() -> dict[str, str]:
    """Environment a generation server needs beside `server_command`: runtime LoRA loading."""
    return {RUNTIME_LORA_ENV: "true"}


def served_name(name: str, folder: str | os.PathLike) -> str:
    """The adapter's name on the server: `name` plus 8 hex digits of its resolved folder."""
    digest = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:8]
    return f"{name}~{digest}"


class VLLMServerChat(OpenAIChat):
    """`generate(requests)` on a vLLM OpenAI server; `add_adapter(name, folder)` loads a PEFT
    folder into that server (idempotent: a folder the server already has is not sent twice)."""

    def __init__(self, base_url: str, model: str, **kwargs) -> None:
        super().__init__(base_url, model, adapter_as_model=True, **kwargs)
        self.root = base_url.rstrip("/")  # .../v1
        self._served: dict[str, str] = {}  # our adapter name -> the server's name
        self._paths: dict[str, str] = {}

    @property
    def adapters(self) -> dict[str, str]:
        return dict(self._paths)

    def add_adapter(self, name: str, path: str | os.PathLike) -> None:
        from mascot_dag.lib.llm.vllm_backend import check_adapter_folder

        folder = str(Path(check_adapter_folder(name, path)).resolve())
        if self._paths.get(name) == folder:
            return
        remote = served_name(name, folder)
        url = f"{self.root}/load_lora_adapter"
        try:
            resp = http.post(url, json={"lora_name": remote, "lora_path": folder},
                             headers=self._headers, timeout=self.timeout_s)
        except (http.ConnectionError, http.Timeout) as exc:
            raise ChatBackendError(f"adapter {name!r}: POST {url} failed ({exc}); is the vLLM "
                                   "server running and reachable?") from exc
        # 400 "has already been loaded": another step (or an earlier run) loaded this folder
        if resp.status_code != 200 and "already been loaded" not in resp.text:
            hint = ""
            if resp.status_code == 404:
                hint = (f" (the server has no runtime LoRA API: start it with "
                        f"{RUNTIME_LORA_ENV}=true and --enable-lora)")
            raise ChatBackendError(f"adapter {name!r}: the vLLM server could not load {folder}: "
                                   f"HTTP {resp.status_code} {resp.text[:300]}{hint}")
        self._served[name], self._paths[name] = remote, folder

    def generate(self, requests: list[ChatRequest]) -> list[ChatResult]:
        validate_requests(requests, set(self._served))
        return super().generate([r if r.adapter is None
                                 else dataclasses.replace(r, adapter=self._served[r.adapter])
                                 for r in requests])

    def loaded(self) -> dict[str, str]:
        """The server's LoRA modules, {served name: folder} (GET /v1/models)."""
        resp = http.get(f"{self.root}/models", headers=self._headers, timeout=self.timeout_s)
        resp.raise_for_status()
        return {m["id"]: m.get("root", "") for m in resp.json()["data"]
                if m.get("parent")}
