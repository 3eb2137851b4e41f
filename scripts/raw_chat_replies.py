"""Regenerate tests/data/raw_chat_replies.jsonl: raw persona-chat replies of the embedded model.

The embedded SmolLM2-135M (transformers backend, CPU) answers as the packaged support roster on
the packaged EmpatheticDialogues contexts, through the chat's own request building
(`direct_turns` + `agent_request`, the embedded profile's DialogueConfig), BEFORE any chat guard:
the transcript the model sees holds `clean_agent_text` of the first sample, as the chat did when
issue 32 was filed. Each agent turn stores `samples`: the first sample and the resamples the
chat would draw (`lib.dialogue.guards.resample_seed`), so tests replay the guards, resampling
included, without the model. One JSON line per conversation.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/raw_chat_replies.py [--conversations 24]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "raw_chat_replies.jsonl"
FOLLOW_UP = "Thanks. What would you do in my place?"


def issue_examples() -> dict:
    """Issue 32's leaks verbatim (a conversation of their own, `source` "issue 32"): "Your Next
    Turn:", the stage direction, the Catalyst's system prompt word for word, a companion
    repeating the previous one, a reply cut mid-sentence, the junk directive."""
    from mascot_dag.lib.data.personas import (
        load_personas,
        mode_sets,
        personas_of_set,
        system_prompt,
    )

    cards = load_personas()
    roster = personas_of_set(cards, mode_sets(cards)["support"])
    catalyst = next(c for c in roster if c.persona_id == "catalyst")
    prompt = system_prompt(catalyst, "zero_shot", roster)
    said = ("I'm sorry you failed again. Feeling stupid after a test is normal, and it does "
            "not say who you are.")
    junk = ("shout out a prayer that you will not lose your job today and that you will not "
            "lose your a")

    def agent(pid: str, samples: list[str], action: str = "comfort them",
              status: str = "ok") -> dict:
        return {"role": "agent", "speaker": pid, "samples": samples,
                "directive": {"action": action, "tone": "warm", "status": status}}

    return {"context_id": "issue32", "source": "issue 32", "turns": [
        {"role": "user", "text": "I failed my driving test again and I feel stupid."},
        agent("anchor", ["Your Next Turn: " + said, "Anchor: I hear you.", "I hear you."]),
        agent("catalyst", [said.replace("does not", "doesn't"),
                           "As the Catalyst finishes speaking, you could respond as the Anchor.",
                           "Book the next test today, and practise the parking twice."]),
        {"role": "user", "text": "I might lose my job if I cannot drive."},
        agent("catalyst", [prompt, prompt[:200] + " Let's make a plan for this week.",
                           "Let's make a plan for this week."], action=junk),
        agent("beacon", ["That fear makes sense, and you have handled hard weeks before. You "
                         "could ask your manager whether a lift or the bus would work until the",
                         "You are not alone in this.", "You are not alone in this."]),
    ]}


def main() -> None:
    from mascot_dag.lib.data.empathetic import load_empathetic_dialogues
    from mascot_dag.lib.data.personas import load_personas, mode_sets, personas_of_set
    from mascot_dag.lib.data.sources import DEMO_ED
    from mascot_dag.lib.dialogue.engine import (
        DialogueState,
        agent_request,
        clean_agent_text,
        direct_turns,
    )
    from mascot_dag.lib.dialogue.guards import RESAMPLES, resample_seed
    from mascot_dag.lib.dialogue.spec import DialogueSpec, config_from_settings
    from mascot_dag.lib.llm.models import EMBEDDED_MODEL, resolve_model
    from mascot_dag.lib.types import Context
    from mascot_dag.profiles import resources_for
    from mascot_dag.resources.llm import TransformersChatResource

    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    cards = load_personas()
    roster = personas_of_set(cards, mode_sets(cards)["support"])
    config = config_from_settings(resources_for("embedded")["settings"])
    models_dir = os.environ.get("MASCOT_MODELS_DIR", str(OUT.parents[2] / ".mascot" / "models"))
    chat = TransformersChatResource(model=resolve_model(EMBEDDED_MODEL, models_dir))
    generate = chat.generate
    contexts = load_empathetic_dialogues(DEMO_ED).contexts[: args.conversations]
    with args.out.open("w") as out:
        out.write(json.dumps(issue_examples()) + "\n")
        for n, ed in enumerate(contexts):
            speaker = [t["text"] for t in ed.turns if t["speaker"] == "speaker"]
            messages = [*speaker[:2], FOLLOW_UP]
            first = messages[0]
            ctx = Context("chat", "empatheticdialogues", "emotional_support", first, first,
                          turns=[{"speaker": "speaker", "text": first}])
            spec = DialogueSpec("chat", ctx, "support", roster, None, n, 10**6)
            st = DialogueState(spec, rng=random.Random(n))
            turns = []
            for msg in messages:
                st.add("user", "user", msg, "human")
                turns.append({"role": "user", "text": msg})
                for _ in range(config.agents_per_round):
                    d = direct_turns([st], generate, config)[0]
                    card = next(c for c in roster if c.persona_id == d["speaker"])
                    req = agent_request(st, card, d, config, len(st.turns))
                    reqs = [req] + [
                        dataclasses.replace(req, sampling=dataclasses.replace(
                            req.sampling, seed=resample_seed(req.sampling.seed, k)))
                        for k in range(1, RESAMPLES + 1)]
                    samples = [r.text for r in generate(reqs)]
                    st.add("agent", card.persona_id, clean_agent_text(samples[0], roster),
                           "base+prompt")
                    st.n_agent += 1
                    turns.append({"role": "agent", "speaker": card.persona_id,
                                  "directive": {k: d[k] for k in ("action", "tone", "status")},
                                  "samples": samples})
            out.write(json.dumps({"context_id": ed.context_id, "turns": turns}) + "\n")
            out.flush()
            print(n, flush=True)


if __name__ == "__main__":
    main()
