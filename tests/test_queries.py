"""The named SQL queries (`mascot query NAME`) on a hand-made database, and the CLI around them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from mascot_dag.lib.storage import db

QUERIES = db.SQL_DIR / "queries"
REPO = Path(__file__).resolve().parents[1]
MASCOT = REPO / ".venv" / "bin" / "mascot"
# Parameters a query needs; a query not listed here must run without any.
PARAMS = {"dialogue": {"dialogue_id": "d1"}}


def _insert(con, table: str, rows: list[tuple]) -> None:
    marks = ", ".join("?" * len(rows[0]))
    con.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)


def _persona(pid: str, name: str) -> tuple:
    return (pid, "support", name, "role", "desc", "[]", "[]", "[]", "personas.yaml")


@pytest.fixture
def database(home) -> Path:
    path = home / "mascot.duckdb"
    with db.connect(path) as con:
        _insert(con, "contexts", [
            ("ed:1", "empatheticdialogues", "emotional_support", "train", "s", "t", "sad",
             "negative", None, None, None, None, "demo.csv", "lines 2-3"),
            ("ed:2", "empatheticdialogues", "emotional_support", "train", "s", "t", "sad",
             "negative", None, None, None, None, "demo.csv", "lines 4-5"),
            ("ed:3", "empatheticdialogues", "emotional_support", "eval", "s", "t", "joyful",
             "positive", None, None, None, None, "demo.csv", "lines 6-7"),
            ("qmsum:m:0", "qmsum", "product", "train", "topic", "A: hi", None, None, "m", "topic",
             None, None, "demo.jsonl", "line 1"),
        ])
        _insert(con, "personas", [_persona("anchor", "The Anchor"),
                                  _persona("beacon", "The Beacon")])
        judgments = []
        for cand, pid, scores in [("c1", "anchor", (4, 2)), ("c2", "anchor", (2, 5)),
                                  ("c3", "beacon", (3, 3))]:
            for crit, s in zip(("Consistency", "Social Contribution"), scores, strict=True):
                judgments.append((cand, pid, "embedded", crit, float(s), "r", "ok", None))
        # A failed judgment has no score and must not count anywhere.
        judgments.append(("c4", "anchor", "embedded", "Consistency", None, None, "failed", "junk"))
        _insert(con, "judgments", judgments)
        _insert(con, "preference_pairs", [
            ("p1", "ed:1", "anchor", "c1", "c2", 4.0, 3.0, 1.0),
            ("p2", "ed:2", "anchor", "c2", "c1", 4.5, 2.5, 2.0),
            ("p3", "ed:1", "beacon", "c3", "c5", 3.5, 2.5, 1.0),
        ])
        _insert(con, "dialogues", [
            ("d1", "eval", "mascot", "ed:1", "support", "INFJ", 0, 4, "{}"),
            ("d2", "eval", "zero_shot", "ed:2", "support", "ENTP", 0, 2, "{}"),
        ])
        _insert(con, "turns", [
            ("d1", 0, "user", "user", "I lost my dog and the house feels empty", None),
            ("d1", 1, "agent", "anchor", "That sounds so painful, losing a dog hurts", "base"),
            # Turn 2 repeats turn 1 almost word for word: the most redundant turn.
            ("d1", 2, "agent", "beacon", "That sounds so painful, losing a dog really hurts",
             "base"),
            ("d1", 3, "agent", "catalyst", "What would help you remember her well?", "base"),
            ("d2", 0, "user", "user", "My exam went badly", None),
            ("d2", 1, "agent", "assistant", "Exams are not everything", "base"),
        ])
        _insert(con, "directives", [
            ("d1", 1, "anchor", "validate", "warm", "ok", "{}"),
            ("d1", 2, "beacon", "encourage", "upbeat", "fallback", "not json"),
            ("d1", 3, "catalyst", "question", "curious", "retried", "{}"),
            ("d2", 1, "beacon", "encourage", "upbeat", "ok", "{}"),
        ])
        _insert(con, "persona_probe", [
            ("anchor", "ed:3", 0, "base", "training", "base", "You will be fine.", 2.0, 3.0,
             0.0),
            ("anchor", "ed:3", 0, "adapter", "training", "mascot-persona-anchor/2",
             "That hurts, it makes sense.", 4.0, 3.5, 0.0),
        ])
        _insert(con, "probe_readings", [
            ("anchor", "ed:3", 0, "base", "training", "lexical", "beacon", 0.0),
            ("anchor", "ed:3", 0, "adapter", "training", "lexical", "anchor", 1.0),
            ("anchor", "ed:3", 0, "base", "training", "semantic", "anchor", 1.0),
            ("anchor", "ed:3", 0, "adapter", "training", "semantic", "anchor", 1.0),
        ])
        _insert(con, "probe_readers", [("support", "lexical", 0.71), ("support", "semantic",
                                                                          0.78)])
        _insert(con, "eval_scores", [
            ("mascot", "d1", "agent", "embedded", "Consistency", 4.0, True),
            ("mascot", "d3", "agent", "embedded", "Consistency", 3.0, True),
            ("zero_shot", "d2", "agent", "embedded", "Consistency", 2.0, True),
            ("zero_shot", "d2", "automatic", "metric", "distinct_2", 0.5, True),
        ])
    return path


def _run_all(path: Path) -> dict:
    """Every named query's result."""
    out = {}
    for f in sorted(QUERIES.glob("*.sql")):
        sql = f.read_text(encoding="utf-8")
        out[f.stem] = db.query_pl(path, sql, PARAMS.get(f.stem))
    return out


