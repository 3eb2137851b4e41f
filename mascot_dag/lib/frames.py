"""pandas frames at the package boundary, converted to polars.

polars is the project's dataframe library (docs/DESIGN.md "Dataframes"); nothing in the package
produces or returns pandas. Public functions that take frames still accept a pandas one (tests
and notebooks build fixtures with it) through `to_polars`; `db.to_arrow` uses `is_pandas` for
pandas writes. Neither imports pandas.
"""

from __future__ import annotations

from typing import Any

import polars as pl


def is_pandas(df: Any) -> bool:
    """True for a pandas DataFrame, without importing pandas (it may never be loaded)."""
    return type(df).__module__.startswith("pandas") and hasattr(df, "to_numpy")


def to_polars(df: Any) -> pl.DataFrame:
    """A polars DataFrame from a polars or pandas one (pandas through Arrow; NaN becomes null).

    A pandas column holding no value at all (an empty frame, or `reindex` adding a missing
    column) says nothing about its type: pandas makes it float64 or object, and a float column
    compared with text would fail in polars. It becomes polars' Null type, which compares,
    casts and aggregates like missing values of any type.
    """
    if isinstance(df, pl.DataFrame):
        return df
    if is_pandas(df):
        out = pl.from_pandas(df)
        empty = [c for c in out.columns if out[c].null_count() == out.height]
        return out.with_columns(pl.Series(c, [None] * out.height, dtype=pl.Null) for c in empty)
    raise TypeError(f"expected a polars or pandas DataFrame, got {type(df).__name__}")
