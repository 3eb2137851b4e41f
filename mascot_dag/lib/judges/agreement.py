"""Agreement between judges that scored the same items: Spearman's rho and n per criterion.

Works on any long table of judge scores (`eval_scores`, `judgments`, `group_judgments`): the
caller names the columns that identify an item (without the judge and the criterion). Only
values both judges actually gave count: failed judgments (status 'failed' or a NULL value) are
left out, so n is the number of items the two judges both scored.

Every criterion in the table gets a row per judge pair, also when a judge failed on all of its
items (n = 0). rho is NaN in exactly two cases, and `note` says which: fewer than 3 shared items
(a 2-point rank correlation is always +-1, so it is not reported), or a judge that gave every
shared item the same value (undefined for a constant; the note names the judge).
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import polars as pl

COLUMNS = ["judge_a", "judge_b", "criterion", "n", "rho", "note"]
SCHEMA = dict(zip(COLUMNS, [pl.String, pl.String, pl.String, pl.Int64, pl.Float64, pl.String],
                  strict=True))
ALL = "all"  # the row that pools every criterion's shared items


def _rho(a: np.ndarray, b: np.ndarray, ja: str, jb: str) -> tuple[float, str]:
    from scipy.stats import spearmanr

    if a.size < 3:
        return math.nan, f"fewer than 3 shared items ({a.size})"
    constant = [j for j, v in ((ja, a), (jb, b)) if np.ptp(v) == 0]
    if constant:
        return math.nan, "constant: " + ", ".join(constant)
    return float(spearmanr(a, b).statistic), ""


def agreement(
    scores: pl.DataFrame,
    item_keys: list[str],
    value: str = "value",
    judge: str = "judge",
    criterion: str = "criterion",
) -> pl.DataFrame:
    """One row per judge pair and criterion (plus criterion 'all'): judge_a, judge_b, criterion,
    n (shared scored items), rho (Spearman), note (why rho is NaN, else "").

    >>> df = pl.DataFrame({"item": [1, 2, 3] * 2, "judge": ["a"] * 3 + ["b"] * 3,
    ...                    "criterion": "c", "value": [1, 2, 3, 2, 3, 5]})
    >>> r = agreement(df, ["item"]).row(1, named=True)
    >>> (r["criterion"], r["n"], r["rho"])
    ('c', 3, 1.0)
    """
    missing = [c for c in [*item_keys, value, judge, criterion] if c not in scores.columns]
    if missing:
        raise ValueError(f"agreement: score table lacks column(s) {missing}; it has "
                         f"{list(scores.columns)}")
    # pairs of every judge in the table, also one whose every score failed: its rows say n = 0
    judges = sorted(scores[judge].drop_nulls().unique().to_list())
    df = scores.with_columns(pl.col(value).cast(pl.Float64)).filter(
        pl.col(value).is_not_null() & ~pl.col(value).is_nan())
    if "status" in df.columns:
        df = df.filter(pl.col("status").fill_null("ok") != "failed")
    keys = [*item_keys, criterion]
    crits = sorted(scores[criterion].drop_nulls().unique().to_list(), key=str)
    rows = []
    for ja, jb in combinations(judges, 2):
        # one value per item and judge (a judge scoring an item twice counts once, its mean);
        # a missing key matches a missing key, as in an index alignment
        a, b = (df.filter(pl.col(judge) == j).group_by(keys).agg(pl.col(value).mean().alias(c))
                for j, c in ((ja, "a"), (jb, "b")))
        both = a.join(b, on=keys, how="inner", nulls_equal=True)
        groups = [(ALL, both)] + [(c, both.filter(pl.col(criterion) == c)) for c in crits]
        for crit, g in groups:
            rho, note = _rho(g["a"].to_numpy(), g["b"].to_numpy(), ja, jb)
            rows.append([ja, jb, crit, g.height, rho, note])
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


def agreement_markdown(table: pl.DataFrame) -> str:
    """The agreement table as markdown (Dagster metadata, reports); 'n/a' rows say why."""
    if table.is_empty():
        return "n/a (fewer than two judges scored the same items)"
    lines = ["| judge A | judge B | criterion | n | Spearman rho |", "|---|---|---|---|---|"]
    for r in table.iter_rows(named=True):
        rho = f"{r['rho']:.2f}" if not math.isnan(r["rho"]) else f"n/a ({r['note']})"
        lines.append(f"| {r['judge_a']} | {r['judge_b']} | {r['criterion']} | {r['n']} | {rho} |")
    return "\n".join(lines)
