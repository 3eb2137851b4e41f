"""Data loads under faults (issue 30, items 1-3): real files in tmp_path, real DuckDB, real Dagster
runs. A skip_bad_rows load that keeps too little of a file fails the run and leaves the stored
rows alone; an unbalanced quote is reported as one; the inbox refuses a file whose ids another
source of the next load already holds; a data error fails at once, a transient one is retried."""

from __future__ import annotations

import json
import os
import shutil
import time
from importlib import resources
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from mascot_dag.assets import contexts as contexts_mod
from mascot_dag.automation import inbox_sensor
from mascot_dag.lib.data import DataFileError, load_empathetic_dialogues, load_qmsum
from mascot_dag.lib.data.empathetic import HEADER
from mascot_dag.lib.data.inbox import incoming_dir, incoming_sources, process_inbox
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore

DATA = Path(str(resources.files("mascot_dag") / "data"))
DEMO_CSV = DATA / "empatheticdialogues" / "demo.csv"
HEAD = ",".join(HEADER)


@pytest.fixture(autouse=True)
def _no_configured_paths(monkeypatch):
    # The tests set the configured sources themselves; one left in the environment would leak.
    monkeypatch.delenv("MASCOT_ED_PATH", raising=False)
    monkeypatch.delenv("MASCOT_QMSUM_PATH", raising=False)


def _ed(path: Path, rows: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([HEAD, *rows]) + "\n", encoding="utf-8")
    return path


def _conv(i: int | str, emo: str = "sad", prefix: str = "q") -> list[str]:
    return [f"{prefix}:{i},1,{emo},Lost my keys {i},,I lost my keys again.,,",
            f"{prefix}:{i},2,{emo},Lost my keys {i},,Oh no_comma_ where did you look?,,"]


def _all_bad_demo(path: Path) -> Path:
    """The packaged ED demo with an unknown emotion on every row: 348 lines, all bad."""
    lines = DEMO_CSV.read_text(encoding="utf-8").splitlines()
    rows = []
    for line in lines[1:]:
        f = line.split(",")
        rows.append(",".join([*f[:2], "hangry", *f[3:]]))
    return _ed(path, rows)


def _meeting(seed: str) -> dict:
    turns = [{"speaker": f"S{i % 2}", "content": f"{seed} point {i}"} for i in range(4)]
    return {"topic_list": [{"topic": f"{seed} plan", "relevant_text_span": [["0", "3"]]}],
            "specific_query_list": [], "meeting_transcripts": turns}


def _materialize(home: Path, ed_path: Path | None = None, qm_path: Path | None = None,
                 skip_bad: bool = False, store: DuckDBStore | None = None):
    cfg: dict = {"skip_bad_rows": skip_bad}
    if ed_path:
        cfg["ed_path"] = str(ed_path)
    if qm_path:
        cfg["qmsum_path"] = str(qm_path)
    return dg.materialize(
        [contexts_mod.contexts],
        resources={"store": store or DuckDBStore(path=str(home / "mascot.duckdb")),
                   "settings": LineageSettings()},
        run_config={"ops": {"contexts": {"config": cfg}}}, raise_on_error=False)


def _rows(home: Path) -> dict[str, int]:
    con = duckdb.connect(str(home / "mascot.duckdb"), read_only=True)
    try:
        return dict(con.execute("SELECT source, count(*) FROM contexts GROUP BY source").fetchall())
    finally:
        con.close()


def _failure(result) -> str:
    failure = next(e for e in result.all_events if e.is_step_failure)
    err = failure.step_failure_data.error
    return f"{err.message} {err.cause}"


def _retries(result) -> int:
    return sum(e.event_type_value == "STEP_UP_FOR_RETRY" for e in result.all_events)


# --- 1. loads: too few rows kept fails, quote faults named, skipped lines counted -------------


def test_ed_all_rows_bad_fails_even_with_skip_bad(tmp_path):
    bad = _all_bad_demo(tmp_path / "allbad.csv")
    with pytest.raises(DataFileError, match=r"allbad\.csv: only 0 of 348 data lines loaded"):
        load_empathetic_dialogues(bad, skip_bad=True)


