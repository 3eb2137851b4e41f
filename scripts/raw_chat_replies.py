"""Regenerate tests/data/raw_chat_replies.jsonl: raw persona-chat replies of the embedded model.

The embedded SmolLM2-135M (transformers backend, CPU) answers as the packaged support roster on
the packaged EmpatheticDialogues contexts, through the chat's own request building
(`direct_turns` + `agent_request`, the embedded profile's DialogueConfig), BEFORE any chat guard:
the transcript the model sees holds `clean_agent_text` of the first sample, as the chat did when
issue 32 was filed. Each agent turn stores `samples`: the first sample and the resamples the
chat would draw (`lib.dialogue.guards.resample_seed`), so tests replay the guards, resampling
included, without the model. One JSON line per conversation.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/raw_chat_replies.py [--conversations 30]
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


def main() -> None:
    from mascot_dag.lib.data.empathetic import load_empathetic_dialogues
    from mascot_dag.lib.data.personas import load_personas, mode_sets, personas_of_set
    from mascot_dag.lib.data.sources import DEMO_ED
    from mascot_dag.lib.dialogue.engine import (
        DialogueState, agent_request, clean_agent_text, direct_turns)
    from mascot_dag.lib.dialogue.guards import RESAMPLES, resample_seed
    from mascot_dag.lib.dialogue.spec import DialogueSpec, config_from_settings
    from mascot_dag.lib.llm.models import EMBEDDED_MODEL, resolve_model
    from mascot_dag.lib.types import Context
    from mascot_dag.profiles import resources_for
    from mascot_dag.resources.llm import TransformersChatResource

    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=30)
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
        for n, ed in enumerate(contexts):
            speaker = [t["text"] for t in ed.turns if t["speaker"] == "speaker"]
            messages = [speaker[0], speaker[1] if len(speaker) > 1 else FOLLOW_UP]
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