def _row(df: pl.DataFrame, **key) -> dict:
    """The one row of `df` whose columns equal `key` (an error unless exactly one matches)."""
    return df.row(by_predicate=pl.all_horizontal(pl.col(k) == v for k, v in key.items()),
                  named=True)


def test_every_query_returns_rows(database):
    results = _run_all(database)
    expected = {"persona_scores", "persona_pairs", "most_redundant_turns", "directive_stats",
                "eval_summary", "contexts_by_split", "dialogue"}
    assert expected <= set(results), f"missing queries: {expected - set(results)}"
    for name, df in results.items():
        assert len(df) > 0, f"query {name} returned no rows on the hand-made data"


def test_query_values(database):
    r = _run_all(database)

    probe = r["persona_probe"]
    assert _row(probe, arm="adapter", reader="lexical")["identifiable"] == 1.0
    assert _row(probe, arm="base", reader="lexical")["identifiable"] == 0.0
    assert _row(probe, arm="base", reader="semantic")["identifiable"] == 1.0
    assert _row(probe, arm="base", reader="semantic")["reader_accuracy"] == 0.78
    assert _row(probe, arm="adapter", reader="lexical")["model_version"] == \
        "mascot-persona-anchor/2"

    ps = r["persona_scores"]
    row = _row(ps, persona_id="anchor", criterion="Consistency")
    assert row["persona_name"] == "The Anchor"
    assert (row["mean_score"], row["min_score"], row["max_score"], row["n"]) == (
        3.0, 2.0, 4.0, 2)  # no failed
    assert _row(ps, persona_id="beacon", criterion="Social Contribution")["n"] == 1

    pp = r["persona_pairs"]
    anchor, beacon = _row(pp, persona_id="anchor"), _row(pp, persona_id="beacon")
    assert anchor["pairs"] == 2 and anchor["mean_margin"] == 1.5
    assert beacon["pairs"] == 1 and beacon["persona_name"] == "The Beacon"

    red = r["most_redundant_turns"]
    assert {"dialogue_id", "turn_idx", "speaker", "text", "earlier_turn_idx", "earlier_text",
            "similarity"} <= set(red.columns)
    top = red.row(0, named=True)
    assert (top["dialogue_id"], top["turn_idx"], top["speaker"], top["earlier_turn_idx"]) == (
        "d1", 2, "beacon", 1)
    assert 0.7 < top["similarity"] < 1.0
    assert set(red["turn_idx"]) >= {1, 2, 3} and "user" not in set(red["speaker"])
    assert red["similarity"].is_sorted(descending=True)

    ds = r["directive_stats"]
    beacon = _row(ds, speaker="beacon")
    assert beacon["directives"] == 2 and beacon["share"] == 0.5
    assert beacon["fallbacks"] == 1 and beacon["fallback_rate"] == 0.5
    assert _row(ds, speaker="catalyst")["retry_rate"] == 1.0
    assert _row(ds, speaker="anchor")["fallback_rate"] == 0.0

    ev = r["eval_summary"]
    assert _row(ev, method="mascot", level="agent", criterion="Consistency")["mean_value"] == 3.5
    assert _row(ev, method="mascot", level="agent", criterion="Consistency")["n"] == 2
    assert _row(ev, method="zero_shot", level="automatic",
                criterion="distinct_2")["mean_value"] == 0.5

    cs = r["contexts_by_split"]
    neg = cs.filter((pl.col("valence") == "negative") & (pl.col("split") == "train"))
    assert neg["contexts"].to_list() == [2]
    assert cs.filter(pl.col("source") == "qmsum")["domain"].to_list() == ["product"]

    dlg = r["dialogue"]
    assert dlg["turn_idx"].to_list() == [0, 1, 2, 3]
    assert dlg["directive_status"].to_list()[1:] == ["ok", "fallback", "retried"]
    assert dlg["directive_action"].is_null().to_list() == [True, False, False, False]  # user turn


def test_dialogue_query_needs_its_parameter(database):
    sql = (QUERIES / "dialogue.sql").read_text(encoding="utf-8")
    other = db.query_pl(database, sql, {"dialogue_id": "d2"})
    assert other["speaker"].to_list() == ["user", "assistant"]
    with pytest.raises(Exception, match="dialogue_id"):
        db.query_pl(database, sql, None)


def _mascot(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MASCOT_HOME": str(home)}
    cmd = [str(MASCOT)] if MASCOT.exists() else [sys.executable, "-m", "mascot_dag.cli"]
    return subprocess.run([*cmd, "query", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_cli_query(database, home):
    res = _mascot(home, "persona_scores")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["persona_id", "persona_name", "criterion", "mean_score",
                                "min_score", "max_score", "n"]
    assert any("The Anchor" in ln and "Consistency" in ln and "3.0" in ln for ln in lines[1:])
    assert len(lines) == 1 + 4  # 2 personas x 2 criteria

    res = _mascot(home, "dialogue", "--param", "dialogue_id=d2")
    assert res.returncode == 0, res.stderr
    assert "Exams are not everything" in res.stdout and "lost my dog" not in res.stdout

    res = _mascot(home, "no_such_query")
    assert res.returncode == 2
    assert "no query 'no_such_query'" in res.stderr
    assert "persona_scores" in res.stderr and "directive_stats" in res.stderr

    res = _mascot(home, "dialogue", "--param", "dialogue_id")
    assert res.returncode == 2
    assert "expected k=v" in res.stderr


def test_queries_are_one_statement_each():
    import duckdb

    for f in sorted(QUERIES.glob("*.sql")):
        stmts = duckdb.extract_statements(f.read_text(encoding="utf-8"))
        assert len(stmts) == 1, f"{f.name} holds {len(stmts)} statements; one per file"
