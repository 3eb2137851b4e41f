"""Stage 1 preference data: prompts of the policy and of the reward model, and pair building."""

from __future__ import annotations

import polars as pl
import pytest

from mascot_dag.lib.data.personas import load_personas, personas_of_set
from mascot_dag.lib.dialogue.engine import agent_messages, opening_agent_messages
from mascot_dag.lib.stage1.preferences import (
    best_per_context,
    candidate_seed,
    make_pairs,
    mean_scores,
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
    policy = opening_agent_messages(anchor, CONTEXT, cards, "few_shot")

    assert rm[0] == {"role": "system", "content": "Persona: The Anchor, an emotional validator."}
    # The seeker's words reach both the policy and the reward model.
    assert "I feel like giving up." in rm[1]["content"]
    assert "I feel like giving up." in policy[1]["content"]
    assert len(rm[0]["content"]) * 10 < len(policy[0]["content"])
    # Different personas give different reward prompts (the RM is trained across all of them).
    tags = {persona_tag(c) for c in cards}
    assert len(tags) == len(cards)


def test_pairs_keep_every_gap_of_at_least_delta_and_orient_chosen_above_rejected():
    cands = pl.DataFrame(
        {
            "candidate_id": ["a", "b", "c", "d"],
            "context_id": ["x", "x", "x", "y"],
            "persona_id": ["anchor"] * 4,
        }
    )
    scores = pl.DataFrame({"target_id": ["a", "b", "c", "d"], "mean_score": [4.0, 2.0, 3.8, 1.0]})
    pairs = make_pairs(cands, scores, delta=0.5)
    # a-b (2.0) and c-b (1.8) qualify; a-c (0.2) does not; d is alone in its context.
    got = sorted(pairs.select("chosen_id", "rejected_id", pl.col("margin").round(2)).rows())
    assert got == [("a", "b", 2.0), ("c", "b", 1.8)]
    assert (pairs["chosen_score"] > pairs["rejected_score"]).all()
    none = make_pairs(cands, scores, delta=5.0)
    assert none.is_empty() and none.columns[-1] == "margin"
    with pytest.raises(ValueError, match="delta must be > 0"):
        make_pairs(cands, scores, delta=0)


def test_stage1_prompt_is_the_dialogue_agent_request():
    """Stage 1 trains on the request an adapter serves in: the first agent request of a
    dialogue (persona system prompt, context, transcript with the seeker's opening, the ask)."""
    cards = personas_of_set(load_personas(), "support")
    anchor = cards[0]
    opening = opening_agent_messages(anchor, CONTEXT, cards, "zero_shot")
    served = agent_messages(anchor, CONTEXT,
                            [{"speaker": "user", "text": "I feel like giving up."}],
                            cards, "zero_shot")
    assert opening == list(served)
    assert opening[1]["content"].endswith(f"Write your next turn as {anchor.name}.")


def judgments(rows):
    return pl.DataFrame(
        [{"target_id": t, "persona_id": p, "judge": "j", "criterion": c, "score": s,
          "status": "ok"} for t, p, c, s in rows]
    )


def test_persona_weight_ranks_on_persona_fidelity():
    # a: persona-faithful but less relevant; b: relevant but generic
    j = judgments([("a", "anchor", "consistency", 5.0), ("a", "anchor", "response_relevance", 2.0),
                   ("b", "anchor", "consistency", 1.0), ("b", "anchor", "response_relevance", 5.0)])
    plain = dict(mean_scores(j, persona_weight=0.5).select("target_id", "mean_score").rows())
    assert plain["a"] == pytest.approx(3.5) and plain["b"] == pytest.approx(3.0)
    heavy = dict(mean_scores(j, persona_weight=0.8).select("target_id", "mean_score").rows())
    assert heavy["a"] - heavy["b"] > plain["a"] - plain["b"]
    # failed judgments and NaN scores never count; n_scores counts the ok ones
    noisy = pl.concat([j, pl.DataFrame([
        {"target_id": "a", "persona_id": "anchor", "judge": "k", "criterion": "consistency",
         "score": None, "status": "failed"},
        {"target_id": "a", "persona_id": "anchor", "judge": "k", "criterion": "consistency",
         "score": float("nan"), "status": "ok"}])])
    again = mean_scores(noisy, persona_weight=0.5).filter(pl.col("target_id") == "a")
    assert again["mean_score"].item() == pytest.approx(3.5) and again["n_scores"].item() == 2
    with pytest.raises(ValueError, match="persona_weight"):
        mean_scores(j, persona_weight=1.5)


def test_cross_persona_pool_puts_another_personas_voice_on_the_rejected_side():
    cands = pl.DataFrame({
        "candidate_id": ["x|anchor|0", "x|anchor|1", "x|catalyst|0", "y|anchor|0"],
        "context_id": ["x", "x", "x", "y"],
        "persona_id": ["anchor", "anchor", "catalyst", "anchor"],
    })
    # every candidate judged AS anchor (and the catalyst one also as catalyst: must be ignored)
    scores = pl.DataFrame({
        "target_id": ["x|anchor|0", "x|anchor|1", "x|catalyst|0", "y|anchor|0", "x|catalyst|0"],
        "persona_id": ["anchor", "anchor", "anchor", "anchor", "catalyst"],
        "mean_score": [4.0, 3.9, 2.0, 3.0, 5.0],
    })
    pairs = make_pairs(cands, scores, delta=0.5, persona="anchor")
    got = sorted(pairs.select("chosen_id", "rejected_id").rows())
    assert got == [("x|anchor|0", "x|catalyst|0"), ("x|anchor|1", "x|catalyst|0")]
    assert set(pairs["persona_id"]) == {"anchor"}
    capped = make_pairs(cands, scores, delta=0.5, persona="anchor", max_per_context=1)
    assert capped["chosen_id"].to_list() == ["x|anchor|0"]  # the largest margin is kept
    best = best_per_context(cands, scores, "anchor")
    assert best.select("context_id", "candidate_id").rows() == [
        ("x", "x|anchor|0"), ("y", "y|anchor|0")]


def test_candidate_seeds_differ_between_personas():
    seeds = {candidate_seed(0, p, k) for p in range(4) for k in range(8)}
    assert len(seeds) == 32
    assert candidate_seed(0, 1, 2) == candidate_seed(0, 1, 2)
