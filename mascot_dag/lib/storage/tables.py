"""Conversions between lib objects and DuckDB rows (JSON columns serialised here, once)."""

from __future__ import annotations

import json
from dataclasses import asdict

import polars as pl

from mascot_dag.lib.data.personas import PersonaCard
from mascot_dag.lib.types import Context, Score

CONTEXT_JSON_COLUMNS = ("turns", "queries")


def contexts_frame(contexts: list[Context]) -> pl.DataFrame:
    rows = []
    for c in contexts:
        row = asdict(c)
        for col in CONTEXT_JSON_COLUMNS:
            row[col] = json.dumps(row[col], ensure_ascii=False)
        rows.append(row)
    # Every field is text (JSON for the lists); an explicit schema also fixes the column order.
    return pl.DataFrame(rows, schema=dict.fromkeys(Context.__dataclass_fields__, pl.String))


def context_from_row(row: dict) -> Context:
    data = {k: row.get(k) for k in Context.__dataclass_fields__}
    for col in CONTEXT_JSON_COLUMNS:
        val = data.get(col)
        data[col] = json.loads(val) if isinstance(val, str) else (val or [])
    return Context(**data)


def personas_frame(cards: list[PersonaCard], source_files: dict[str, str]) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {
                **c.model_dump(exclude={"behaviours", "avoid", "examples"}),
                "behaviours": json.dumps(c.behaviours),
                "avoid": json.dumps(c.avoid),
                "examples": json.dumps(c.examples),
                "source_file": source_files.get(c.persona_id, ""),
            }
            for c in cards
        ]
    )


def card_from_row(row: dict) -> PersonaCard:
    return PersonaCard(
        persona_id=row["persona_id"],
        persona_set=row["persona_set"],
        name=row["name"],
        role=row["role"],
        description=row["description"],
        behaviours=json.loads(row["behaviours"]),
        avoid=json.loads(row["avoid"]),
        examples=json.loads(row["examples"]),
    )


def score_rows(scores: list[Score], **keys) -> list[dict]:
    """Long-format judgment rows: one per criterion, keys (target, judge, ...) repeated."""
    return [
        {
            **keys,
            "criterion": s.criterion,
            "score": s.score,
            "rationale": s.rationale,
            "status": s.status,
            "raw_output": s.raw_output,
        }
        for s in scores
    ]
