"""Generation on the embedded SmolLM2-135M on CPU: transformers vs vLLM, in one table.

The same dialogue-like prompts (a persona's system prompt and a situation; half of them also
carry another companion's earlier turn and the person's follow-up), sampled as the pipeline
samples (temperature 0.8, top-p 0.95, one fixed seed per request), go through:

- TransformersChat batched: its defaults (batch 8, 2 worker threads on a CPU; float32);
- VLLMChat batched: every prompt in ONE generate call (continuous batching; bfloat16);
- VLLMChat single-stream: one request per call, the first --single prompts;
- `mascot serve` (one row per --serve engine): time to the first streamed content chunk, one
  request at a time, median of --ttft-requests after one warm-up request.

Per row: the engine's start (the constructor, or the server's start until /health answers;
modules are imported beforehand, so this is engine work, not imports), completion tokens per wall
second, and the peak RSS of this process and of its child processes (vLLM's engine core, the
server), sampled every 0.1 s. Figures only, nothing is asserted: the CPU may be shared with other
work, so compare the ratios rather than the absolutes.

    .venv/bin/python scripts/bench_generation.py [--prompts 64] [--tokens 48] [--single 8]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

# Before torch loads: spinning OpenMP workers slow generation ~10x on a shared, busy CPU.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# vLLM logs every engine step at INFO; the table is what this script is for.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import psutil  # noqa: E402
import requests  # noqa: E402

from mascot_dag.lib.llm.models import EMBEDDED_MODEL, resolve_model  # noqa: E402
from mascot_dag.lib.runtime.local_cluster import free_port, start, stop_group, wait_healthy  # noqa: E402
from mascot_dag.lib.storage.home import Home  # noqa: E402
from mascot_dag.lib.types import ChatRequest, SamplingParams  # noqa: E402

PERSONAS = [
    "You are The Anchor, a calm, steady companion. You validate feelings and slow down.",
    "You are The Beacon, a warm optimist. You point out hope and strengths in hard moments.",
    "You are The Catalyst, a direct motivator. You nudge people to take one small step.",
    "You are Action Guide, a practical planner. You give short, concrete next steps.",
]
SITUATIONS = [
    "I failed my driving test for the second time and I feel like giving up.",
    "My best friend moved to another country last week and the flat feels empty.",
    "I got the promotion I worked for, but I'm scared I'm not good enough for it.",
    "Our team missed the deadline again and my manager looked disappointed at me.",
    "I can't sleep the night before exams and then I blank during them.",
    "My parents keep arguing and I end up as the one who calms everyone down.",
    "I moved to a new city for work and I haven't made a single friend yet.",
    "My dog is sick and the vet bills are more than I can really afford.",
]
EARLIER_TURN = "The Beacon: That sounds really hard, and it took courage to tell us."
FOLLOW_UP = "Thanks. I just don't know what to do first."


def prompts(n: int, tokens: int) -> list[ChatRequest]:
    """`n` requests cycling through persona x situation x (first turn, or a later turn)."""
    reqs = []
    for i in range(n):
        persona, situation = PERSONAS[i % 4], SITUATIONS[(i // 4) % len(SITUATIONS)]
        msgs = [{"role": "system", "content": persona}, {"role": "user", "content": situation}]
        if (i // (4 * len(SITUATIONS))) % 2:  # the second round: a group turn came before
            msgs += [{"role": "assistant", "content": EARLIER_TURN},
                     {"role": "user", "content": FOLLOW_UP}]  # fmt: skip
        sampling = SamplingParams(max_new_tokens=tokens, temperature=0.8, top_p=0.95, seed=i)
        reqs.append(ChatRequest(messages=tuple(msgs), sampling=sampling))
    return reqs


class PeakRSS:
    """Peak resident memory (bytes) of this process and of all its descendants together, sampled
    in a thread (the engines run in C++ and in child processes, so sampling sees their peak)."""

    def __init__(self, every_s: float = 0.1) -> None:
        self.me, self.every_s = psutil.Process(), every_s
        self.reset()
        threading.Thread(target=self._sample, daemon=True).start()

    def reset(self) -> None:
        self.start = self.me.memory_info().rss
        self.main = self.children = 0

    def _sample(self) -> None:
        while True:
            kids = 0
            for p in self.me.children(recursive=True):
                with contextlib.suppress(psutil.Error):  # a child may exit while we look
                    kids += p.memory_info().rss
            self.main = max(self.main, self.me.memory_info().rss)
            self.children = max(self.children, kids)
            time.sleep(self.every_s)

    def columns(self) -> str:
        mib = 2**20
        return (f"{self.main / mib:6.0f} (+{(self.main - self.start) / mib:4.0f})"
                f" {self.children / mib:7.0f}")  # fmt: skip


def timed(generate, reqs: list[ChatRequest]) -> tuple[int, float]:
    """(completion tokens, wall seconds) of `generate(reqs)`."""
    t0 = time.perf_counter()
    results = generate(reqs)
    return sum(r.completion_tokens for r in results), time.perf_counter() - t0


@contextlib.contextmanager
def mascot_serve(engine: str, timeout_s: float = 300.0):
    """`mascot serve --engine ENGINE` on a free loopback port, in its own process group; yields
    (base URL, seconds until /health answered) and stops the group by its pid afterwards."""
    port = free_port()
    cmd = [str(Path(sys.executable).with_name("mascot")), "serve", "--engine", engine,
           "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "serve.log"
        t0 = time.perf_counter()
        proc = start(cmd, log)  # its own group: SIGTERM reaches the server and its engine
        try:
            wait_healthy(f"{url}/health", proc, timeout_s, "mascot serve", log)
            yield url, time.perf_counter() - t0
        finally:
            stop_group(proc, timeout_s=30)


def first_chunk_s(url: str, req: ChatRequest) -> float:
    """Seconds from sending a streamed chat completion to its first non-empty content chunk.
    Leaving the stream then closes it, which aborts the rest of the generation on the server."""
    s = req.sampling
    body = {"messages": list(req.messages), "max_tokens": s.max_new_tokens, "stream": True,
            "temperature": s.temperature, "top_p": s.top_p, "seed": s.seed}  # fmt: skip
    t0 = time.perf_counter()
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    return time.perf_counter() - t0
    raise RuntimeError("the stream ended without any content")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64, help="requests in the batched rows")
    ap.add_argument("--tokens", type=int, default=48, help="max new tokens per request")
    ap.add_argument("--single", type=int, default=8, help="requests in the single-stream row")
    ap.add_argument("--ttft-requests", type=int, default=5, help="streamed requests per server")
    ap.add_argument("--serve", nargs="*", default=["vllm", "transformers"],
                    choices=["vllm", "transformers"], help="mascot serve engines to time")
    args = ap.parse_args()

    # Imported here, before any timing: the start columns measure engines, not imports.
    import vllm  # noqa: F401

    from mascot_dag.lib.llm.transformers_backend import TransformersChat
    from mascot_dag.lib.llm.vllm_backend import VLLMChat

    model = resolve_model(EMBEDDED_MODEL, Home.from_env().models)  # converts once if needed
    reqs = prompts(args.prompts, args.tokens)
    peak = PeakRSS()
    rows = []

    def row(name: str, start_s: float | None, n: int, tokens: int, wall: float,
            ttft: str = "") -> None:  # fmt: skip
        start = f"{start_s:7.1f}" if start_s is not None else f"{'(same)':>7}"
        tps = f"{tokens / wall:7.1f}" if wall else f"{'':>7}"
        rows.append(f"{name:34} {start} {n:5} {tokens:6} {tps} {ttft:>8}  {peak.columns()}")

    peak.reset()
    t0 = time.perf_counter()
    chat = TransformersChat(EMBEDDED_MODEL, Home.from_env().models)
    start_s = time.perf_counter() - t0
    chat.generate(reqs[:2])  # warm-up: first calls pay for lazy initialisation
    tokens, wall = timed(chat.generate, reqs)
    row(f"transformers batched ({chat.batch_size}x{chat.workers})", start_s, len(reqs), tokens,
        wall)  # fmt: skip
    del chat
    gc.collect()

    peak.reset()
    t0 = time.perf_counter()
    llm = VLLMChat(model)
    start_s = time.perf_counter() - t0
    llm.generate(reqs[:2])  # warm-up
    tokens, wall = timed(llm.generate, reqs)
    row("vllm batched (one call)", start_s, len(reqs), tokens, wall)
    peak.reset()
    single = reqs[: args.single]
    t0 = time.perf_counter()
    tokens = sum(timed(llm.generate, [r])[0] for r in single)
    row("vllm single-stream", None, len(single), tokens, time.perf_counter() - t0)
    llm.close()
    del llm
    gc.collect()

    for engine in args.serve:
        peak.reset()
        with mascot_serve(engine) as (url, start_s):
            first_chunk_s(url, reqs[0])  # warm-up
            times = [first_chunk_s(url, r) for r in reqs[1 : 1 + args.ttft_requests]]
            ttft = f"{statistics.median(times):8.2f}"
            row(f"mascot serve --engine {engine}", start_s, len(times), 0, 0.0, ttft)

    print(f"\n{args.prompts} prompts, {args.tokens} new tokens max, sampled (T=0.8, top-p 0.95, "
          f"seed per request); {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'':34} {'start s':>7} {'reqs':>5} {'tokens':>6} {'tok/s':>7} {'TTFT s':>8}  "
          f"{'RSS MiB: this (+leg)':>20} {'children':>7}")  # fmt: skip
    print("\n".join(rows))


if __name__ == "__main__":  # vLLM spawns its engine process, which re-imports this module
    main()
