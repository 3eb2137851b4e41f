"""MBTI user profiles: the packaged file and the user-simulator prompt."""

from __future__ import annotations

import pytest

from mascot_dag.lib.data.users import UserProfileError, load_user_profiles, user_system_prompt


def test_sixteen_distinct_types():
    profiles = load_user_profiles()
    types = {p.type for p in profiles}
    assert len(profiles) == 16
    assert len(types) == 16
    assert {"INTJ", "ESFP", "ISFJ", "ENTP"} <= types
    assert len({p.style for p in profiles}) == 16


def test_prompt_contains_situation_and_style():
    intj = next(p for p in load_user_profiles() if p.type == "INTJ")
    prompt = user_system_prompt(intj, "My  car broke down\n before the interview.")
    assert "My car broke down before the interview." in prompt
    assert intj.style in prompt
    assert "1-2 sentences" in prompt
    assert "seeking support" in prompt
    with pytest.raises(ValueError, match="situation is empty"):
        user_system_prompt(intj, "  ")


def test_bad_profile_file_names_entry(tmp_path):
    bad = tmp_path / "users.yaml"
    bad.write_text("profiles:\n  - type: XXXX\n    style: talks a lot about everything\n")
    with pytest.raises(UserProfileError, match=r"users.yaml: profiles\[0\].*field 'type'"):
        load_user_profiles(bad)
    bad.write_text(
        "profiles:\n  - type: INTJ\n    style: terse and analytical\n" * 1
        + "  - type: INTJ\n    style: terse and analytical again\n"
    )
    with pytest.raises(UserProfileError, match="duplicate MBTI type"):
        load_user_profiles(bad)
    bad.write_text("- just a list\n")
    with pytest.raises(UserProfileError, match="expected a mapping"):
        load_user_profiles(bad)
