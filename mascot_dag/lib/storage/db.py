"""DuckDB access for the lineage: schema, transactional replace, queries.

DuckDB allows one writer process per file, so connections are short-lived (opened per operation,
closed at once) and opening retries briefly while another process holds the lock. Every write of
an asset goes through `replace_rows`: delete the asset's (or partition's) old rows and insert the
new ones in ONE transaction, so a failure leaves the previous rows intact and re-materialising
never duplicates.

Rows travel as Arrow tables: writes take polars DataFrames, `query_pl` reads into polars
(docs/DESIGN.md "Dataframes").
"""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def connect(
    path: str | Path, read_only: bool = False, lock_timeout_s: float = 60.0
) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the database (creating the schema), retrying while another process holds the lock."""
    path = Path(path)
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + lock_timeout_s
    delay = 0.05
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only)
            break
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
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


def query_pl(path: str | Path, sql: str, params: list[Any] | dict | None = None) -> pl.DataFrame:
    """The result as a polars DataFrame (DuckDB hands it over as Arrow)."""
    with connect(path) as con:
        return con.execute(sql, params or []).pl()
