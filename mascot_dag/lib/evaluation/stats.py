"""Small statistics for evaluation reports: bootstrap CIs, Wilson win-rate CIs, rank agreement.

Everything takes plain sequences or the (polars) DataFrames of the DuckDB tables and tolerates
missing values (NaN/None are dropped before computing); an undefined statistic is NaN or None,
never an exception, because a report must still render when a method or judge has no data.
Tables come back as polars DataFrames.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from itertools import combinations
from typing import Any

import numpy as np
import polars as pl

# Two-sided 95% normal quantile used by the Wilson interval.
Z95 = 1.959963984540054


def _clean(values: Iterable[Any]) -> np.ndarray:
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    return arr[~np.isnan(arr)]


def mean_std(values: Iterable[float | None]) -> tuple[float, float]:
    """(mean, sample std with ddof=1); std is 0.0 for one value; (nan, nan) for none."""
    arr = _clean(values)
    if arr.size == 0:
        return math.nan, math.nan
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def bootstrap_ci(
    values: Iterable[float | None],
    stat: Callable[[np.ndarray], float] = np.mean,
    n: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of `stat` (n resamples with replacement, fixed seed).

    One value gives (v, v); no values give (nan, nan).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    arr = _clean(values)
    if arr.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n, arr.size))
    try:  # numpy reductions take axis=: one vectorised call instead of n Python calls
        stats = np.asarray(stat(arr[idx], axis=1), dtype=float)
    except TypeError:
        stats = np.array([stat(arr[row]) for row in idx], dtype=float)
    lo, hi = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def describe(values: Iterable[float | None]) -> dict[str, float]:
    """count, mean, std (ddof=1), min, 25%, 50%, 75%, max of the values (missing ones dropped;
    quantiles interpolate linearly): the summary Dagster metadata shows for a distribution.
    Empty input gives {}."""
    arr = _clean(values)
    if arr.size == 0:
        return {}
    q = np.quantile(arr, [0.25, 0.5, 0.75])
    return {"count": float(arr.size), "mean": float(arr.mean()),
            "std": float(arr.std(ddof=1)) if arr.size > 1 else math.nan,
            "min": float(arr.min()), "25%": float(q[0]), "50%": float(q[1]),
            "75%": float(q[2]), "max": float(arr.max())}


def wilson_ci(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927); (nan, nan) for 0 trials.

    >>> tuple(round(x, 3) for x in wilson_ci(5, 10))
    (0.237, 0.763)
    """
    if trials == 0:
        return math.nan, math.nan
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _records(records: Iterable[Sequence[Any]] | pl.DataFrame) -> list[tuple[str, list[str], Any]]:
    if not isinstance(records, (list, tuple)) and hasattr(records, "columns"):
        records = records.select("comparison_id", "shown_order", "winner").iter_rows()
    out = []
    for cid, shown, winner in records:
        shown = json.loads(shown) if isinstance(shown, str) else list(shown)
        if winner is not None and not (isinstance(winner, float) and math.isnan(winner)):
            if winner not in shown:
                raise ValueError(f"comparison {cid}: winner {winner!r} is not among {shown}")
        else:
            winner = None
        out.append((str(cid), [str(m) for m in shown], winner))
    return out


def win_rates(records: Iterable[Sequence[Any]] | pl.DataFrame) -> pl.DataFrame:
    """Per-method win rate over n-way comparisons, with a Wilson 95% CI.

    records: (comparison_id, methods shown, winner or None) tuples, or the `comparisons` table
    (shown_order may be its JSON text). A comparison whose judge failed (winner None) counts in
    `failed`, not in `appearances`: it tells nothing about who is better. `chance` is the win rate
    of a method picked at random (1/3 in a three-way comparison), averaged over its appearances.
    """
    rows: dict[str, dict[str, float]] = {}
    seen: set[str] = set()
    for cid, shown, winner in _records(records):
        if cid in seen:
            raise ValueError(f"comparison {cid} appears twice; comparison ids must be unique")
        seen.add(cid)
        for m in shown:
            r = rows.setdefault(m, {"wins": 0, "appearances": 0, "failed": 0, "chance_sum": 0.0})
            if winner is None:
                r["failed"] += 1
                continue
            r["appearances"] += 1
            r["chance_sum"] += 1 / len(shown)
            r["wins"] += int(m == winner)
    table = []
    for m, r in rows.items():
        lo, hi = wilson_ci(int(r["wins"]), int(r["appearances"]))
        n = r["appearances"]
        table.append(
            {
                "method": m,
                "wins": int(r["wins"]),
                "appearances": int(n),
                "failed": int(r["failed"]),
                "win_rate": r["wins"] / n if n else math.nan,
                "ci_lo": lo,
                "ci_hi": hi,
                "chance": r["chance_sum"] / n if n else math.nan,
            }
        )
    # best first, ties by name, undefined (NaN: no appearances) last; sorted here because polars
    # orders NaN above every number
    def order(r: dict) -> tuple:
        undefined = math.isnan(r["win_rate"])
        return undefined, 0.0 if undefined else -r["win_rate"], r["method"]

    return pl.DataFrame(sorted(table, key=order), schema=WIN_RATE_SCHEMA)


WIN_RATE_SCHEMA = {"method": pl.String, "wins": pl.Int64, "appearances": pl.Int64,
                   "failed": pl.Int64, "win_rate": pl.Float64, "ci_lo": pl.Float64,
                   "ci_hi": pl.Float64, "chance": pl.Float64}


