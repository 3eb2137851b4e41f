"""Statistics of the blind human ratings (`human_ratings`, `human_choices`), their report section.

- Per-method means on the raters' 1-5 scale with a 95% bootstrap CI that resamples DIALOGUES
  (all ratings of a dialogue stay together: several raters rating one dialogue are not
  independent draws), n = ratings (dialogues).
- Inter-rater agreement: Krippendorff's alpha, ordinal metric, per criterion (`krippendorff`
  package, Krippendorff 2011); a unit is one dialogue inside one item, a coder is a rater.
- Judge-human agreement: Spearman between the human mean of a dialogue (over raters and items) and
  each judge's score of the same dialogue and criterion in `eval_scores`.
- Best picks: win rates with Wilson CIs (`stats.win_rates`, one comparison per item and rater).
An undefined statistic (one rater, < 3 dialogues, constant values) shows as n/a with its reason.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import polars as pl

from mascot_dag.lib.evaluation.human import CRITERIA
from mascot_dag.lib.evaluation.report_sections import md_table
from mascot_dag.lib.evaluation.stats import paired_cluster_bootstrap, spearman, win_rates

ORDER = [c for _, c, _ in CRITERIA]


def _criteria(ratings: pl.DataFrame) -> list[str]:
    found = set(ratings["criterion"])
    return [c for c in ORDER if c in found] + sorted(found - set(ORDER))


def method_means(ratings: pl.DataFrame, n_boot: int = 2000, seed: int = 0) -> pl.DataFrame:
    """One row per (criterion, method) plus criterion 'all' per method: mean, lo, hi,
    n_ratings, n_dialogues, n_raters."""
    rows = []
    for crit, g in [*((c, ratings.filter(pl.col("criterion") == c)) for c in _criteria(ratings)),
                    ("all", ratings)]:
        for method in sorted(set(g["method"])):
            m = g.filter(pl.col("method") == method)
            # the cluster bootstrap of `stats` resamples dialogues; its "differences" are here
            # plain scores (the mean of a resample is all we need from it)
            b = paired_cluster_bootstrap(m["dialogue_id"].to_list(),
                                         m["score"].cast(pl.Float64).to_list(), n=n_boot,
                                         seed=seed)
            rows.append({"criterion": crit, "method": method, "mean": b["mean"], "lo": b["lo"],
                         "hi": b["hi"], "n_ratings": m.height,
                         "n_dialogues": int(b["n_clusters"]), "n_raters": m["rater"].n_unique()})
    return pl.DataFrame(rows, schema={"criterion": pl.String, "method": pl.String,
                                      "mean": pl.Float64, "lo": pl.Float64, "hi": pl.Float64,
                                      "n_ratings": pl.Int64, "n_dialogues": pl.Int64,
                                      "n_raters": pl.Int64})


def alpha_ordinal(matrix: np.ndarray) -> float | None:
    """Krippendorff's alpha (ordinal, 1-5 domain) of a raters x units matrix with NaN for
    missing; None when no unit has two ratings or every rating is the same value."""
    import krippendorff

    m = np.asarray(matrix, dtype=float)
    if m.ndim != 2 or m.shape[0] < 2 or not (np.sum(~np.isnan(m), axis=0) >= 2).any():
        return None
    vals = m[~np.isnan(m)]
    if np.ptp(vals) == 0:
        return None  # no disagreement possible in the data: alpha is 0/0
    return float(krippendorff.alpha(reliability_data=m, level_of_measurement="ordinal",
                                    value_domain=[1, 2, 3, 4, 5]))


def _grid(g: pl.DataFrame) -> np.ndarray:
    """raters x units (item_id, dialogue_id) matrix of mean scores, NaN where not rated;
    raters and units sorted."""
    cells = g.group_by("rater", "item_id", "dialogue_id").agg(pl.col("score").mean())
    raters = sorted(set(cells["rater"]))
    units = sorted(set(cells.select("item_id", "dialogue_id").iter_rows()))
    ri, ui = {r: i for i, r in enumerate(raters)}, {u: i for i, u in enumerate(units)}
    grid = np.full((len(raters), len(units)), np.nan)
    for rater, item_id, did, score in cells.iter_rows():
        grid[ri[rater], ui[(item_id, did)]] = score
    return grid


def rater_agreement(ratings: pl.DataFrame) -> pl.DataFrame:
    """Per criterion: alpha (ordinal), raters, units (dialogue within item) rated by >= 2 raters."""
    rows = []
    for crit in _criteria(ratings):
        grid = _grid(ratings.filter(pl.col("criterion") == crit))
        pairable = int((np.sum(~np.isnan(grid), axis=0) >= 2).sum())
        rows.append({"criterion": crit, "alpha": alpha_ordinal(grid),
                     "n_raters": grid.shape[0], "n_units": grid.shape[1], "n_pairable": pairable})
    return pl.DataFrame(rows, schema={"criterion": pl.String, "alpha": pl.Float64,
                                      "n_raters": pl.Int64, "n_units": pl.Int64,
                                      "n_pairable": pl.Int64})


def judge_human(ratings: pl.DataFrame, eval_scores: pl.DataFrame) -> pl.DataFrame:
    """Per judge and criterion: Spearman(human mean per dialogue, judge score), n dialogues."""
    human = ratings.group_by("dialogue_id", "criterion").agg(
        human=pl.col("score").cast(pl.Float64).mean())
    js = eval_scores.filter((pl.col("judge") != "metric") & (pl.col("level") != "automatic"))
    js = js.with_columns(pl.col("value").cast(pl.Float64)).filter(
        pl.col("value").is_not_null() & ~pl.col("value").is_nan())
    js = js.group_by("judge", "dialogue_id", "criterion").agg(pl.col("value").mean())
    both = js.join(human, on=["dialogue_id", "criterion"], how="inner")
    rows = []
    for judge in sorted(set(both["judge"])):
        for crit in _criteria(ratings):
            g = both.filter((pl.col("judge") == judge) & (pl.col("criterion") == crit))
            rows.append({"judge": judge, "criterion": crit, "n_dialogues": g.height,
                         "spearman": spearman(g["human"].to_list(), g["value"].to_list())})
    return pl.DataFrame(rows, schema={"judge": pl.String, "criterion": pl.String,
                                      "n_dialogues": pl.Int64, "spearman": pl.Float64})


def best_rates(choices: pl.DataFrame) -> pl.DataFrame:
    recs = [(f"{item_id}|{rater}", shown, best) for item_id, rater, shown, best in
            choices.select("item_id", "rater", "shown_order", "best_method").iter_rows()]
    return win_rates(recs)


def _f(x: float | None, d: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def _tuples(df: pl.DataFrame) -> list[SimpleNamespace]:
    return [SimpleNamespace(**r) for r in df.iter_rows(named=True)]


def human_section(ratings: pl.DataFrame | None, choices: pl.DataFrame | None,
                  eval_scores: pl.DataFrame | None, methods: list[str] | None = None) -> list[str]:
    """Markdown lines of the report's human-evaluation section (one line when nobody rated)."""
    head = ["## Human evaluation (blind three-way, 1-5)", ""]
    if ratings is None or len(ratings) == 0:
        return head + ["n/a (no human ratings yet: `mascot rate` collects them)", ""]
    found = set(ratings["method"])
    order = [m for m in (methods or []) if m in found] + sorted(found - set(methods or []))
    lines = head + [
        f"{ratings['rater'].n_unique()} raters, {ratings['item_id'].n_unique()} items, "
        f"{ratings['dialogue_id'].n_unique()} dialogues, {len(ratings)} ratings. Methods were "
        "hidden and shown in a per-rater shuffled order. Cells: mean [95% bootstrap CI over "
        "dialogues] (n ratings / dialogues).", ""]
    means = {(r["criterion"], r["method"]): r for r in method_means(ratings).iter_rows(named=True)}
    rows = []
    for crit in [*_criteria(ratings), "all"]:
        cells = []
        for m in order:
            r = means.get((crit, m))
            if r is None:
                cells.append("n/a (not rated)")
                continue
            cells.append(f"{r['mean']:.2f} [{r['lo']:.2f}, {r['hi']:.2f}] "
                         f"({r['n_ratings']}/{r['n_dialogues']})")
        rows.append(["**all criteria**" if crit == "all" else crit] + cells)
    lines += md_table(["criterion"] + order, rows)
    if choices is not None and len(choices):
        wr = best_rates(choices)
        lines += ["### Best pick (win rate, Wilson 95% CI)", ""]
        lines += md_table(["method", "picked", "win rate", "95% CI", "chance"], [
            [r.method, f"{r.wins}/{r.appearances}", _f(r.win_rate),
             f"[{_f(r.ci_lo)}, {_f(r.ci_hi)}]", _f(r.chance)]
            for r in _tuples(wr)])
    agr = rater_agreement(ratings)
    lines += ["### Inter-rater agreement (Krippendorff's alpha, ordinal)", ""]
    lines += md_table(["criterion", "alpha", "raters", "units", "units with >= 2 raters"], [
        [r.criterion, _f(r.alpha) if r.alpha is not None and not math.isnan(r.alpha)
         else "n/a (needs 2 raters on one unit and some variation)",
         r.n_raters, r.n_units, r.n_pairable] for r in _tuples(agr)])
    lines += ["### Judge-human agreement (Spearman, human mean vs judge score per dialogue)", ""]
    jh = judge_human(ratings, eval_scores) if eval_scores is not None and len(eval_scores) else None
    if jh is None or jh.is_empty():
        return lines + ["n/a (no judge scores for the rated dialogues in eval_scores)", ""]
    return lines + md_table(["judge", "criterion", "dialogues", "spearman"], [
        [r.judge, r.criterion, r.n_dialogues,
         _f(r.spearman) if r.spearman is not None and not math.isnan(r.spearman)
         else "n/a (< 3 dialogues or constant)"] for r in _tuples(jh)])
