"""A/B of one method across two DuckDB files (lib.ab): real DuckDB files written through the
store's own replace path, read back read-only."""

from __future__ import annotations

import os

import numpy as np
import polars as pl
import pytest

from mascot_dag.lib.evaluation.ab import compare, load_scores, per_context
from mascot_dag.lib.evaluation.champion import PERSONA_CRITERIA
from mascot_dag.lib.storage.db import replace_many

CRITERIA = [c.split("/") for c in PERSONA_CRITERIA] + [["agent", "relevance"]]


def write_run(path, method: str, contexts: list[str], shift: float, seed: int) -> None:
    """An evaluation of `method` on `contexts`: 2 judges per criterion, one automatic metric;
    agent/consistency is raised by `shift` judge points (1-5), the rest is noise."""
    rng = np.random.default_rng(seed)
    dialogues, scores = [], []
    for ctx in contexts:
        did = f"{method}-{ctx}"
        dialogues.append({"dialogue_id": did, "stage": "eval", "method": method,
                          "context_id": ctx, "mode": "support" if int(ctx[1:]) % 2 else "meeting",
                          "user_profile": None, "seed": 7, "n_turns": 6, "models": None})
        for level, crit in CRITERIA:
            for judge in ("j1", "j2"):
                v = 3.0 + rng.normal(0, 0.3) + (shift if crit == "consistency" else 0.0)
                scores.append({"method": method, "dialogue_id": did, "level": level,
                               "judge": judge, "criterion": crit,
                               "value": float(np.clip(v, 1, 5)), "higher_is_better": True})
        scores.append({"method": method, "dialogue_id": did, "level": "automatic",
                       "judge": "metric", "criterion": "redundancy_lexical",
                       "value": 0.5 - shift / 10, "higher_is_better": False})
    replace_many(str(path), [("dialogues", pl.DataFrame(dialogues), None, None),
                             ("eval_scores", pl.DataFrame(scores), None, None)])


def row(table: pl.DataFrame, group: str, level: str, criterion: str) -> dict:
    hit = table.filter((pl.col("group") == group) & (pl.col("level") == level)
                       & (pl.col("criterion") == criterion))
    assert hit.height == 1, (group, level, criterion)
    return hit.row(0, named=True)


def test_a_real_shift_is_found_on_the_right_criterion_only(tmp_path):
    ctxs = [f"c{i}" for i in range(12)]
    write_run(tmp_path / "a.duckdb", "mascot_c", ctxs, 0.0, seed=1)
    write_run(tmp_path / "b.duckdb", "mascot_c", ctxs, 1.0, seed=2)
    table = compare(load_scores(tmp_path / "a.duckdb", "mascot_c"),
                    load_scores(tmp_path / "b.duckdb", "mascot_c"))
    cons = row(table, "all", "agent", "consistency")
    assert cons["n_contexts"] == 12
    assert cons["difference"] == pytest.approx(25.0, abs=6.0)  # one judge point = 25 on 0-100
    assert cons["mark"] == "*" and cons["lo"] > 0
    # the gate is the mean of the four persona criteria: a quarter of the shift
    assert row(table, "all", "gate", "persona")["difference"] == pytest.approx(25 / 4, abs=3)
    # automatic metrics keep their own unit
    red = row(table, "all", "automatic", "redundancy_lexical")
    assert red["difference"] == pytest.approx(-0.1)
    assert row(table, "support", "agent", "consistency")["n_contexts"] == 6
    # a criterion that did not move has a CI around 0
    rel = row(table, "all", "agent", "relevance")
    assert rel["lo"] < 0 < rel["hi"] or abs(rel["difference"]) < 8


def test_only_common_contexts_pair_and_reading_never_writes(tmp_path):
    write_run(tmp_path / "a.duckdb", "mascot_c", ["c0", "c1", "c2"], 0.0, seed=1)
    write_run(tmp_path / "b.duckdb", "mascot_c", ["c1", "c2", "c3", "c4"], 0.0, seed=2)
    before = os.path.getmtime(tmp_path / "a.duckdb")
    table = compare(load_scores(tmp_path / "a.duckdb", "mascot_c"),
                    load_scores(tmp_path / "b.duckdb", "mascot_c"))
    assert row(table, "all", "judge", "all")["n_contexts"] == 2
    assert row(table, "all", "judge", "all")["mark"] == ""  # 2 contexts never earn a mark
    assert os.path.getmtime(tmp_path / "a.duckdb") == before


def test_errors_name_the_file_method_and_context(tmp_path):
    write_run(tmp_path / "a.duckdb", "mascot_c", ["c0", "c1"], 0.0, seed=1)
    with pytest.raises(ValueError, match=r"a\.duckdb: no scored eval dialogues of method 'mascot'"):
        load_scores(tmp_path / "a.duckdb", "mascot")
    with pytest.raises(FileNotFoundError, match="missing.duckdb"):
        load_scores(tmp_path / "missing.duckdb", "mascot_c")
    rows = load_scores(tmp_path / "a.duckdb", "mascot_c")
    broken = rows.with_columns(value=pl.when((pl.col("context_id") == "c1")
                                             & (pl.col("level") == "agent"))
                               .then(60.0).otherwise(pl.col("value")))
    with pytest.raises(ValueError,
                       match=r"treatment: .*dialogue_id=mascot_c-c1.*value 60\.0"):
        compare(rows, broken)
    swapped = rows.with_columns(mode=pl.when(pl.col("context_id") == "c0").then(pl.lit("x"))
                                .otherwise(pl.col("mode")))
    with pytest.raises(ValueError, match="context c0 is mode meeting in control but x"):
        compare(rows, swapped)
    with pytest.raises(ValueError, match="share no scored context"):
        compare(rows, rows.with_columns(context_id=pl.lit("other")))
    with pytest.raises(ValueError, match=r"control: columns \['mode'\] missing"):
        per_context(rows.drop("mode"), "control")