def test_ed_kept_fraction_at_the_default(tmp_path):
    def rows(n_bad):  # 20 one-line conversations, the first n_bad with an unknown emotion
        return [_conv(i, "hangry" if i < n_bad else "sad")[0] for i in range(20)]

    with pytest.raises(DataFileError, match=r"b3\.csv: only 17 of 20 data lines loaded"):
        load_empathetic_dialogues(_ed(tmp_path / "b3.csv", rows(3)), skip_bad=True)
    res = load_empathetic_dialogues(_ed(tmp_path / "b2.csv", rows(2)), skip_bad=True)
    assert len(res.contexts) == 18 and len(res.skipped) == 2  # 90% kept: the default passes


def test_qmsum_all_lines_bad_fails_even_with_skip_bad(tmp_path):
    folder = tmp_path / "qm" / "Product"
    folder.mkdir(parents=True)
    (folder / "m.jsonl").write_text("{broken\n{also broken\n[1, 2]\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"m\.jsonl: only 0 of 3 data lines loaded"):
        load_qmsum(tmp_path / "qm", skip_bad=True)


def _quoted(tmp_path) -> Path:
    rows = [r for i in range(30) for r in _conv(i)]
    # line 21 = conversation 9's listener turn: its prompt opens a quote that never closes
    rows[19] = 'q:9,2,sad,"Lost my keys 9,,Oh no_comma_ where did you look?,,'
    return _ed(tmp_path / "quoted.csv", rows)


def test_ed_unbalanced_quote_is_named_as_a_quote_fault(tmp_path):
    with pytest.raises(DataFileError, match=r"quoted\.csv: line 21: .*quote") as err:
        load_empathetic_dialogues(_quoted(tmp_path))
    assert "expected 8 fields" not in str(err.value)


def test_ed_unbalanced_quote_skips_one_line_not_the_rest(tmp_path):
    path = _quoted(tmp_path)
    res = load_empathetic_dialogues(path, skip_bad=True)
    assert len(res.contexts) == 30  # conversation 9 keeps its speaker turn
    assert len(res.skipped) == 1 and "line 21:" in res.skipped[0] and "quote" in res.skipped[0]
    assert (res.lines[path].lines, res.lines[path].bad) == (60, 1)


# --- 1. through the contexts asset: the run fails, the stored rows stay ---------------------


def test_contexts_all_bad_ed_fails_the_run_and_keeps_rows(home, tmp_path):
    assert _materialize(home).success
    assert _rows(home) == {"empatheticdialogues": 80, "qmsum": 6}
    result = _materialize(home, ed_path=_all_bad_demo(tmp_path / "allbad.csv"), skip_bad=True)
    assert not result.success
    assert "allbad.csv: only 0 of 348 data lines loaded" in _failure(result)
    assert _rows(home) == {"empatheticdialogues": 80, "qmsum": 6}


def test_contexts_all_bad_qmsum_fails_the_run_and_keeps_rows(home, tmp_path):
    assert _materialize(home).success
    qm = tmp_path / "qm"
    shutil.copytree(DATA / "qmsum", qm)
    for f in qm.rglob("*.jsonl"):
        f.write_text(f.read_text(encoding="utf-8").replace('"topic_list"', '"topics"'),
                     encoding="utf-8")
    result = _materialize(home, qm_path=qm, skip_bad=True)
    assert not result.success
    assert "demo.jsonl: only 0 of 1 data lines loaded" in _failure(result)
    assert _rows(home) == {"empatheticdialogues": 80, "qmsum": 6}


# --- 2. the inbox checks every source of the next load ---------------------------------------


def _drop(home: Path, name: str, text: str) -> Path:
    inbox = home / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    path = inbox / name
    path.write_text(text, encoding="utf-8")
    old = time.time() - 60  # older than the sensor's settling time
    os.utime(path, (old, old))
    return path


def _note(home: Path, name: str) -> str:
    return (home / "inbox" / "rejected" / f"{name}.error.txt").read_text(encoding="utf-8")


def test_inbox_rejects_an_id_of_the_packaged_data(home):
    _drop(home, "mine.csv", "\n".join([HEAD, *_conv("01", prefix="demo_conv")]) + "\n")
    (outcome,) = process_inbox(home)
    assert not outcome.accepted
    note = _note(home, "mine.csv")
    assert "mine.csv" in note and str(DEMO_CSV) in note and "demo_conv:01" in note
    assert incoming_sources(home) == ([], [])


def test_inbox_rejects_an_id_of_the_configured_paths(home, tmp_path, monkeypatch):
    base = _ed(tmp_path / "base" / "train.csv", _conv(7, prefix="hit"))
    monkeypatch.setenv("MASCOT_ED_PATH", str(base))
    qm = tmp_path / "qmsum"
    (qm / "Product").mkdir(parents=True)
    (qm / "Product" / "own.jsonl").write_text(json.dumps(_meeting("roadmap")) + "\n")
    monkeypatch.setenv("MASCOT_QMSUM_PATH", str(qm))
    _drop(home, "again.csv", "\n".join([HEAD, *_conv(7, prefix="hit")]) + "\n")
    _drop(home, "product_again.jsonl", json.dumps(_meeting("roadmap")) + "\n")
    _drop(home, "product_new.jsonl", json.dumps(_meeting("budget")) + "\n")
    outcomes = {o.file.name: o for o in process_inbox(home)}
    assert not outcomes["again.csv"].accepted and not outcomes["product_again.jsonl"].accepted
    assert outcomes["product_new.jsonl"].accepted
    note = _note(home, "again.csv")
    assert "again.csv" in note and str(base) in note and "hit:7" in note
    note = _note(home, "product_again.jsonl")
    assert "product_again.jsonl" in note and "own.jsonl" in note and "qmsum:product:" in note


def test_sensor_rejects_a_copy_of_the_packaged_meetings(home):
    _drop(home, "committee_copy.jsonl",
          (DATA / "qmsum" / "Committee" / "demo.jsonl").read_text(encoding="utf-8"))
    with dg.instance_for_test() as instance:
        result = inbox_sensor(dg.build_sensor_context(instance=instance))
    assert not result.run_requests
    note = _note(home, "committee_copy.jsonl")
    assert "committee_copy.jsonl" in note and "Committee/demo.jsonl" in note


def test_contexts_failure_names_the_incoming_file(home):
    # A file accepted before the packaged data (or MASCOT_ED_PATH) gained its ids.
    old = _ed(incoming_dir(home) / "empatheticdialogues" / "old.csv",
              _conv("01", prefix="demo_conv"))
    result = _materialize(home)
    assert not result.success
    msg = _failure(result)
    assert str(old) in msg and str(DEMO_CSV) in msg and "ed:demo_conv:01" in msg
    assert _retries(result) == 0


# --- 3. retries only for transient faults ---------------------------------------------------


def test_data_error_fails_at_once(home, tmp_path):
    bad = _ed(tmp_path / "bad.csv", [_conv(1)[0], _conv(2, "hangry")[0]])
    start = time.monotonic()
    result = _materialize(home, ed_path=bad)
    assert not result.success and "bad.csv: line 3" in _failure(result)
    assert _retries(result) == 0
    assert time.monotonic() - start < 5  # the first retry would wait 5 s


def test_input_errors_fail_at_once_sorts_permanent_from_transient():
    from mascot_dag.assets.common import input_errors_fail_at_once
    from mascot_dag.lib.data.personas import PersonaFileError

    with pytest.raises(dg.Failure) as err, input_errors_fail_at_once():
        raise DataFileError("x.csv: line 3: unknown emotion 'hangry'")
    assert not err.value.allow_retries and "x.csv: line 3" in err.value.description
    with pytest.raises(dg.Failure), input_errors_fail_at_once(ValueError):
        raise ValueError("settings.ood_domains: unknown ['sports']")
    for transient in (OSError(5, "Input/output error"), TimeoutError("lock")):
        with pytest.raises(type(transient)), input_errors_fail_at_once():
            raise transient
    # an I/O fault the persona loader wrapped in its own error stays transient
    with pytest.raises(PersonaFileError), input_errors_fail_at_once():
        raise PersonaFileError("p.yaml: cannot read persona file") from OSError(5, "I/O error")


_FLAKY = {"fails": 0}


class FlakyStore(DuckDBStore):
    """The real store, whose first write fails as an OS-level I/O error would."""

    def replace(self, table, rows, where=None, params=None):
        if _FLAKY["fails"] == 0:
            _FLAKY["fails"] += 1
            raise OSError(5, "Input/output error (simulated)")
        return super().replace(table, rows, where, params)


def test_transient_error_is_still_retried(home):
    _FLAKY["fails"] = 0
    result = _materialize(home, store=FlakyStore(path=str(home / "mascot.duckdb")))
    assert result.success and _retries(result) == 1
    assert _rows(home) == {"empatheticdialogues": 80, "qmsum": 6}