def spearman(a: Sequence[float | None], b: Sequence[float | None]) -> float | None:
    """Spearman rank correlation over the pairs where both values exist.

    None with fewer than 3 such pairs or when either side is constant (the rank correlation is
    undefined there, and a 2-point correlation is always +-1).
    """
    from scipy.stats import spearmanr

    if len(a) != len(b):
        raise ValueError(f"spearman needs equal lengths, got {len(a)} and {len(b)}")
    x = np.array([np.nan if v is None else v for v in a], dtype=float)
    y = np.array([np.nan if v is None else v for v in b], dtype=float)
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(x, y).statistic)


ITEM_KEYS = ["method", "dialogue_id", "level", "criterion"]


def judge_agreement(eval_scores: pl.DataFrame) -> pl.DataFrame:
    """Pairwise Spearman correlation between judges over the items both scored.

    An item is one (method, dialogue_id, level, criterion); automatic metrics (judge 'metric',
    level 'automatic') are excluded. One row per judge pair and criterion, plus one row with
    criterion 'all' pooling every shared item. spearman is None where undefined (see `spearman`).
    """
    schema = {"judge_a": pl.String, "judge_b": pl.String, "criterion": pl.String,
              "n_items": pl.Int64, "spearman": pl.Float64}
    df = eval_scores.filter((pl.col("judge") != "metric") & (pl.col("level") != "automatic"))
    df = df.with_columns(pl.col("value").cast(pl.Float64)).filter(
        pl.col("value").is_not_null() & ~pl.col("value").is_nan())
    judges = sorted(df["judge"].unique().to_list())
    rows = []
    for ja, jb in combinations(judges, 2):
        a = df.filter(pl.col("judge") == ja).select(*ITEM_KEYS, value_a="value")
        b = df.filter(pl.col("judge") == jb).select(*ITEM_KEYS, value_b="value")
        both = a.join(b, on=ITEM_KEYS, how="inner", maintain_order="left")
        groups = [("all", both)] + sorted(
            ((k[0], g) for k, g in both.group_by("criterion")), key=lambda g: g[0])
        for crit, g in groups:
            rho = spearman(g["value_a"].to_list(), g["value_b"].to_list())
            rows.append([ja, jb, crit, g.height, rho])
    return pl.DataFrame(rows, schema=schema, orient="row")


def paired_cluster_bootstrap(
    clusters: Sequence[Any],
    differences: Sequence[float | None],
    n: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, float]:
    """Mean of paired differences with a bootstrap CI that resamples whole CLUSTERS.

    Each difference is (treatment - control) on one paired unit (the same context, persona and
    seed under both arms); `clusters` names the unit's context. Units of one context are not
    independent (they share the situation), so the bootstrap draws contexts with replacement and
    keeps all of a context's units together. The estimate is the mean over units.

    Returns {"mean", "lo", "hi", "n_units", "n_clusters", "p_two_sided"}: `p_two_sided` is the
    bootstrap share of resampled means on the other side of zero, doubled (capped at 1). With no
    units every value is NaN except the counts; with one cluster the CI is the point estimate.

    >>> r = paired_cluster_bootstrap(["a", "a", "b", "c"], [1.0, 1.0, 2.0, 0.0], n=200)
    >>> r["mean"], r["n_clusters"]
    (1.0, 3.0)
    """
    if len(clusters) != len(differences):
        raise ValueError(f"{len(clusters)} cluster ids but {len(differences)} differences")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    keep = [(c, float(d)) for c, d in zip(clusters, differences, strict=True)
            if d is not None and not math.isnan(float(d))]
    ids = sorted({c for c, _ in keep}, key=str)
    out = {"n_units": float(len(keep)), "n_clusters": float(len(ids))}
    if not keep:
        return {"mean": math.nan, "lo": math.nan, "hi": math.nan, "p_two_sided": math.nan, **out}
    index = {c: i for i, c in enumerate(ids)}
    sums = np.zeros(len(ids))
    counts = np.zeros(len(ids))
    for c, d in keep:
        sums[index[c]] += d
        counts[index[c]] += 1
    mean = float(sums.sum() / counts.sum())
    rng = np.random.default_rng(seed)
    draw = rng.integers(0, len(ids), size=(n, len(ids)))
    # ratio estimator: total difference over total units of the resampled contexts
    boot = sums[draw].sum(axis=1) / counts[draw].sum(axis=1)
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    if mean > 0:
        p = 2 * float(np.mean(boot <= 0))
    elif mean < 0:
        p = 2 * float(np.mean(boot >= 0))
    else:
        p = 1.0
    return {"mean": mean, "lo": float(lo), "hi": float(hi), "p_two_sided": min(1.0, p), **out}


# Fewest contexts a significance mark may rest on. Why 6: with 5 contexts even an exact sign test
# cannot reach two-sided 5% (2 / 2**5 = 0.0625), while a percentile bootstrap over 2-5 contexts
# that share a sign "excludes 0" every time (it only resamples what it saw): a '*' there is noise.
MIN_CLUSTERS_FOR_SIGNIFICANCE = 6


def significance_mark(lo: float, hi: float, n_clusters: float) -> str:
    """'*' when a 95% CI of a difference excludes zero AND rests on at least
    MIN_CLUSTERS_FOR_SIGNIFICANCE contexts; '' otherwise (NaN bounds: '')."""
    if any(math.isnan(x) for x in (lo, hi)) or n_clusters < MIN_CLUSTERS_FOR_SIGNIFICANCE:
        return ""
    return "*" if lo > 0 or hi < 0 else ""
