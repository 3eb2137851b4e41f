"""Hierarchical group dialogue with the real tiny model (SmolLM2-135M), batched in lockstep."""

from __future__ import annotations

import json

import pytest

from mascot_dag.lib.data.personas import load_personas, personas_of_set
from mascot_dag.lib.data.users import load_user_profiles
from mascot_dag.lib.dialogue.engine import GENERIC_SYSTEM, blocks, clean_agent_text, run_dialogues
from mascot_dag.lib.dialogue.spec import DialogueConfig, DialogueSpec
from mascot_dag.lib.types import Context

CARDS = load_personas()
SUPPORT = personas_of_set(CARDS, "support")
WORKPLACE = personas_of_set(CARDS, "workplace")
PROFILES = {p.type: p for p in load_user_profiles()}

ED = Context(
    context_id="ed-1",
    source="empatheticdialogues",
    domain="emotional_support",
    situation="I failed my driving test for the third time.",
    text="Situation: I failed my driving test for the third time.\n"
    "Speaker: I failed again today and I feel so stupid.",
    turns=[{"speaker": "speaker", "text": "I failed again today and I feel so stupid."}],
)
MEETING = Context(
    context_id="qm-1",
    source="qmsum",
    domain="product",
    situation="remote control design",
    text="PM: We need to decide on the remote's buttons.\nUI: Fewer buttons are easier.",
    topic="remote control design",
    queries=[{"query": "What did the group decide about the buttons?", "answer": "fewer"}],
)


class Recorder:
    """Records every request batch, then calls the real model: lets tests see the prompts."""

    def __init__(self, chat):
        self.chat = chat
        self.calls: list[list] = []

    def generate(self, requests):
        self.calls.append(list(requests))
        return self.chat.generate(requests)


@pytest.fixture(scope="module")
def chat(base_model_path):
    from mascot_dag.lib.llm.transformers_backend import TransformersChat

    return TransformersChat(base_model_path, models_dir=".", batch_size=8)


# Shrunk for CPU speed: 3 agent turns, 16-token agent/user turns; the director keeps 40 tokens
# because a directive JSON is ~20-30 tokens and a shorter budget would always truncate it.
FAST = dict(
    max_new_tokens_agent=16,
    max_new_tokens_user=16,
    max_new_tokens_director=40,
    prompt_style="zero_shot",
)


def _check_common(rec, spec, roster_ids):
    agent_turns = [t for t in rec.turns if t["role"] == "agent"]
    assert len(agent_turns) == spec.n_agent_turns
    assert [t["turn_idx"] for t in rec.turns] == list(range(len(rec.turns)))
    assert all(t["speaker"] in roster_ids for t in agent_turns)
    assert all(t["dialogue_id"] == spec.dialogue_id for t in rec.turns)
    speakers = [t["speaker"] for t in agent_turns]
    assert all(a != b for a, b in zip(speakers, speakers[1:], strict=False))
    assert rec.dialogue["n_turns"] == len(rec.turns)
    assert json.loads(rec.dialogue["models"])["speaker_policy"]


def test_support_dialogues_with_director(chat):
    rec_chat = Recorder(chat)
    specs = [
        DialogueSpec(f"d{i}", ED, "support", SUPPORT, PROFILES[t], seed=i, n_agent_turns=3)
        for i, t in enumerate(["INTJ", "ESFP"])
    ]
    records = run_dialogues(specs, rec_chat, DialogueConfig(**FAST))
    ids = {c.persona_id for c in SUPPORT}
    for rec, spec in zip(records, specs, strict=True):
        _check_common(rec, spec, ids)
        assert rec.turns[0]["text"] == "I failed again today and I feel so stupid."
        # 3 agents with agents_per_round=2: user, a, a, user(simulated), a
        assert [t["role"] for t in rec.turns] == ["user", "agent", "agent", "user", "agent"]
        assert rec.turns[3]["model_used"] == "base+user" and rec.turns[3]["speaker"] == "user"
        agent_idx = [t["turn_idx"] for t in rec.turns if t["role"] == "agent"]
        assert [d["turn_idx"] for d in rec.directives] == agent_idx
        for d in rec.directives:
            assert d["status"] in {"ok", "retried", "fallback"} and d["action"] and d["tone"]
            turn = rec.turns[d["turn_idx"]]
            assert turn["speaker"] == d["speaker"] and turn["model_used"] == "base+prompt"
            assert json.loads(d["raw_output"])["attempts"]
        assert rec.dialogue["user_profile"] in {"INTJ", "ESFP"}
    # lockstep: each director round batches both dialogues; agents get their directive
    assert all(len(call) == 2 for call in rec_chat.calls[:1])
    agent_reqs = [
        r
        for call in rec_chat.calls
        for r in call
        if "Your director asks you to:" in r.messages[0]["content"]
    ]
    assert len(agent_reqs) == 6
    assert all(any(c.name in r.messages[0]["content"] for c in SUPPORT) for r in agent_reqs)
    user_systems = [
        r.messages[0]["content"]
        for call in rec_chat.calls
        for r in call
        if "seeking support" in r.messages[0]["content"]
    ]
    assert len(user_systems) == 2
    assert any(PROFILES["INTJ"].style in s for s in user_systems)


def test_meeting_random_policy_and_no_grounding(chat):
    rec_chat = Recorder(chat)
    spec = DialogueSpec("m0", MEETING, "meeting", WORKPLACE, None, seed=7, n_agent_turns=3)
    config = DialogueConfig(speaker_policy="random", persona_grounding=False, **FAST)
    (rec,) = run_dialogues([spec], rec_chat, config, stage="eval", method="mascot_p_c")
    _check_common(rec, spec, {c.persona_id for c in WORKPLACE})
    assert rec.turns[0]["speaker"] == "moderator"
    assert rec.turns[0]["text"] == "What did the group decide about the buttons?"
    assert all(t["role"] == "agent" for t in rec.turns[1:])  # no user in meetings
    assert rec.directives == []  # no director
    assert len(rec_chat.calls) == 3  # one agent call per turn, no director or user calls
    systems = {r.messages[0]["content"] for call in rec_chat.calls for r in call}
    assert systems == {GENERIC_SYSTEM}
    assert all(t["model_used"] == "base+generic" for t in rec.turns[1:])
    assert (rec.dialogue["stage"], rec.dialogue["method"]) == ("eval", "mascot_p_c")
    # the same seed gives the same dialogue
    (again,) = run_dialogues([spec], chat, config, stage="eval", method="mascot_p_c")
    assert [t["text"] for t in again.turns] == [t["text"] for t in rec.turns]


def test_clean_agent_text():
    text = "The Anchor: That sounds hard.\nI'm here.\nThe Catalyst: What if we looked at it?"
    assert clean_agent_text(text, SUPPORT) == "That sounds hard.\nI'm here."
    assert clean_agent_text("**Anchor**: hi\nUser: thanks", SUPPORT) == "hi"
    assert clean_agent_text("User: I feel bad", SUPPORT) == "I feel bad"
    assert clean_agent_text("Note: keep breathing.", SUPPORT) == "Note: keep breathing."


def test_blocks():
    turns = [{"speaker": "user", "text": str(i)} for i in range(9)]
    assert [len(b) for b in blocks(turns, 4)] == [4, 4]
    assert blocks(turns, 4)[1][0]["text"] == "4"
    assert [len(b) for b in blocks(turns[:3], 4)] == [3]
    assert blocks([], 4) == []
    with pytest.raises(ValueError):
        blocks(turns, 0)
