"""Tokens/s of one-at-a-time vs batched generation with the embedded SmolLM2-135M on CPU.

The same 16 persona-style chats (4 personas x 4 situations) are generated three times with
TransformersChat: batch_size=1 with one worker (one prompt per `generate` call), batch_size=8 with
one worker (left-padded batches), and batch_size=8 cut into `--workers` chunks run in threads
(the backend's default on a CPU). Sampling as in the pipeline (temperature 0.8, 48 new tokens,
one seed per request). Prints the throughputs and the ratios to one-at-a-time (target >= 3x).

    .venv/bin/python scripts/bench_generation.py [--threads 2] [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import os
import time

# Before torch loads: spinning OpenMP workers slow generation ~10x on a shared, busy CPU.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from mascot_dag.lib.home import Home
from mascot_dag.lib.llm.transformers_backend import TransformersChat
from mascot_dag.lib.models import EMBEDDED_MODEL
from mascot_dag.lib.types import ChatRequest, SamplingParams

PERSONAS = {
    "Anchor": "You are Anchor, a calm, steady companion. You validate feelings and slow down.",
    "Beacon": "You are Beacon, a warm optimist. You point out hope and strengths in hard moments.",
    "Catalyst": "You are Catalyst, a direct motivator. You nudge people to take one small step.",
    "Guide": "You are Action Guide, a practical planner. You give short, concrete next steps.",
}
SITUATIONS = [
    "I failed my driving test for the second time and I feel like giving up.",
    "My best friend moved to another country last week and the flat feels empty.",
    "I got the promotion I worked for, but I'm scared I'm not good enough for it.",
    "Our team missed the deadline again and my manager looked disappointed at me.",
]


def requests(max_new_tokens: int) -> list[ChatRequest]:
    reqs = []
    for p_idx, system in enumerate(PERSONAS.values()):
        for s_idx, situation in enumerate(SITUATIONS):
            messages = (
                {"role": "system", "content": system},
                {"role": "user", "content": situation},
            )
            sampling = SamplingParams(
                max_new_tokens=max_new_tokens, temperature=0.8, top_p=0.95, seed=p_idx * 10 + s_idx
            )
            reqs.append(ChatRequest(messages=messages, sampling=sampling))
    return reqs


def measure(
    chat: TransformersChat, reqs: list[ChatRequest], batch_size: int, workers: int
) -> tuple[float, float, int]:
    """(tokens per wall second, tokens per CPU second, tokens). CPU seconds count every torch
    thread; on a shared machine they show the work done, while wall seconds include waiting."""
    chat.batch_size, chat.workers = batch_size, workers
    start, cpu = time.perf_counter(), time.process_time()
    results = chat.generate(reqs)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = sum(r.completion_tokens for r in results)
    return tokens / elapsed, tokens / cpu, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2, help="parallel chunks (threads)")
    args = ap.parse_args()

    chat = TransformersChat(EMBEDDED_MODEL, Home.from_env().models, threads=args.threads)
    reqs = requests(args.max_new_tokens)
    chat.generate(reqs[:2])  # warm-up: first calls pay for lazy initialisation
    print(f"prompts: {len(reqs)}, max_new_tokens: {args.max_new_tokens}, threads: {args.threads}")
    legs = [
        ("one at a time", 1, 1),
        (f"batched ({args.batch_size})", args.batch_size, 1),
        (f"batched ({args.batch_size}) x {args.workers} threads", args.batch_size, args.workers),
    ]
    rows = [(name, *measure(chat, reqs, b, w)) for name, b, w in legs]
    for name, wall, cpu, tok in rows:
        print(f"{name:28}: {wall:6.1f} tok/s wall, {cpu:6.1f} tok/cpu-s ({tok} tokens)")
    single = rows[0][1]
    for name, wall, _, _ in rows[1:]:
        print(f"{name:28}: {wall / single:.2f}x one at a time (wall; target >= 3x)")


if __name__ == "__main__":
    main()
