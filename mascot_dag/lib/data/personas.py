"""Persona cards (YAML files under mascot_dag/personas/) and the system prompts built from them.

A card file holds one persona set: `set: support|workplace` and a list `personas:` of cards.
Validation errors name the file, the persona and the field.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator

PERSONA_DIR = Path(str(resources.files("mascot_dag") / "personas"))
PROMPT_STYLES: tuple[str, ...] = ("zero_shot", "few_shot")


class PersonaCard(BaseModel):
    persona_id: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="slug, e.g. anchor")
    persona_set: str = ""
    name: str = Field(min_length=1)
    role: str = Field(min_length=1)
    description: str = Field(min_length=10)
    behaviours: list[str] = Field(min_length=1)
    avoid: list[str] = Field(min_length=1)
    examples: list[str] = Field(min_length=3)

    @field_validator("behaviours", "avoid", "examples")
    @classmethod
    def _no_empty_items(cls, v: list[str]) -> list[str]:
        if any(not s or not s.strip() for s in v):
            raise ValueError("items must be non-empty strings")
        return [s.strip() for s in v]


class PersonaFileError(ValueError):
    pass


def load_persona_file(path: str | Path) -> list[PersonaCard]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PersonaFileError(f"{path}: cannot read persona file: {exc}") from exc
    if (not isinstance(data, dict) or "set" not in data
            or not isinstance(data.get("personas"), list)):
        raise PersonaFileError(f"{path}: expected a mapping with 'set' and a list 'personas'")
    cards = []
    for i, raw in enumerate(data["personas"]):
        if not isinstance(raw, dict):
            raise PersonaFileError(f"{path}: personas[{i}] is not a mapping")
        try:
            cards.append(PersonaCard(**{**raw, "persona_set": data["set"]}))
        except ValidationError as exc:
            where = raw.get("persona_id") or raw.get("name") or f"personas[{i}]"
            fields = "; ".join(
                f"field '{'.'.join(str(p) for p in e['loc'])}': {e['msg']}" for e in exc.errors()
            )
            raise PersonaFileError(f"{path}: persona {where}: {fields}") from exc
    ids = [c.persona_id for c in cards]
    dupes = {x for x in ids if ids.count(x) > 1}
    if dupes:
        raise PersonaFileError(f"{path}: duplicate persona_id {sorted(dupes)}")
    return cards


def load_personas(directory: str | Path = PERSONA_DIR) -> list[PersonaCard]:
    files = sorted(Path(directory).glob("*.yaml"))
    if not files:
        raise PersonaFileError(f"{directory}: no persona *.yaml files")
    cards = [c for f in files for c in load_persona_file(f)]
    ids = [c.persona_id for c in cards]
    dupes = {x for x in ids if ids.count(x) > 1}
    if dupes:
        raise PersonaFileError(f"{directory}: persona_id used in several files: {sorted(dupes)}")
    return cards


def personas_of_set(cards: list[PersonaCard], persona_set: str) -> list[PersonaCard]:
    return [c for c in cards if c.persona_set == persona_set]


def system_prompt(card: PersonaCard, style: str, roster: list[PersonaCard] | None = None) -> str:
    """The persona's system prompt for a prompting style.

    zero_shot: who you are, what you do and avoid. few_shot: the same plus the card's example
    utterances. Both ask for one short turn in the persona's own voice, never another agent's.
    """
    if style not in PROMPT_STYLES:
        raise ValueError(f"unknown prompt style {style!r}; known: {PROMPT_STYLES}")
    others = [c.name for c in (roster or []) if c.persona_id != card.persona_id]
    lines = [
        f"You are {card.name}, {card.role}. {card.description}",
        "Do: " + "; ".join(card.behaviours) + ".",
        "Avoid: " + "; ".join(card.avoid) + ".",
    ]
    if others:
        lines.append(f"Other companions in the group: {', '.join(others)}. "
                     "Speak only for yourself.")
    if style == "few_shot":
        lines.append("Examples of how you speak:")
        lines += [f"- {e}" for e in card.examples]
    lines.append("Reply with one short turn (2-3 sentences) in your own voice.")
    return "\n".join(lines)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
