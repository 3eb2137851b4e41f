"""Group-aware Stage 1: prompts that show other agents' turns, and the novelty reward on them."""

from __future__ import annotations

import json

import pytest
from test_dialogue import ED, SUPPORT

from mascot_dag.lib.dialogue.engine import opening_agent_messages
from mascot_dag.lib.evaluation.metrics import lexical_overlap, redundancy_lexical
from mascot_dag.lib.stage1.group_history import (
    earlier_column,
    earlier_turns,
    group_agent_messages,
    group_prompts,
    history_sizes,
)
from mascot_dag.lib.stage1.rewards import novelty_reward
from mascot_dag.resources.settings import LineageSettings

POOL = {
    "anchor": ["It makes sense to feel let down after trying so hard.", ""],
    "catalyst": ["What part of the test went wrong this time?"],
    "beacon": ["", "  "],  # nothing usable: never picked
    "action_guide": ["Book two practice lessons on the route before retaking it."],
}


def test_earlier_turns_are_other_personas_distinct_and_deterministic():
    turns = earlier_turns("ed-1", "anchor", 2, POOL, seed=7)
    speakers = [s for s, _ in turns]
    assert len(turns) == 2 and len(set(speakers)) == 2
    assert "anchor" not in speakers and "beacon" not in speakers  # own voice, empty candidates
    assert all(t.strip() and t in POOL[s] for s, t in turns)
    assert turns == earlier_turns("ed-1", "anchor", 2, POOL, seed=7)
    # only two other personas have a usable candidate: asking for three gives two
    assert len(earlier_turns("ed-1", "anchor", 3, POOL, seed=7)) == 2
    draws = {tuple(earlier_turns(f"ed-{i}", "anchor", 1, POOL, seed=7)) for i in range(20)}
    assert len(draws) == 2, "the speaker should vary over contexts"


def test_history_sizes_cycle_and_keep_opening_prompts():
    assert history_sizes(7, 2) == [0, 1, 2, 0, 1, 2, 0]
    assert history_sizes(3, 0) == [0, 0, 0]
    with pytest.raises(ValueError, match="group_history_turns must be >= 0"):
        history_sizes(3, -1)


def test_group_messages_show_the_earlier_turns_in_the_serving_form():
    card = SUPPORT[0]
    assert group_agent_messages(card, ED, SUPPORT, "zero_shot", []) == opening_agent_messages(
        card, ED, SUPPORT, "zero_shot")
    other = next(c for c in SUPPORT if c.persona_id != card.persona_id)
    # the model's own speaker label is cleaned off as the dialogue engine cleans a turn
    earlier = [(other.persona_id, f"{other.name}: What part of the test went wrong?")]
    user = group_agent_messages(card, ED, SUPPORT, "zero_shot", earlier)[-1]["content"]
    transcript = user.split("Conversation so far:\n")[1]
    assert f"{other.name}: What part of the test went wrong?" in transcript
    assert f"{other.name}: {other.name}:" not in transcript
    assert transcript.index("feel so stupid") < transcript.index("What part")
    assert user.endswith(f"Write your next turn as {card.name}.")
    assert json.loads(earlier_column(earlier, SUPPORT)) == ["What part of the test went wrong?"]


def test_group_prompts_cycle_history_and_name_contexts_without_candidates():
    card = SUPPORT[0]
    prompts, earlier = group_prompts(card, SUPPORT, [ED, ED], "zero_shot", 1, 3,
                                     {ED.context_id: POOL})
    assert prompts[0] == opening_agent_messages(card, ED, SUPPORT, "zero_shot")
    assert json.loads(earlier[0]) == [] and len(json.loads(earlier[1])) == 1
    with pytest.raises(ValueError, match=f"none for train contexts \\['{ED.context_id}'\\]"):
        group_prompts(card, SUPPORT, [ED, ED], "zero_shot", 1, 3, {})


def test_novelty_reward_grades_what_a_reply_adds():
    reward = novelty_reward()
    earlier = json.dumps(["I am sorry you failed the test, that is hard."])
    echo, half, new = reward(
        ["I am sorry you failed the test, that is hard.",
         "I am sorry. Which part of the route went wrong?",
         "Which part of your route went wrong? Book a lesson there."],
        earlier_turns=[earlier] * 3)
    assert echo == 0.0 and new == 1.0 and 0.0 < half < 1.0
    # conversational completions, no history (None: not applicable), empty reply
    assert reward([[{"role": "assistant", "content": "Anything."}], ""],
                  earlier_turns=["[]", earlier]) == [None, 0.0]
    # the max over earlier turns: repeating ANY one of them is an echo
    two = json.dumps(["Totally different words here.", "I hear you."])
    assert reward(["I hear you."], earlier_turns=[two]) == [0.0]
    with pytest.raises(ValueError, match="earlier_turns #1 is not a JSON list"):
        reward(["a", "b"], earlier_turns=["[]", "not json"])
    with pytest.raises(ValueError, match="needs the dataset column 'earlier_turns'"):
        reward(["a"])


def test_novelty_can_leave_the_users_topic_words_free():
    reward = novelty_reward()
    earlier = json.dumps(["Failing the driving test is hard. Practise parking every day."])
    replies = ["Failing the driving test is hard.", "Practise parking every day."]
    plain = reward(replies, earlier_turns=[earlier] * 2)
    context = "I failed my driving test today and it is hard."
    free = reward(replies, earlier_turns=[earlier] * 2, shared_context=[context] * 2)
    # naming the user's topic stops counting as an echo; repeating the other agent's advice
    # (not in the context) still does
    assert plain[0] == 0.0 and free[0] > 0.5
    assert plain[1] == free[1] == 0.0
    assert lexical_overlap("a b", ["a b"], shared="") == 1.0


def test_novelty_and_redundancy_measure_the_same_overlap():
    turns = [{"role": "user", "text": "I failed my test."},
             {"role": "agent", "text": "You failed your test, that hurts."},
             {"role": "agent", "text": "That hurts. Try again next month."}]
    texts = [t["text"] for t in turns]
    per_turn = [lexical_overlap(texts[i], texts[:i]) for i in (1, 2)]
    assert redundancy_lexical(turns) == pytest.approx(sum(per_turn) / 2)
    assert lexical_overlap("", texts) is None and lexical_overlap("x", []) is None


def test_settings_refuse_novelty_without_history():
    with pytest.raises(ValueError, match="novelty_reward_weight > 0 needs group_history_turns"):
        LineageSettings(novelty_reward_weight=0.5)
    with pytest.raises(ValueError):
        LineageSettings(group_history_turns=-1)
    ok = LineageSettings(group_history_turns=2, novelty_reward_weight=0.5)
    assert ok.group_history_turns == 2
