"""Persona cards (YAML files under mascot_dag/personas/, or the user's folder) and the system
prompts built from them.

A card file holds one persona set: `set: NAME` and a list `personas:` of 2-8 cards. The packaged
sets are `support` and `workplace`; `MASCOT_PERSONAS_DIR` (`mascot demo --personas DIR`) replaces
them with every *.yaml set of DIR. Validation errors name the file, the persona and the field.
Modes: a set named `workplace` speaks in meetings, the trained set (`trained_set`) in support
contexts; a folder without a `workplace` set lets the trained set speak in meetings too.
Stage 1 aligns `trained_sets` (the setting `train_persona_sets`: one set, named sets or every
set), each in the mode it speaks in (`set_mode`).
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator

PERSONA_DIR = Path(str(resources.files("mascot_dag") / "personas"))
PROMPT_STYLES: tuple[str, ...] = ("zero_shot", "few_shot")
# A roster of one is no group; more than 8 voices is more than a director can tell apart in a
# short dialogue (and than the probe can separate on a few reference utterances each).
MIN_SET, MAX_SET = 2, 8
PACKAGED_SETS = ("support", "workplace")


def persona_dir() -> Path:
    """The persona folder of this process: $MASCOT_PERSONAS_DIR, else the packaged sets."""
    return Path(os.environ.get("MASCOT_PERSONAS_DIR") or PERSONA_DIR)


def trained_set(cards: list[PersonaCard], configured: str = "support") -> str:
    """The set Stage 1 aligns: `configured` when the folder has it; else the first set of the
    folder (file order) that is not `workplace`, so a user's folder with one set just works."""
    sets = list(dict.fromkeys(c.persona_set for c in cards))
    if configured in sets:
        return configured
    others = [s for s in sets if s != "workplace"] or sets
    if not others:
        raise PersonaFileError("no persona sets loaded")
    return others[0]


def mode_sets(cards: list[PersonaCard], configured: str = "support") -> dict[str, str]:
    """{"support": set, "workplace": set}: which set speaks in support contexts and which in
    meetings (the roles the dialogue and chat code read; a set's own mode: `set_mode`)."""
    sets = {c.persona_set for c in cards}
    support = trained_set(cards, configured) if configured != "workplace" else (
        "support" if "support" in sets else trained_set(cards, "support"))
    return {"support": support, "workplace": "workplace" if "workplace" in sets else support}


ALL_SETS = "all"  # train_persona_sets=["all"]: every set of the persona folder


def trained_sets(cards: list[PersonaCard], configured_sets: list[str] | tuple[str, ...] = (),
                 configured: str = "support") -> list[str]:
    """The sets Stage 1 aligns (the setting `train_persona_sets`): [] -> the one `trained_set`
    (`configured` = train_persona_set); ["all"] -> every set of the folder in file order; names
    -> those sets (a name the folder lacks is a PersonaFileError naming the folder's sets)."""
    sets = list(dict.fromkeys(c.persona_set for c in cards))
    if not configured_sets:
        return [trained_set(cards, configured)]
    if list(configured_sets) == [ALL_SETS]:
        return sets
    unknown = [s for s in configured_sets if s not in sets]
    if unknown:
        raise PersonaFileError(f"train_persona_sets: no persona set {', '.join(unknown)} in "
                               f"{persona_dir()} (its sets: {', '.join(sets)}; or ['all'])")
    return list(dict.fromkeys(configured_sets))


def set_mode(cards: list[PersonaCard], persona_set: str) -> str:
    """The mode a set speaks in: "meeting" for the set `mode_sets` gives the workplace role
    (unless it also has the support role), "support" for every other set."""
    roles = mode_sets(cards)
    return ("meeting" if persona_set == roles["workplace"] and persona_set != roles["support"]
            else "support")


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
    if not isinstance(data["set"], str) or not re.fullmatch(r"[a-z][a-z0-9_]*", data["set"]):
        raise PersonaFileError(f"{path}: field 'set': {data['set']!r} is not a slug "
                               "(lowercase letters, digits, _)")
    n = len(data["personas"])
    if not MIN_SET <= n <= MAX_SET:
        raise PersonaFileError(f"{path}: field 'personas': set {data['set']!r} has {n} "
                               f"persona{'s' * (n != 1)}; a set holds {MIN_SET} to {MAX_SET}")
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


def persona_files(directory: str | Path | None = None) -> list[Path]:
    """The set files of a folder (*.yaml and *.yml, sorted; its probe/ subfolder is not a set)."""
    directory = Path(directory or persona_dir())
    if not directory.is_dir():
        raise PersonaFileError(f"{directory}: persona folder not found")
    files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    if not files:
        raise PersonaFileError(f"{directory}: no persona *.yaml files")
    return files


def load_personas_with_files(
    directory: str | Path | None = None,
) -> tuple[list[PersonaCard], dict[str, str]]:
    """Every card of the folder and {persona_id: file name}; a persona id or a set name used in
    two files is an error naming both files."""
    cards: list[PersonaCard] = []
    files: dict[str, str] = {}
    set_file: dict[str, Path] = {}
    for f in persona_files(directory):
        for card in load_persona_file(f):
            if card.persona_id in files:
                raise PersonaFileError(
                    f"{f}: persona {card.persona_id}: field 'persona_id': already used in "
                    f"{files[card.persona_id]} (persona ids are unique across all sets)")
            if set_file.setdefault(card.persona_set, f) != f:
                raise PersonaFileError(f"{f}: field 'set': {card.persona_set!r} is already the "
                                       f"set of {set_file[card.persona_set].name}")
            cards.append(card)
            files[card.persona_id] = f.name
    return cards, files


def load_personas(directory: str | Path | None = None) -> list[PersonaCard]:
    """Every card of `directory` (default: `persona_dir()`)."""
    return load_personas_with_files(directory)[0]


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
