"""Which dialogues to run (specs) and how they become DuckDB rows.

Support-mode dialogues come from EmpatheticDialogues contexts with the support roster and a
simulated user (the 16 MBTI profiles, assigned round-robin in context order so every profile is
used as evenly as the data allows); meeting-mode dialogues come from QMSum contexts with the
workplace roster. Seeds derive from the context id only, so every evaluation method sees the same
contexts, users and seeds.

Rows are polars frames (`record_tables`).
"""

from __future__ import annotations

import hashlib

import polars as pl

from mascot_dag.lib.data.personas import PersonaCard
from mascot_dag.lib.data.users import UserProfile
from mascot_dag.lib.dialogue.spec import DialogueRecord, DialogueSpec
from mascot_dag.lib.types import Context

_STR, _INT = pl.String, pl.Int64
DIALOGUE_SCHEMA = {"dialogue_id": _STR, "stage": _STR, "method": _STR, "context_id": _STR,
                   "mode": _STR, "user_profile": _STR, "seed": _INT, "n_turns": _INT,
                   "models": _STR}
TURN_SCHEMA = {"dialogue_id": _STR, "turn_idx": _INT, "role": _STR, "speaker": _STR,
               "text": _STR, "model_used": _STR}
DIRECTIVE_SCHEMA = {"dialogue_id": _STR, "turn_idx": _INT, "speaker": _STR, "action": _STR,
                    "tone": _STR, "status": _STR, "raw_output": _STR}


def context_seed(context_id: str, base: int = 0) -> int:
    return base * 100_003 + int(hashlib.sha256(context_id.encode()).hexdigest()[:7], 16)


def build_specs(
    contexts: list[Context],
    rosters: dict[str, list[PersonaCard]],
    profiles: list[UserProfile],
    n_agent_turns: int,
    prefix: str,
    seed: int = 0,
) -> list[DialogueSpec]:
    specs = []
    support_i = 0
    for c in contexts:
        mode = "support" if c.source == "empatheticdialogues" else "meeting"
        profile = None
        if mode == "support":
            profile = profiles[support_i % len(profiles)] if profiles else None
            support_i += 1
        specs.append(
            DialogueSpec(f"{prefix}:{c.context_id}", c, mode,
                         rosters["support" if mode == "support" else "workplace"], profile,
                         context_seed(c.context_id, seed), n_agent_turns)
        )
    return specs


def record_tables(records: list[DialogueRecord]
                  ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(dialogues, turns, directives) rows of the records, in the tables' column order."""
    dialogues = pl.DataFrame([r.dialogue for r in records], schema=DIALOGUE_SCHEMA)
    turns = pl.DataFrame([t for r in records for t in r.turns], schema=TURN_SCHEMA)
    directives = pl.DataFrame([d for r in records for d in r.directives], schema=DIRECTIVE_SCHEMA)
    return dialogues, turns, directives


def records_from_frames(dialogues, turns, directives) -> list[DialogueRecord]:
    """Rebuild records from the tables (turns in order) for judging and director training.
    Frames are polars; row values come back as Python values (None for NULL)."""
    def by_dialogue(rows) -> dict[str, list[dict]]:
        if rows.is_empty():
            return {}
        return {k: g.sort("turn_idx").to_dicts()
                for (k,), g in rows.group_by("dialogue_id", maintain_order=True)}

    by_turns, by_dir = by_dialogue(turns), by_dialogue(directives)
    return [
        DialogueRecord(row, by_turns.get(did, []), by_dir.get(did, []))
        for row in dialogues.to_dicts()
        for did in [row["dialogue_id"]]
    ]
