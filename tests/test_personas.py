"""Persona cards: packaged sets load and validate; broken files fail naming file and field."""

from __future__ import annotations

import pytest
import yaml

from mascot_dag.lib.data.personas import (
    PROMPT_STYLES,
    PersonaFileError,
    load_persona_file,
    load_personas,
    personas_of_set,
    system_prompt,
)

SUPPORT_IDS = {"anchor", "catalyst", "beacon", "action_guide"}


def _card(pid: str = "tester", **over) -> dict:
    card = {
        "persona_id": pid,
        "name": "The Tester",
        "role": "a test persona",
        "description": "Exists only to exercise the loader in tests.",
        "behaviours": ["checks things"],
        "avoid": ["guessing"],
        "examples": ["one example", "two examples", "three examples", "four examples"],
    }
    card.update(over)
    return card


def _write(tmp_path, data) -> str:
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_packaged_sets_load_and_are_distinct():
    cards = load_personas()
    support, workplace = personas_of_set(cards, "support"), personas_of_set(cards, "workplace")
    assert {c.persona_id for c in support} == SUPPORT_IDS
    assert len(workplace) == 4
    assert len(cards) == 8
    names = {c.name for c in support}
    assert {"The Anchor", "The Catalyst", "The Beacon", "Action Guide"} == names
    for c in cards:
        assert len(c.examples) >= 4, c.persona_id
        assert len(c.behaviours) >= 3, c.persona_id
    # Voices must not share lines: no example or behaviour is reused across personas.
    examples = [e for c in cards for e in c.examples]
    behaviours = [b for c in cards for b in c.behaviours]
    assert len(set(examples)) == len(examples)
    assert len(set(behaviours)) == len(behaviours)


@pytest.mark.parametrize("style", PROMPT_STYLES)
def test_system_prompt_has_name_and_examples(style):
    cards = load_personas()
    roster = personas_of_set(cards, "support")
    for card in roster:
        prompt = system_prompt(card, style, roster)
        assert card.name in prompt
        assert card.behaviours[0] in prompt
        others = [c.name for c in roster if c is not card]
        assert all(o in prompt for o in others)
        has_examples = all(e in prompt for e in card.examples)
        assert has_examples is (style == "few_shot")


def test_missing_field_names_file_and_field(tmp_path):
    card = _card()
    del card["role"]
    path = _write(tmp_path, {"set": "support", "personas": [card, _card("other")]})
    with pytest.raises(PersonaFileError, match=r"broken\.yaml: persona tester: field 'role'"):
        load_persona_file(path)


def test_too_few_examples(tmp_path):
    path = _write(tmp_path, {"set": "support",
                             "personas": [_card(examples=["only one", "two"]), _card("other")]})
    with pytest.raises(PersonaFileError, match=r"broken\.yaml: persona tester: field 'examples'"):
        load_persona_file(path)


def test_duplicate_id(tmp_path):
    path = _write(tmp_path, {"set": "support", "personas": [_card("twin"), _card("twin")]})
    with pytest.raises(PersonaFileError, match=r"broken\.yaml: duplicate persona_id \['twin'\]"):
        load_persona_file(path)


def test_not_a_mapping(tmp_path):
    path = _write(tmp_path, [_card()])
    with pytest.raises(PersonaFileError, match=r"broken\.yaml: expected a mapping"):
        load_persona_file(path)
    path = _write(tmp_path, {"set": "support", "personas": ["just a string", _card()]})
    with pytest.raises(PersonaFileError, match=r"broken\.yaml: personas\[0\] is not a mapping"):
        load_persona_file(path)


def test_non_utf8_file(tmp_path):
    path = tmp_path / "latin.yaml"
    path.write_bytes("set: support\npersonas:\n  - name: Caf\xe9\n".encode("latin-1"))
    with pytest.raises(PersonaFileError, match=r"latin\.yaml: cannot read persona file"):
        load_persona_file(path)


def test_valid_tmp_card_loads(tmp_path):
    cards = load_persona_file(_write(tmp_path, {"set": "workplace",
                                                "personas": [_card(), _card("other")]}))
    assert [(c.persona_id, c.persona_set) for c in cards] == [("tester", "workplace"),
                                                              ("other", "workplace")]
