"""Simulated users for group rollouts: the 16 MBTI-style profiles in mascot_dag/users/mbti.yaml.

A profile is a talking style; `user_system_prompt` turns a profile plus a situation (an ED
situation or a meeting topic) into the system prompt of the model that plays the person seeking
support, so rollouts see varied, human-like user turns instead of one generic voice.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, Field, ValidationError

USERS_FILE = Path(str(resources.files("mascot_dag") / "users" / "mbti.yaml"))
MBTI_PATTERN = r"^[EI][NS][TF][JP]$"


class UserProfile(BaseModel):
    type: str = Field(pattern=MBTI_PATTERN, description="MBTI type, e.g. INTJ")
    style: str = Field(min_length=10, description="how this person talks about a problem")


class UserProfileError(ValueError):
    pass


def load_user_profiles(path: str | Path = USERS_FILE) -> list[UserProfile]:
    """All profiles of the file, in file order; errors name the file, the entry and the field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UserProfileError(f"{path}: cannot read user profiles: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("profiles"), list):
        raise UserProfileError(f"{path}: expected a mapping with a list 'profiles'")
    profiles: list[UserProfile] = []
    for i, raw in enumerate(data["profiles"]):
        if not isinstance(raw, dict):
            raise UserProfileError(f"{path}: profiles[{i}] is not a mapping")
        try:
            profiles.append(UserProfile(**raw))
        except ValidationError as exc:
            fields = "; ".join(
                f"field '{'.'.join(map(str, e['loc']))}': {e['msg']}" for e in exc.errors()
            )
            raise UserProfileError(f"{path}: profiles[{i}] ({raw.get('type')}): {fields}") from exc
    types = [p.type for p in profiles]
    dupes = sorted({t for t in types if types.count(t) > 1})
    if dupes:
        raise UserProfileError(f"{path}: duplicate MBTI type {dupes}")
    return profiles


def user_system_prompt(profile: UserProfile, situation: str) -> str:
    """System prompt for the model that plays the user (the person seeking support)."""
    situation = " ".join(situation.split())
    if not situation:
        raise ValueError("user_system_prompt: situation is empty")
    return "\n".join(
        [
            "You are role-playing a real person talking to a group of supportive companions.",
            f"Your situation: {situation}",
            f"Your personality type is {profile.type}. How you talk: {profile.style}",
            "Speak in the first person as the person seeking support, never as a helper.",
            "Reply to what the companions just said with 1-2 sentences in your own style.",
        ]
    )
