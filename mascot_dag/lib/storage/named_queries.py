"""The named queries of `mascot query` (mascot_dag/sql/queries/NAME.sql): what each is, which
`$parameters` it needs."""

from __future__ import annotations

import re
from pathlib import Path

QUERIES = Path(__file__).resolve().parents[2] / "sql" / "queries"
_PARAM = re.compile(r"\$(\w+)")


def names() -> list[str]:
    return sorted(p.stem for p in QUERIES.glob("*.sql"))


def parameters(sql: str) -> list[str]:
    """The `$name` parameters a query binds."""
    return sorted(set(_PARAM.findall(sql)))


def describe() -> str:
    """`mascot query --help`: every query with its parameters and its first comment line."""
    lines = ["Run a named SQL query on the DuckDB file (read-only) and print a table.", "",
             "Queries (mascot_dag/sql/queries/NAME.sql):", ""]
    for f in sorted(QUERIES.glob("*.sql")):
        sql = f.read_text(encoding="utf-8")
        first = next((ln.lstrip("- ").strip() for ln in sql.splitlines() if ln.startswith("--")),
                     "")
        lines += [f"{f.stem}{''.join(f' --param {p}=...' for p in parameters(sql))}: {first}", ""]
    return "\n".join(lines)
