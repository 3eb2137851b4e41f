"""The director's contract: directive parsing, the repair retry and the non-looping fallback."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mascot_dag.lib.data.personas import load_personas, personas_of_set
from mascot_dag.lib.dialogue.director import (
    HISTORY_TURNS,
    MAX_ACTION_CHARS,
    MAX_TONE_CHARS,
    SCHEMA_ACTION_CHARS,
    Directive,
    DirectiveError,
    DirectorTurn,
    choose_directive,
    director_messages,
    fallback_speaker,
    parse_directive,
)
from mascot_dag.lib.llm.structured import compile_schema

CARDS = load_personas()
SUPPORT = personas_of_set(CARDS, "support")
WORKPLACE = personas_of_set(CARDS, "workplace")
IDS = [c.persona_id for c in SUPPORT]


def _obj(speaker="anchor", action="validate the feeling", tone="warm") -> str:
    return json.dumps({"speaker": speaker, "action": action, "tone": tone})


def test_valid_json_parses():
    d = parse_directive(_obj("catalyst", "ask  what\nhappened", "curious"), SUPPORT)
    assert d == Directive("catalyst", "ask what happened", "curious")


@pytest.mark.parametrize(
    "speaker,expected",
    [
        ("The Anchor", "anchor"),
        ("anchor", "anchor"),
        ("Anchor", "anchor"),
        ("THE CATALYST", "catalyst"),
        ("Action Guide", "action_guide"),
        ("action_guide", "action_guide"),
        (" the beacon ", "beacon"),
    ],
)
def test_names_resolve_to_ids(speaker, expected):
    assert parse_directive(_obj(speaker), SUPPORT).speaker == expected


def test_workplace_name_differs_from_id():
    assert parse_directive(_obj("The Challenger"), WORKPLACE).speaker == "devils_advocate"
    with pytest.raises(DirectiveError, match="not on the roster"):
        parse_directive(_obj("anchor"), WORKPLACE)  # a support persona is off this roster


def test_json_inside_prose_and_fences():
    text = f"Sure! Here is my directive:\n```json\n{_obj('beacon')}\n```\nHope it helps {{"
    assert parse_directive(text, SUPPORT).speaker == "beacon"
    # prose with stray braces before the object
    text = "I think {maybe} the {best} is: " + _obj("catalyst")
    assert parse_directive(text, SUPPORT).speaker == "catalyst"


def test_nested_braces():
    nested = '{"plan": {"speaker": "anchor", "action": "ground them", "tone": "calm"}}'
    assert parse_directive(nested, SUPPORT).speaker == "anchor"
    with pytest.raises(DirectiveError, match='"action" must be a non-empty string'):
        parse_directive('{"speaker": "anchor", "action": {"x": 1}, "tone": "calm"}', SUPPORT)


@pytest.mark.parametrize(
    "text,reason",
    [
        ("", "no JSON object"),
        ("The Anchor should speak next.", "no JSON object"),
        ('{"speaker": "anchor", "action": "x"', "no JSON object"),  # truncated
        (_obj("the therapist"), "not on the roster"),
        (_obj(""), "non-empty string"),
        ('{"speaker": 3, "action": "a", "tone": "b"}', "non-empty string"),
        (_obj(action="   "), '"action"'),
        ('{"speaker": "anchor", "action": "a"}', '"tone"'),
        ("[" * 100_000, "no JSON object"),
        ("{" * 100_000, "no JSON object"),
        ('{"a":' * 50_000, "no JSON object"),
    ],
)
def test_invalid_outputs_say_why(text, reason):
    with pytest.raises(DirectiveError, match=reason):
        parse_directive(text, SUPPORT)


def test_long_fields_truncated_and_huge_input():
    d = parse_directive(_obj(action="a" * 5000, tone="t" * 500), SUPPORT)
    assert len(d.action) == MAX_ACTION_CHARS and len(d.tone) == MAX_TONE_CHARS
    huge = "x" * 2_000_000 + _obj()
    with pytest.raises(DirectiveError):  # beyond the scanned prefix: rejected, quickly
        parse_directive(huge, SUPPORT)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_text_only_raises_directive_error(text):
    try:
        d = parse_directive(text, SUPPORT)
    except DirectiveError:
        return
    assert d.speaker in IDS and d.action and d.tone


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["speaker", "action", "tone", "Speaker", "x"]), json_values),
    st.text(max_size=30),
    st.text(max_size=30),
)
def test_adversarial_json_objects(obj, before, after):
    text = before + json.dumps(obj) + after
    try:
        d = parse_directive(text, SUPPORT)
    except DirectiveError:
        return
    assert d.speaker in IDS


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(SUPPORT),
    st.text(min_size=1, max_size=50).filter(str.strip),
    st.text(min_size=1, max_size=20).filter(str.strip),
    st.text(max_size=50),
)
def test_valid_directive_with_known_speaker_parses(card, action, tone, prose):
    text = prose.replace("{", "(") + "\n" + _obj(card.name, action, tone)
    d = parse_directive(text, SUPPORT)
    assert d.speaker == card.persona_id
    assert d.action == " ".join(action.split())[:MAX_ACTION_CHARS]


def test_messages_show_roster_context_and_truncated_history():
    history = [{"speaker": "user", "text": f"turn-{i}"} for i in range(HISTORY_TURNS + 4)]
    msgs = director_messages("I lost my job today.", SUPPORT, history, "support", "anchor")
    text = "\n".join(m["content"] for m in msgs)
    for c in SUPPORT:
        assert c.persona_id in text and c.name in text and c.role in text
    assert "I lost my job today." in text
    assert "turn-3" not in text and f"turn-{HISTORY_TURNS + 3}" in text
    assert 'Do not choose "anchor"' in text and "JSON" in text


def test_worked_example_names_the_least_used_allowed_speaker():
    # the 135M director copies the example's speaker: the example follows the fallback rule
    history = [{"speaker": "user", "text": "hi"}, {"speaker": "anchor", "text": "a"},
               {"speaker": "catalyst", "text": "b"}, {"speaker": "user", "text": "c"}]
    for avoid in ("catalyst", None):
        msgs = director_messages("ctx", SUPPORT, history, "support", avoid)
        example = json.loads(msgs[2]["content"])
        assert example["speaker"] == fallback_speaker(SUPPORT, history, len(history), avoid,
                                                      avoid is not None)
        assert example["speaker"] in {"beacon", "action_guide"}  # nobody used twice first


def test_structured_directive_schema_allows_only_valid_speakers():
    turn = DirectorTurn("ctx", SUPPORT, [{"speaker": "anchor", "text": "a"}], "support", 1,
                        last_speaker="anchor", structured=True)
    schema = json.loads(turn.json_schema())
    assert schema["properties"]["speaker"]["enum"] == [i for i in IDS if i != "anchor"]
    template = compile_schema(schema)
    # json.dumps of any allowed directive is exactly what the constrained backend can write
    ok = json.dumps({"speaker": "beacon", "action": "name a strength", "tone": "warm"})
    assert template.pattern().fullmatch(ok) and parse_directive(ok, SUPPORT).speaker == "beacon"
    for bad in (_obj("anchor"), json.dumps({"speaker": "beacon", "action": "x" *
                                            (SCHEMA_ACTION_CHARS + 1), "tone": "warm"})):
        assert template.pattern().fullmatch(bad) is None
    # the longest allowed directive fits the turn's budget (a 48-token cap cut long actions)
    longest = json.dumps({"speaker": "action_guide", "action": "x" * SCHEMA_ACTION_CHARS,
                          "tone": "y" * 20})
    assert template.pattern().fullmatch(longest) and turn.max_new_tokens(48) >= len(longest)
    assert DirectorTurn("ctx", SUPPORT, [], "support", 0).max_new_tokens(48) == 48
    # unconstrained turns send no schema; a repeat-allowed turn offers the whole roster
    assert DirectorTurn("ctx", SUPPORT, [], "support", 0).json_schema() is None
    free = DirectorTurn("ctx", SUPPORT, [], "support", 0, "anchor", no_repeat=False,
                        structured=True)
    assert json.loads(free.json_schema())["properties"]["speaker"]["enum"] == IDS


def _garbage(_messages):
    return "I am not JSON at all"


def test_garbage_generator_rotates_through_roster():
    history: list[dict] = [{"speaker": "user", "text": "hi"}]
    last = None
    picked = []
    for turn_idx in range(1, 13):
        choice = choose_directive(
            _garbage,
            "ctx",
            SUPPORT,
            history,
            "support",
            turn_idx=turn_idx,
            last_speaker=last,
            no_repeat=True,
        )
        assert choice.status == "fallback" and len(choice.raw_outputs) == 2
        assert "no JSON object" in choice.errors[0]
        card = next(c for c in SUPPORT if c.persona_id == choice.directive.speaker)
        assert choice.directive.action in card.behaviours  # the fallback stays in role
        picked.append(choice.directive.speaker)
        history.append({"speaker": choice.directive.speaker, "text": "..."})
        last = choice.directive.speaker
    # 12 turns over 4 personas: each speaks exactly 3 times, never twice in a row
    assert sorted(picked) == sorted(IDS * 3)
    assert all(a != b for a, b in zip(picked, picked[1:], strict=False))


def test_retry_gets_repair_message_and_counts_as_retried():
    seen = []

    def gen(messages):
        seen.append(messages)
        return "nope" if len(seen) == 1 else _obj("beacon")

    choice = choose_directive(gen, "ctx", SUPPORT, [], "support", turn_idx=0)
    assert (choice.status, choice.directive.speaker) == ("retried", "beacon")
    assert len(seen) == 2 and "invalid" in seen[1][-1]["content"]
    assert seen[1][-2] == {"role": "assistant", "content": "nope"}


def test_repeated_speaker_is_invalid_when_no_repeat():
    choice = choose_directive(
        lambda m: _obj("anchor"),
        "ctx",
        SUPPORT,
        [{"speaker": "anchor", "text": "x"}],
        "support",
        turn_idx=1,
        last_speaker="anchor",
        no_repeat=True,
    )
    assert choice.status == "fallback" and choice.directive.speaker != "anchor"
    assert "spoke last" in choice.errors[0]
    ok = choose_directive(
        lambda m: _obj("anchor"),
        "ctx",
        SUPPORT,
        [],
        "support",
        turn_idx=1,
        last_speaker="anchor",
        no_repeat=False,
    )
    assert (ok.status, ok.directive.speaker) == ("ok", "anchor")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(CARDS), min_size=2, max_size=8, unique_by=lambda c: c.persona_id),
    st.lists(st.integers(0, 20), max_size=15),
    st.integers(0, 50),
    st.sampled_from(["garbage", "repeat", "offroster"]),
)
def test_fallback_never_repeats(roster, hist_idx, turn_idx, failure):
    ids = [c.persona_id for c in roster]
    history = [{"speaker": ids[i % len(ids)] if i < 15 else "user", "text": "x"} for i in hist_idx]
    last = next((h["speaker"] for h in reversed(history) if h["speaker"] in ids), ids[0])
    outputs = {"garbage": "}{", "repeat": _obj(last), "offroster": _obj("nobody_here")}

    choice = choose_directive(
        lambda m: outputs[failure],
        "ctx",
        roster,
        history,
        "support",
        turn_idx=turn_idx,
        last_speaker=last,
        no_repeat=True,
    )
    assert choice.status == "fallback"
    assert choice.directive.speaker in ids and choice.directive.speaker != last
    direct = fallback_speaker(roster, history, turn_idx, last, True)
    assert direct == choice.directive.speaker
    counts = {p: sum(h["speaker"] == p for h in history) for p in ids}
    assert counts[direct] == min(v for p, v in counts.items() if p != last)
