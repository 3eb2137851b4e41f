"""Readers and writers of the DuckDB file (issue 30, item 5), on a real file with real processes.

DuckDB locks the file per process: one read-write process, or any number of read-only ones,
never both. So the readers (`mascot query`, `mascot probe`, `load_scores`, `query_pl(...,
read_only=True)`) open read-only and run no DDL; while a writer holds the file, a reader gives
up within seconds with one line naming the holder; writers still wait for the lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pytest

from mascot_dag.lib.storage import db

REPO = Path(__file__).resolve().parents[1]
MASCOT = REPO / ".venv" / "bin" / "mascot"
BOUND_S = 15.0  # the bound on how long a reader may wait on a writer
# A reader that neither succeeds nor fails in this long is stuck: stop it and fail the test
# (the code before the fix waited ~62 s).
STUCK_S = 30.0

# A second process holding the file open the way the project does, until its stdin closes.
HOLD = """
import sys
from mascot_dag.lib.storage import db
with db.connect(sys.argv[1], read_only=sys.argv[2] == "r") as con:
    con.execute("SELECT count(*) FROM contexts").fetchall()
    print("holding", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def holder(path: Path, mode: str) -> Iterator[subprocess.Popen]:
    """Another process with `path` open ("w": read-write, "r": read-only) until the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], STUCK_S)
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "holding":
            proc.kill()
            raise AssertionError(f"holder ({mode}) did not open {path}: {proc.stderr.read()}")
        yield proc
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def release_after(proc: subprocess.Popen, seconds: float) -> threading.Timer:
    t = threading.Timer(seconds, proc.stdin.close)
    t.start()
    return t


@pytest.fixture
def database(home) -> Path:
    """A schema'd file with contexts rows, written through the project's writer path."""
    path = home / "mascot.duckdb"
    rows = pl.DataFrame({
        "context_id": ["ed:1", "ed:2", "ed:3"], "source": ["empatheticdialogues"] * 3,
        "domain": ["emotional_support"] * 3, "split": ["train", "train", "eval"],
        "situation": ["s"] * 3, "text": ["t"] * 3, "emotion": ["sad", "sad", "joyful"],
        "valence": ["negative", "negative", "positive"],
        "source_file": ["demo.csv"] * 3, "source_ref": ["2-3", "4-5", "6-7"]})
    db.replace_rows(path, "contexts", rows)
    return path


def _tables(path: Path) -> set[str]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {r[0] for r in con.execute("SHOW TABLES").fetchall()}
    finally:
        con.close()


def _without_a_table(path: Path) -> str:
    """Drop one schema table: a reader that ran the schema DDL would bring it back. Returns the
    file's digest, which a read-only open must leave unchanged."""
    con = duckdb.connect(str(path))
    try:
        con.execute("DROP TABLE generation_cache")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    assert "generation_cache" not in _tables(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mascot(home: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """The real CLI in its own process; (result, seconds). A run past STUCK_S fails the test."""
    env = {**os.environ, "MASCOT_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    t0 = time.monotonic()
    try:
        res = subprocess.run([str(MASCOT), *args], env=env, capture_output=True, text=True,
                             timeout=STUCK_S)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"mascot {' '.join(args)} still waiting after {STUCK_S:.0f} s; "
                             f"stderr so far: {(e.stderr or b'')[-300:]!r}") from None
    return res, time.monotonic() - t0


def _assert_one_line_lock_error(message: str, holder_pid: int) -> None:
    lines = message.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{message}"
    assert "Traceback" not in message
    assert f"PID {holder_pid}" in lines[0], lines[0]
    assert "wait" in lines[0].lower() and "stop" in lines[0].lower(), lines[0]


# --- readers run no DDL -------------------------------------------------------------------


def test_read_only_connect_runs_no_ddl(database):
    digest = _without_a_table(database)
    with db.connect(database, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM contexts").fetchone()[0] == 3
    assert "generation_cache" not in _tables(database)
    assert hashlib.sha256(database.read_bytes()).hexdigest() == digest


def test_query_pl_read_only_runs_no_ddl(database):
    digest = _without_a_table(database)
    df = db.query_pl(database, "SELECT count(*) AS n FROM contexts", read_only=True)
    assert df["n"][0] == 3
    assert "generation_cache" not in _tables(database)
    assert hashlib.sha256(database.read_bytes()).hexdigest() == digest


def test_cli_query_runs_no_ddl(home, database):
    digest = _without_a_table(database)
    res, _ = _mascot(home, "query", "contexts_by_split")
    assert res.returncode == 0, res.stderr
    assert "empatheticdialogues" in res.stdout
    assert "generation_cache" not in _tables(database), "mascot query ran the schema DDL"
    assert hashlib.sha256(database.read_bytes()).hexdigest() == digest, "mascot query wrote"


def test_cli_probe_runs_no_ddl(home, database):
    digest = _without_a_table(database)
    res, _ = _mascot(home, "probe")
    assert res.returncode == 2 and "no persona_probe rows" in res.stderr, res.stderr
    assert "generation_cache" not in _tables(database), "mascot probe ran the schema DDL"
    assert hashlib.sha256(database.read_bytes()).hexdigest() == digest, "mascot probe wrote"


def test_read_only_on_a_missing_file_creates_nothing(home):
    path = home / "nothing.duckdb"
    with pytest.raises(FileNotFoundError, match="nothing.duckdb"):
        db.query_pl(path, "SELECT 1", read_only=True)
    assert not path.exists()


# --- readers coexist ----------------------------------------------------------------------


def test_two_readers_coexist(home, database):
    """A reader holding the file open, and two `mascot query` processes at once beside it."""
    env = {**os.environ, "MASCOT_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    with holder(database, "r"):
        procs = [subprocess.Popen([str(MASCOT), "query", "contexts_by_split"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        try:
            outs = [p.communicate(timeout=STUCK_S) for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError(f"readers blocked each other for {STUCK_S:.0f} s") from None
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert "empatheticdialogues" in out


# --- a reader under a writer: fast, one line, names the holder ------------------------------


def test_cli_query_under_a_writer_fails_fast_in_one_line(home, database):
    with holder(database, "w") as writer:
        res, seconds = _mascot(home, "query", "contexts_by_split")
    print(f"\nmascot query under a writer: rc={res.returncode} after {seconds:.2f} s; "
          f"stderr: {res.stderr.strip()}")
    assert res.returncode == 1
    assert seconds < BOUND_S, f"reader took {seconds:.1f} s"
    assert res.stdout == ""
    _assert_one_line_lock_error(res.stderr, writer.pid)


def test_cli_probe_under_a_writer_fails_fast_in_one_line(home, database):
    with holder(database, "w") as writer:
        res, seconds = _mascot(home, "probe")
    assert res.returncode == 1
    assert seconds < BOUND_S, f"reader took {seconds:.1f} s"
    _assert_one_line_lock_error(res.stderr, writer.pid)


def test_library_readers_under_a_writer_raise_database_locked(database):
    from mascot_dag.lib.evaluation.ab import load_scores

    with holder(database, "w") as writer:
        for read in (lambda: db.query_pl(database, "SELECT 1", read_only=True),
                     lambda: load_scores(database, "mascot")):
            t0 = time.monotonic()
            with pytest.raises(db.DatabaseLocked) as info:
                read()
            assert time.monotonic() - t0 < BOUND_S
            # still a DuckDB I/O error: retry policies that treat a busy lock as transient
            # keep working
            assert isinstance(info.value, duckdb.IOException)
            _assert_one_line_lock_error(str(info.value), writer.pid)


def test_reader_waits_out_a_short_write(home, database):
    """A run's writes are short transactions: a reader arriving during one gets in after it."""
    with holder(database, "w") as writer:
        release_after(writer, 1.0)
        res, seconds = _mascot(home, "query", "contexts_by_split")
    assert res.returncode == 0, res.stderr
    assert "empatheticdialogues" in res.stdout


def test_lock_message_without_a_pid_is_still_one_line(tmp_path):
    path = tmp_path / "x.duckdb"
    err = db.DatabaseLocked.from_error(
        path, 'IO Error: Could not set lock on file "x.duckdb": Resource temporarily\n'
        "unavailable", read_only=True)
    text = str(err)
    assert len(text.splitlines()) == 1, text
    assert "another process" in text and str(path) in text
    assert "wait" in text.lower() and "stop" in text.lower()

    err = db.DatabaseLocked.from_error(
        path, 'IO Error: Could not set lock on file "x.duckdb": Conflicting lock is held in '
        "/usr/bin/python3 (PID 424242). See also https://duckdb.org/docs", read_only=True)
    assert "PID 424242" in str(err) and len(str(err).splitlines()) == 1


# --- writers keep waiting for the lock ------------------------------------------------------


@pytest.mark.parametrize("mode", ["r", "w"])
def test_writer_waits_for_the_holder(database, mode):
    rows = pl.DataFrame({"context_id": ["ed:9"], "source": ["empatheticdialogues"],
                         "domain": ["emotional_support"], "split": ["train"], "situation": ["s"],
                         "text": ["t"], "source_file": ["demo.csv"]})
    with holder(database, mode) as other:
        release_after(other, 1.5)
        t0 = time.monotonic()
        assert db.replace_rows(database, "contexts", rows, "context_id = ?", ["ed:9"]) == 1
        waited = time.monotonic() - t0
    assert waited >= 1.0, f"the writer did not wait for the lock ({waited:.2f} s)"
    con = duckdb.connect(str(database), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM contexts").fetchone()[0] == 4
    finally:
        con.close()


def test_cli_query_on_a_file_missing_a_table_says_so_in_one_line(home, database):
    """A reader no longer creates missing tables (an older file): one line, no traceback."""
    con = duckdb.connect(str(database))
    try:
        con.execute("DROP TABLE contexts")
    finally:
        con.close()
    res, _ = _mascot(home, "query", "contexts_by_split")
    assert res.returncode == 1
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "contexts" in res.stderr and "Traceback" not in res.stderr
    assert "contexts" not in _tables(database)


def test_cli_rate_export_under_a_writer_fails_fast_in_one_line(home, database, tmp_path):
    with holder(database, "w") as writer:
        res, seconds = _mascot(home, "rate", "--export", str(tmp_path / "r.csv"))
    assert res.returncode == 2
    assert seconds < BOUND_S, f"export took {seconds:.1f} s"
    _assert_one_line_lock_error(res.stderr, writer.pid)
    assert not (tmp_path / "r.csv").exists()
