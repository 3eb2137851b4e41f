"""DuckDB access for the lineage: schema, transactional replace, queries.

DuckDB locks the file per process: one process with it open read-write, or any number read-only,
never both. So connections are short-lived (opened per operation, closed at once); a writer
(the default) waits up to WRITE_WAIT_S for the lock, a reader (`read_only=True`: the CLI's
queries, reports, exports) runs no DDL, never creates the file, and gives up after READ_WAIT_S
with `DatabaseLocked`, one line naming the process that holds the file. Every write of
an asset goes through `replace_rows`: delete the asset's (or partition's) old rows and insert the
new ones in ONE transaction, so a failure leaves the previous rows intact and re-materialising
never duplicates.

Rows travel as Arrow tables: writes take polars DataFrames, `query_pl` reads into polars
(docs/DESIGN.md "Dataframes").
"""

from __future__ import annotations

import contextlib
import re
import textwrap
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

SQL_DIR = Path(str(resources.files("mascot_dag") / "sql"))


def schema_sql() -> str:
    return (SQL_DIR / "schema.sql").read_text(encoding="utf-8")


def _migrate(con: duckdb.DuckDBPyConnection) -> None:
    """Bring a file written by an older version to the current keys, in one transaction.

    judgments: the key gained persona_id (a candidate is judged AS every persona when Stage 1
    pools candidates across personas); rows are kept.
    persona_probe: the key gained `format`, and which persona a text sounds like moved to
    probe_readings, one row per reader (issue 34): old rows become the `training` format and
    their prediction the `lexical` reader's (its accuracy was never stored, so it does not
    count until persona_adapters runs again).
    """
    pk = con.execute(
        "SELECT constraint_column_names FROM duckdb_constraints() "
        "WHERE table_name = 'judgments' AND constraint_type = 'PRIMARY KEY'"
    ).fetchone()
    if pk and "persona_id" not in list(pk[0]):
        con.execute("BEGIN")
        con.execute("ALTER TABLE judgments RENAME TO judgments_old")
        con.execute(schema_sql())
        con.execute("INSERT INTO judgments SELECT * FROM judgments_old")
        con.execute("DROP TABLE judgments_old")
        con.execute("COMMIT")
    probe_cols = {r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'persona_probe'").fetchall()}
    if probe_cols and "format" not in probe_cols:
        unit = "persona_id, context_id, seed, arm"
        con.execute("BEGIN")
        con.execute("ALTER TABLE persona_probe RENAME TO persona_probe_old")
        con.execute(schema_sql())
        con.execute(f"INSERT INTO persona_probe SELECT {unit}, 'training', model_version, text, "
                    "consistency, relevance, copied FROM persona_probe_old")
        con.execute(f"INSERT INTO probe_readings SELECT {unit}, 'training', 'lexical', predicted, "
                    "identifiable FROM persona_probe_old")
        con.execute("DROP TABLE persona_probe_old")
        con.execute("COMMIT")


# A writer (a step of a run) waits out other steps' short transactions. A reader is usually a
# person at the CLI: while a run holds the file, DuckDB lets no other process read it at all,
# so the reader gives up soon with a message instead of waiting a minute for a traceback; 5 s
# is still long enough to slip in between a run's short writes.
WRITE_WAIT_S = 60.0
READ_WAIT_S = 5.0
# DuckDB's lock error names the holder: '... Conflicting lock is held in /usr/bin/python3
# (PID 1234). See also ...' (1.x). Other wordings fall back to "another process".
_HOLDER_PID = re.compile(r"\(PID (\d+)\)")


def _command_of(pid: str) -> str:
    """The holder's command line, shortened, or "" where /proc cannot tell (not Linux, gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return textwrap.shorten(raw.replace(b"\0", b" ").decode(errors="replace"), 80,
                            placeholder="...")


class DatabaseLocked(duckdb.IOException):
    """Another process holds the DuckDB file's lock. Still a `duckdb.IOException`, so a retry
    policy that treats a busy lock as transient keeps doing so; the message is ONE line."""

    @classmethod
    def from_error(cls, path: str | Path, message: str, read_only: bool) -> DatabaseLocked:
        m = _HOLDER_PID.search(message)
        if m:
            pid = m.group(1)
            command = _command_of(pid)
            who = f"PID {pid}" + (f" ({command})" if command else "")
            stop = f"stop it (kill {pid})"
        else:
            detail = textwrap.shorten(message, 120, placeholder="...")
            who, stop = f"another process (DuckDB: {detail})", "stop it"
        if read_only:
            return cls(f"{path} is locked: {who} has it open for writing, and DuckDB lets no "
                       f"other process read it meanwhile; wait for that run to finish or {stop}, "
                       "then retry.")
        return cls(f"{path} is locked: {who} has it open, and DuckDB lets a process write only "
                   f"while no other has it open; wait for it to finish or {stop}, then retry.")


@contextlib.contextmanager
def connect(
    path: str | Path, read_only: bool = False, lock_timeout_s: float | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the database, retrying while another process holds the lock (WRITE_WAIT_S or
    READ_WAIT_S unless `lock_timeout_s`), then `DatabaseLocked`.

    A writer creates the file and runs the schema DDL (and migrations); a reader does neither:
    the DDL would need the write lock, and a reader must not change what it reads."""
    path = Path(path)
    if read_only and not path.is_file():
        # DuckDB's own error here does not say which file; and a reader must not create one
        raise FileNotFoundError(f"{path}: no such DuckDB file")
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    wait = lock_timeout_s if lock_timeout_s is not None else (
        READ_WAIT_S if read_only else WRITE_WAIT_S)
    deadline = time.monotonic() + wait
    delay = 0.05
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only)
            break
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise
            if time.monotonic() > deadline:
                raise DatabaseLocked.from_error(path, str(exc), read_only) from exc
            time.sleep(delay)
            # a reader polls often: a run's writes are short, the gaps between them too
            delay = min(delay * 2, 0.25 if read_only else 1.0)
    try:
        if not read_only:
            con.execute(schema_sql())
            _migrate(con)
        yield con
    finally:
        con.close()


