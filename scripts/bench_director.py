"""The base director with and without structured outputs, on the same states and seeds.

Each state is a held-out ED situation (support roster) after the seeker's opening and, for half of
them, one agent turn (so `no_repeat` forbids a speaker). Both arms decide every state through the
dialogue engine's own `lib.dialogue.direct_turns` (a first try, one repair retry, then the
fallback) with the embedded SmolLM2-135M at the pipeline's director settings (`DialogueConfig`:
48 new tokens, temperature 0.7, the spec's seeds), batched as in a dialogue step. Prints, per arm:
valid on the first try, retried, fallback, the speakers, the mean action length, and wall seconds;
the ratio of the two wall times is the figure to compare (the machine is shared and noisy).

    .venv/bin/python scripts/bench_director.py [--ed PATH] [--states 32]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from mascot_dag.lib.data.empathetic import load_empathetic_dialogues
from mascot_dag.lib.data.personas import load_personas, personas_of_set
from mascot_dag.lib.data.users import load_user_profiles
from mascot_dag.lib.dialogue.engine import DialogueState, direct_turns
from mascot_dag.lib.dialogue.rollout import build_specs
from mascot_dag.lib.dialogue.spec import DialogueConfig
from mascot_dag.lib.llm.models import EMBEDDED_MODEL
from mascot_dag.lib.llm.transformers_backend import TransformersChat
from mascot_dag.lib.storage.home import Home
from mascot_dag.lib.types import ChatRequest, SamplingParams

DEFAULT_ED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                          "empatheticdialogues", "valid.csv")


def states(ed_path: str, n: int) -> list[DialogueState]:
    contexts = load_empathetic_dialogues(ed_path).contexts[-n:]  # the file's end: never trained
    cards = load_personas()
    rosters = {s: personas_of_set(cards, s) for s in ("support", "workplace")}
    out = []
    for i, spec in enumerate(build_specs(contexts, rosters, load_user_profiles(), 6, "bench")):
        st = DialogueState(spec)
        st.add("user", "user", spec.context.text, "dataset")
        if i % 2:  # one agent already spoke: the director must pick someone else
            pid = spec.roster[i % len(spec.roster)].persona_id
            st.add("agent", pid, "That sounds really hard. I'm here.", "bench")
        out.append(st)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ed", default=DEFAULT_ED)
    ap.add_argument("--states", type=int, default=32)
    args = ap.parse_args()
    items = states(args.ed, args.states)
    chat = TransformersChat(EMBEDDED_MODEL, Home.from_env().models)
    chat.generate([ChatRequest(({"role": "user", "content": "hi"},), SamplingParams(4))])
    seconds = {}
    for structured in (False, True):
        t0 = time.perf_counter()
        decided = direct_turns(items, chat.generate, DialogueConfig(structured_director=structured))
        seconds[structured] = secs = time.perf_counter() - t0
        status = Counter(d["status"] for d in decided)
        speakers = Counter(d["speaker"] for d in decided)
        actions = [len(d["action"]) for d in decided]
        print(f"{'structured' if structured else 'prompt only':12}: n={len(decided)} "
              f"ok={status['ok']} retried={status['retried']} fallback={status['fallback']} "
              f"speakers={dict(speakers)} mean action chars={sum(actions) / len(actions):.0f} "
              f"wall={secs:.1f} s")
        for d in decided[:3]:
            print(f"    {json.loads(d['raw_output'])['attempts'][0][:160]!r}")
    print(f"structured / prompt-only wall time: {seconds[True] / seconds[False]:.2f}")


if __name__ == "__main__":
    main()
