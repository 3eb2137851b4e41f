"""The base director with and without structured outputs, on the same states and seeds.

Each state is a held-out ED situation (support roster) after the seeker's opening and, for half of
them, one agent turn (so `no_repeat` forbids a speaker). Both arms run every state through
`lib.dialogue.direct_turns`'s contract (`DirectorTurn`: a first try, one repair retry, then the
fallback) with the embedded SmolLM2-135M at the pipeline's director settings (48 new tokens,
temperature 0.7), batched as the dialogue engine batches them. Prints, per arm: valid on the first
try, retried, fallback, distinct speakers, the mean action length, and wall seconds; the ratio of
the two wall times is the figure to compare (the machine is shared and noisy).

    .venv/bin/python scripts/bench_director.py [--ed PATH] [--states 32]
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from mascot_dag.lib.director import DirectorTurn
from mascot_dag.lib.home import Home
from mascot_dag.lib.llm.transformers_backend import TransformersChat
from mascot_dag.lib.loaders.empathetic import load_empathetic_dialogues
from mascot_dag.lib.models import EMBEDDED_MODEL
from mascot_dag.lib.personas import load_personas, personas_of_set
from mascot_dag.lib.types import ChatRequest, SamplingParams

DEFAULT_ED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                          "empatheticdialogues", "valid.csv")


def states(ed_path: str, n: int, roster) -> list[tuple[str, list[dict], str | None]]:
    contexts = load_empathetic_dialogues(ed_path).contexts[-n:]  # the file's end: never trained
    out = []
    for i, ctx in enumerate(contexts):
        history = [{"speaker": "user", "text": ctx.text}]
        last = None
        if i % 2:  # one agent already spoke: the director must pick someone else
            last = roster[i % len(roster)].persona_id
            history.append({"speaker": last, "text": "That sounds really hard. I'm here."})
        out.append((ctx.text, history, last))
    return out


def run_arm(chat: TransformersChat, roster, items, structured: bool) -> tuple[list, float]:
    turns = [DirectorTurn(text, roster, hist, "support", len(hist), last, True, structured)
             for text, hist, last in items]
    t0, attempt = time.perf_counter(), 0
    while todo := [t for t in turns if t.pending()]:
        reqs = [ChatRequest(tuple(t.pending() or ()),
                            SamplingParams(48, 0.7, seed=i * 100 + attempt), None, t.json_schema())
                for i, t in enumerate(todo)]
        for t, res in zip(todo, chat.generate(reqs), strict=True):
            t.feed(res.text)
        attempt += 1
    return turns, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ed", default=DEFAULT_ED)
    ap.add_argument("--states", type=int, default=32)
    args = ap.parse_args()
    roster = personas_of_set(load_personas(), "support")
    items = states(args.ed, args.states, roster)
    chat = TransformersChat(EMBEDDED_MODEL, Home.from_env().models)
    chat.generate([ChatRequest(({"role": "user", "content": "hi"},), SamplingParams(4))])
    seconds = {}
    for structured in (False, True):
        turns, secs = run_arm(chat, roster, items, structured)
        seconds[structured] = secs
        status = Counter(t.status for t in turns)
        speakers = Counter(t.directive.speaker for t in turns)
        actions = [len(t.directive.action) for t in turns]
        print(f"{'structured' if structured else 'prompt only':12}: n={len(turns)} "
              f"ok={status['ok']} retried={status['retried']} fallback={status['fallback']} "
              f"speakers={dict(speakers)} mean action chars={sum(actions) / len(actions):.0f} "
              f"wall={secs:.1f} s")
        for t in turns[:3]:
            print(f"    {t.raw_outputs[0][:160]!r}")
    print(f"structured / prompt-only wall time: {seconds[True] / seconds[False]:.2f}")


if __name__ == "__main__":
    main()
