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
import pandas as pd

COLUMNS = ["judge_a", "judge_b", "criterion", "n", "rho", "note"]
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
    scores: pd.DataFrame,
    item_keys: list[str],
    value: str = "value",
    judge: str = "judge",
    criterion: str = "criterion",
) -> pd.DataFrame:
    """One row per judge pair and criterion (plus criterion 'all'): judge_a, judge_b, criterion,
    n (shared scored items), rho (Spearman), note (why rho is NaN, else "").

    >>> df = pd.DataFrame({"item": [1, 2, 3] * 2, "judge": ["a"] * 3 + ["b"] * 3,
    ...                    "criterion": "c", "value": [1, 2, 3, 2, 3, 5]})
    >>> r = agreement(df, ["item"]).iloc[1]
    >>> (r.criterion, int(r.n), float(r.rho))
    ('c', 3, 1.0)
    """
    missing = [c for c in [*item_keys, value, judge, criterion] if c not in scores.columns]
    if missing:
        raise ValueError(f"agreement: score table lacks column(s) {missing}; it has "
                         f"{list(scores.columns)}")
    # pairs of every judge in the table, also one whose every score failed: its rows say n = 0
    judges = sorted(scores[judge].dropna().unique())
    df = scores.dropna(subset=[value])
    if "status" in df.columns:
        df = df[df["status"].fillna("ok") != "failed"]
    keys = [*item_keys, criterion]
    crits = sorted(scores[criterion].dropna().unique(), key=str)
    rows = []
    for ja, jb in combinations(judges, 2):
        a = df[df[judge] == ja].groupby(keys, dropna=False)[value].mean()
        b = df[df[judge] == jb].groupby(keys, dropna=False)[value].mean()
        both = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner").reset_index()
        groups = [(ALL, both)] + [(c, both[both[criterion] == c]) for c in crits]
        for crit, g in groups:
            rho, note = _rho(g["a"].to_numpy(float), g["b"].to_numpy(float), ja, jb)
            rows.append([ja, jb, crit, len(g), rho, note])
    return pd.DataFrame(rows, columns=COLUMNS)


def agreement_markdown(table: pd.DataFrame) -> str:
    """The agreement table as markdown (Dagster metadata, reports); 'n/a' rows say why."""
    if table.empty:
        return "n/a (fewer than two judges scored the same items)"
    lines = ["| judge A | judge B | criterion | n | Spearman rho |", "|---|---|---|---|---|"]
    for r in table.itertuples():
        rho = f"{r.rho:.2f}" if not math.isnan(r.rho) else f"n/a ({r.note})"
        lines.append(f"| {r.judge_a} | {r.judge_b} | {r.criterion} | {r.n} | {rho} |")
    return "\n".join(lines)
