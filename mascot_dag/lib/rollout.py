"""Which dialogues to run (specs) and how they become DuckDB rows.

Support-mode dialogues come from EmpatheticDialogues contexts with the support roster and a
simulated user (the 16 MBTI profiles, assigned round-robin in context order so every profile is
used as evenly as the data allows); meeting-mode dialogues come from QMSum contexts with the
workplace roster. Seeds derive from the context id only, so every evaluation method sees the same
contexts, users and seeds.
"""

from __future__ import annotations

import hashlib

import pandas as pd

from mascot_dag.lib.dialogue import DialogueRecord, DialogueSpec
from mascot_dag.lib.personas import PersonaCard
from mascot_dag.lib.types import Context
from mascot_dag.lib.users import UserProfile

DIALOGUE_COLUMNS = ["dialogue_id", "stage", "method", "context_id", "mode", "user_profile",
                    "seed", "n_turns", "models"]
TURN_COLUMNS = ["dialogue_id", "turn_idx", "role", "speaker", "text", "model_used"]
DIRECTIVE_COLUMNS = ["dialogue_id", "turn_idx", "speaker", "action", "tone", "status", "raw_output"]


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


def record_frames(records: list[DialogueRecord]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    dialogues = pd.DataFrame([r.dialogue for r in records], columns=DIALOGUE_COLUMNS)
    turns = pd.DataFrame([t for r in records for t in r.turns], columns=TURN_COLUMNS)
    directives = pd.DataFrame([d for r in records for d in r.directives], columns=DIRECTIVE_COLUMNS)
    return dialogues, turns, directives


def records_from_frames(
    dialogues: pd.DataFrame, turns: pd.DataFrame, directives: pd.DataFrame
) -> list[DialogueRecord]:
    """Rebuild records from the tables (turns in order) for judging and director training."""
    by_turns = {k: g.sort_values("turn_idx").to_dict("records") for k, g in turns.groupby("dialogue_id")}
    by_dir = {k: g.sort_values("turn_idx").to_dict("records")
              for k, g in directives.groupby("dialogue_id")} if len(directives) else {}
    return [
        DialogueRecord(row, by_turns.get(row["dialogue_id"], []), by_dir.get(row["dialogue_id"], []))
        for row in dialogues.to_dict("records")
    ]
