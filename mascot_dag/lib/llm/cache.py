"""A DuckDB-backed generation cache in front of any chat backend.

Key: `ChatRequest.cache_key(model, adapter_version)` = model, adapter name and version, messages
and sampling parameters (seed included), plus the JSON schema of a structured request.
A sampled text is therefore cached per seed: re-running a stage with the same seeds reuses every
text, while a new seed or a retrained adapter (new version) misses and generates. Misses go to the
backend in ONE call so it can batch them.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace

import polars as pl

from mascot_dag.lib.llm import ChatBackend, validate_requests
from mascot_dag.lib.storage.db import connect, upsert_rows
from mascot_dag.lib.types import ChatRequest, ChatResult


class CachedChat:
    """`generate(requests)` that serves repeated requests from the `generation_cache` table."""

    def __init__(
        self,
        backend: ChatBackend,
        db_path: str | os.PathLike,
        model_name: str,
        adapter_versions: dict[str, str] | None = None,
    ) -> None:
        self.backend = backend
        self.db_path = db_path
        self.model_name = model_name
        # adapter name -> version (e.g. the MLflow model version): a retrained adapter must miss.
        self.adapter_versions = dict(adapter_versions or {})
        self.hits = 0
        self.misses = 0

    def key(self, req: ChatRequest) -> str:
        version = self.adapter_versions.get(req.adapter) if req.adapter else None
        return req.cache_key(self.model_name, version)

    def generate(self, requests: list[ChatRequest]) -> list[ChatResult]:
        validate_requests(requests)
        keys = [self.key(r) for r in requests]
        found = self._lookup(sorted(set(keys)))
        results: list[ChatResult | None] = [None] * len(requests)
        # Identical requests inside one call are generated once and shared.
        todo: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            if k in found:
                results[i] = replace(found[k], cached=True)
            else:
                todo.setdefault(k, []).append(i)
        # hits = requests answered without generating (cached rows and in-call duplicates).
        self.hits += len(requests) - len(todo)
        self.misses += len(todo)
        if todo:
            first = [idxs[0] for idxs in todo.values()]
            fresh = self.backend.generate([requests[i] for i in first])
            if len(fresh) != len(first):
                raise RuntimeError(
                    f"backend {type(self.backend).__name__} returned {len(fresh)} results "
                    f"for {len(first)} requests"
                )
            self._store([requests[i] for i in first], list(todo), fresh)
            for idxs, res in zip(todo.values(), fresh, strict=True):
                for i in idxs:
                    results[i] = res
        return results  # type: ignore[return-value]

    def _lookup(self, keys: list[str]) -> dict[str, ChatResult]:
        if not keys:
            return {}
        with connect(self.db_path) as con:
            rows = con.execute(
                "SELECT cache_key, text, prompt_tokens, completion_tokens FROM generation_cache "
                "WHERE cache_key IN (SELECT unnest(?::VARCHAR[]))",
                [keys],
            ).fetchall()
        return {k: ChatResult(text=t, prompt_tokens=p, completion_tokens=c) for k, t, p, c in rows}

    def _store(self, reqs: list[ChatRequest], keys: list[str], results: list[ChatResult]) -> None:
        rows = pl.DataFrame(
            {
                "cache_key": keys,
                "model": [self.model_name] * len(keys),
                "adapter": [r.adapter for r in reqs],
                "adapter_version": [
                    self.adapter_versions.get(r.adapter) if r.adapter else None for r in reqs
                ],
                "request": [
                    json.dumps(
                        {"messages": list(r.messages), "sampling": asdict(r.sampling)}
                        | ({"json_schema": r.json_schema} if r.json_schema else {}),
                        ensure_ascii=False,
                    )
                    for r in reqs
                ],
                "text": [res.text for res in results],
                "prompt_tokens": [res.prompt_tokens for res in results],
                "completion_tokens": [res.completion_tokens for res in results],
            },
            # explicit: a column that is None in every row (adapter of base requests) is text
            schema_overrides={"adapter": pl.String, "adapter_version": pl.String},
        )
        upsert_rows(self.db_path, "generation_cache", rows)