Frame = pl.DataFrame


def to_arrow(rows: Frame, table: str = "") -> pa.Table:
    """A polars frame as an Arrow table (what DuckDB scans without copying row by row)."""
    if not isinstance(rows, pl.DataFrame):
        raise TypeError(f"rows for table {table or '?'} must be a polars DataFrame, "
                        f"got {type(rows).__name__}")
    return rows.to_arrow()


def replace_rows(
    path: str | Path,
    table: str,
    rows: Frame,
    where: str | None = None,
    params: list[Any] | None = None,
) -> int:
    """Replace `table`'s rows matching `where` (all rows when None) by `rows`, atomically.

    Columns of `rows` (polars) are matched to the table by name and cast
    to its column types by DuckDB; missing nullable columns stay NULL. Returns the number of rows
    inserted.
    """
    return replace_many(path, [(table, rows, where, params)])[0]


def replace_many(
    path: str | Path, changes: list[tuple[str, Frame, str | None, list[Any] | None]]
) -> list[int]:
    """Several (table, rows, where, params) replacements in ONE transaction: a dialogue's rows in
    `dialogues`, `turns` and `directives` change together or not at all."""
    # Converted before the connection opens: a frame Arrow cannot hold fails with nothing touched.
    arrows = [to_arrow(rows, table) for table, rows, _, _ in changes]
    with connect(path) as con:
        for table, rows, _, _ in changes:
            cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
            unknown = [c for c in rows.columns if c not in cols]
            if unknown:
                raise ValueError(f"table {table} has no columns {unknown}; it has {cols}")
        con.execute("BEGIN TRANSACTION")
        try:
            for (table, rows, where, params), arrow in zip(changes, arrows, strict=True):
                con.execute(
                    f"DELETE FROM {table}" + (f" WHERE {where}" if where else ""), params or []
                )
                if len(rows):
                    con.register("_incoming", arrow)
                    names = ", ".join(f'"{c}"' for c in rows.columns)
                    con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM _incoming")
                    con.unregister("_incoming")
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
    return [len(rows) for _, rows, _, _ in changes]


def upsert_rows(path: str | Path, table: str, rows: Frame) -> int:
    """Insert rows, replacing any with the same primary key (used by the generation cache)."""
    if not len(rows):
        return 0
    arrow = to_arrow(rows, table)
    with connect(path) as con:
        con.register("_incoming", arrow)
        names = ", ".join(f'"{c}"' for c in rows.columns)
        con.execute(f"INSERT OR REPLACE INTO {table} ({names}) SELECT {names} FROM _incoming")
        con.unregister("_incoming")
    return len(rows)


def query_pl(
    path: str | Path, sql: str, params: list[Any] | dict | None = None, *, read_only: bool = False
) -> pl.DataFrame:
    """The result as a polars DataFrame (DuckDB hands it over as Arrow).

    `read_only=True` for readers outside a run (see `connect`); a run's steps read as the writers
    they are (`DuckDBStore.frame`): they wait for the lock like their writes do."""
    with connect(path, read_only=read_only) as con:
        return con.execute(sql, params or []).pl()
