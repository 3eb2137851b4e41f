"""Stage 1 preference data: prompts of the policy and of the reward model, and pair building."""

from __future__ import annotations

import pandas as pd
import pytest

from mascot_dag.lib.personas import load_personas, personas_of_set, system_prompt
from mascot_dag.lib.preferences import (
    candidate_messages,
    make_pairs,
    persona_tag,
    reward_messages,
)
from mascot_dag.lib.types import Context

CONTEXT = Context(
    context_id="ed:1",
    source="empatheticdialogues",
    domain="emotional_support",
    split="train",
    text="I failed my driving test again.",
    situation="I failed my driving test for the second time.",
    turns=[{"speaker": "speaker", "text": "I feel like giving up."}],
)


def test_reward_prompt_names_the_persona_and_is_much_shorter_than_the_policy_prompt():
    cards = personas_of_set(load_personas(), "support")
    anchor = next(c for c in cards if c.persona_id == "anchor")
    rm = reward_messages(persona_tag(anchor), CONTEXT)
    policy = candidate_messages(system_prompt(anchor, "few_shot", cards), CONTEXT)

    assert rm[0] == {"role": "system", "content": "Persona: The Anchor, an emotional validator."}
    # The seeker's words are the same for the policy and the reward model.
    assert rm[1] == policy[1]
    assert "I feel like giving up." in rm[1]["content"]
    assert len(rm[0]["content"]) * 10 < len(policy[0]["content"])
    # Different personas give different reward prompts (the RM is trained across all of them).
    tags = {persona_tag(c) for c in cards}
    assert len(tags) == len(cards)


def test_pairs_keep_every_gap_of_at_least_delta_and_orient_chosen_above_rejected():
    cands = pd.DataFrame(
        {
            "candidate_id": ["a", "b", "c", "d"],
            "context_id": ["x", "x", "x", "y"],
            "persona_id": ["anchor"] * 4,
        }
    )
    scores = pd.DataFrame({"target_id": ["a", "b", "c", "d"], "mean_score": [4.0, 2.0, 3.8, 1.0]})
    pairs = make_pairs(cands, scores, delta=0.5)
    # a-b (2.0) and c-b (1.8) qualify; a-c (0.2) does not; d is alone in its context.
    got = sorted(zip(pairs.chosen_id, pairs.rejected_id, pairs.margin.round(2), strict=True))
    assert got == [("a", "b", 2.0), ("c", "b", 1.8)]
    assert (pairs.chosen_score > pairs.rejected_score).all()
    with pytest.raises(ValueError, match="delta must be > 0"):
        make_pairs(cands, scores, delta=0)
