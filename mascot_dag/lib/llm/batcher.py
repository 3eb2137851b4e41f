"""Micro-batching in front of a chat backend: one worker thread owns the backend.

Requests that arrive while a batch is generating (or within `window_s` of the first one) are
generated together in ONE `backend.generate(list)` call: TransformersChat batches rows with left
padding and runs chunks side by side, so 20 concurrent chats cost about two batched calls instead
of 20 serial ones. One worker thread is also the lock a local model needs (torch is not
re-entrant per model). Used by `mascot serve` (server.py); no web framework imported here.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

from mascot_dag.lib.llm import ChatBackend
from mascot_dag.lib.types import ChatRequest, ChatResult

_STOP = object()


class Batcher:
    """`submit(request) -> Future[ChatResult]`; a daemon thread generates in batches."""

    def __init__(self, backend: ChatBackend, max_batch: int = 16, window_s: float = 0.01) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.backend = backend
        self.max_batch = max_batch
        self.window_s = window_s
        self.requests = 0  # served so far; /health reports these
        self.batches = 0
        self.largest_batch = 0
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, req: ChatRequest) -> Future:
        with self._start_lock:  # started on first use: works with or without an ASGI lifespan
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="generate", daemon=True)
                self._thread.start()
        fut: Future = Future()
        self._queue.put((req, fut))
        return fut

    def close(self) -> None:
        with self._start_lock:
            if self._thread is not None:
                self._queue.put(_STOP)
                self._thread.join(timeout=30)
                self._thread = None

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            batch = [item]
            deadline = time.monotonic() + self.window_s
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is _STOP:
                    self._queue.put(_STOP)  # finish this batch, then stop
                    break
                batch.append(nxt)
            # A client that went away cancelled its future: skip its generation.
            live = [(r, f) for r, f in batch if f.set_running_or_notify_cancel()]
            if live:
                self._run(live)

    def _run(self, batch: list[tuple[ChatRequest, Future]]) -> None:
        self.batches += 1
        self.requests += len(batch)
        self.largest_batch = max(self.largest_batch, len(batch))
        try:
            results: list[ChatResult] = self.backend.generate([r for r, _ in batch])
        except Exception as exc:  # noqa: BLE001 - every waiting client must get an answer
            if len(batch) == 1:
                batch[0][1].set_exception(exc)
                return
            # One failing request must not fail the others: retry each one alone.
            for req, fut in batch:
                try:
                    fut.set_result(self.backend.generate([req])[0])
                except Exception as one_exc:  # noqa: BLE001
                    fut.set_exception(one_exc)
            return
        for (_, fut), result in zip(batch, results, strict=True):
            fut.set_result(result)
