"""DuckDB <-> polars through Arrow: writes take polars frames, one
transaction each; reads come back as polars; dialogue rows survive the round trip."""

from __future__ import annotations

import polars as pl
import pytest

from mascot_dag.lib.dialogue.rollout import record_tables, records_from_frames
from mascot_dag.lib.dialogue.spec import DialogueRecord
from mascot_dag.lib.storage import db
from mascot_dag.resources.store import DuckDBStore


def _prompts(*rows) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=["style", "persona_id", "system_prompt"], orient="row")


def test_polars_rows_are_matched_by_name_and_replaced_in_one_transaction(tmp_path):
    store = DuckDBStore(path=str(tmp_path / "m.duckdb"))
    # columns in another order than the table's: matched by name
    assert store.replace("persona_prompts", _prompts(("zero_shot", "anchor", "A"),
                                                     ("zero_shot", "beacon", "B"))) == 2
    got = store.frame("SELECT persona_id, style, system_prompt FROM persona_prompts "
                      "ORDER BY persona_id")
    assert isinstance(got, pl.DataFrame)
    assert not hasattr(store, "query")  # reads are polars only
    assert got.rows() == [("anchor", "zero_shot", "A"), ("beacon", "zero_shot", "B")]
    # a partition replaced; the other kept
    store.replace("persona_prompts", _prompts(("few_shot", "anchor", "A2")), "persona_id = ?",
                  ["anchor"])
    assert store.frame("SELECT persona_id, style FROM persona_prompts ORDER BY 1").rows() == [
        ("anchor", "few_shot"), ("beacon", "zero_shot")]
    # a failing write (NOT NULL violated in the second table) leaves both tables as they were
    bad = pl.DataFrame({"persona_id": ["x"], "style": ["s"], "system_prompt": [None]},
                       schema_overrides={"system_prompt": pl.String})
    with pytest.raises(Exception, match="NOT NULL"):
        store.replace_many([("persona_prompts", _prompts(("s", "new", "N")), None, None),
                            ("persona_prompts", bad, "persona_id = 'x'", None)])
    assert store.frame("SELECT count(*) AS n FROM persona_prompts")["n"].item() == 2
    with pytest.raises(ValueError, match="has no columns"):
        store.replace("persona_prompts", _prompts(("s", "p", "t")).with_columns(extra=1))


def test_dialogue_rows_round_trip_through_duckdb(tmp_path):
    path = tmp_path / "m.duckdb"
    rec = DialogueRecord(
        {"dialogue_id": "eval:mascot:c1", "stage": "eval", "method": "mascot", "context_id": "c1",
         "mode": "support", "user_profile": None, "seed": 5, "n_turns": 2, "models": "{}"},
        [{"dialogue_id": "eval:mascot:c1", "turn_idx": 1, "role": "agent", "speaker": "anchor",
          "text": "B", "model_used": None},
         {"dialogue_id": "eval:mascot:c1", "turn_idx": 0, "role": "user", "speaker": "user",
          "text": "A", "model_used": "base"}],
        [])
    dialogues, turns, directives = record_tables([rec])
    assert turns.schema["turn_idx"] == pl.Int64 and directives.is_empty()
    db.replace_many(path, [("dialogues", dialogues, None, None), ("turns", turns, None, None),
                           ("directives", directives, None, None)])
    back = records_from_frames(db.query_pl(path, "SELECT * FROM dialogues"),
                               db.query_pl(path, "SELECT * FROM turns"),
                               db.query_pl(path, "SELECT * FROM directives"))
    assert [t["text"] for t in back[0].turns] == ["A", "B"]  # in turn order
    assert back[0].dialogue["user_profile"] is None and back[0].dialogue["seed"] == 5
