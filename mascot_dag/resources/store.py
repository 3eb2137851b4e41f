"""The DuckDB store resource: one file under MASCOT_HOME holding every dataset of the lineage."""

from __future__ import annotations

from typing import Any

import dagster as dg
import polars as pl
from pydantic import Field

from mascot_dag.lib.storage import db
from mascot_dag.lib.storage.home import Home


class DuckDBStore(dg.ConfigurableResource):
    """Every asset writes its table through `replace`: one transaction per asset or partition.

    Writes take polars DataFrames (through Arrow); `frame` reads into polars (docs/DESIGN.md
    "Dataframes")."""

    path: str = Field(
        default="",
        description="DuckDB file; empty means MASCOT_HOME/mascot.duckdb (MASCOT_HOME defaults "
        "to ./.mascot).",
    )

    @property
    def db_path(self) -> str:
        return self.path or str(Home.from_env().duckdb)

    def replace(
        self, table: str, rows: db.Frame, where: str | None = None, params: list | None = None
    ) -> int:
        return db.replace_rows(self.db_path, table, rows, where, params)

    def replace_many(
        self, changes: list[tuple[str, db.Frame, str | None, list | None]]
    ) -> list[int]:
        return db.replace_many(self.db_path, changes)

    def upsert(self, table: str, rows: db.Frame) -> int:
        return db.upsert_rows(self.db_path, table, rows)

    def frame(self, sql: str, params: list[Any] | dict | None = None) -> pl.DataFrame:
        # Read as a writer, not read-only: a step runs beside other steps' writes, and must wait
        # for the lock as its own writes do instead of failing within seconds as a CLI reader
        # does; and a same-process read-only open beside a read-write one is refused by DuckDB.
        return db.query_pl(self.db_path, sql, params)
