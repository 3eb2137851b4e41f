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

import numpy as np
import pandas as pd

from mascot_dag.lib.human import CRITERIA
from mascot_dag.lib.report_sections import md_table
from mascot_dag.lib.stats import paired_cluster_bootstrap, spearman, win_rates

ORDER = [c for _, c, _ in CRITERIA]


def _criteria(ratings: pd.DataFrame) -> list[str]:
    found = set(ratings["criterion"])
    return [c for c in ORDER if c in found] + sorted(found - set(ORDER))


def method_means(ratings: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per (criterion, method) plus criterion 'all' per method: mean, lo, hi,
    n_ratings, n_dialogues, n_raters."""
    rows = []
    for crit, g in [*((c, ratings[ratings["criterion"] == c]) for c in _criteria(ratings)),
                    ("all", ratings)]:
        for method, m in sorted(g.groupby("method"), key=lambda kv: kv[0]):
            # the cluster bootstrap of `stats` resamples dialogues; its "differences" are here
            # plain scores (the mean of a resample is all we need from it)
            b = paired_cluster_bootstrap(m["dialogue_id"].tolist(),
                                         m["score"].astype(float).tolist(), n=n_boot, seed=seed)
            rows.append({"criterion": crit, "method": method, "mean": b["mean"], "lo": b["lo"],
                         "hi": b["hi"], "n_ratings": len(m),
                         "n_dialogues": int(b["n_clusters"]), "n_raters": m["rater"].nunique()})
    return pd.DataFrame(rows, columns=["criterion", "method", "mean", "lo", "hi", "n_ratings",
                                       "n_dialogues", "n_raters"])


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


def rater_agreement(ratings: pd.DataFrame) -> pd.DataFrame:
    """Per criterion: alpha (ordinal), raters, units (dialogue within item) rated by >= 2 raters."""
    rows = []
    for crit in _criteria(ratings):
        g = ratings[ratings["criterion"] == crit]
        grid = g.pivot_table(index="rater", columns=["item_id", "dialogue_id"], values="score",
                             aggfunc="mean")
        pairable = int((grid.notna().sum(axis=0) >= 2).sum())
        rows.append({"criterion": crit, "alpha": alpha_ordinal(grid.to_numpy(dtype=float)),
                     "n_raters": grid.shape[0], "n_units": grid.shape[1], "n_pairable": pairable})
    return pd.DataFrame(rows, columns=["criterion", "alpha", "n_raters", "n_units", "n_pairable"])


def judge_human(ratings: pd.DataFrame, eval_scores: pd.DataFrame) -> pd.DataFrame:
    """Per judge and criterion: Spearman(human mean per dialogue, judge score), n dialogues."""
    human = ratings.groupby(["dialogue_id", "criterion"])["score"].mean().rename("human")
    js = eval_scores[(eval_scores["judge"] != "metric") & (eval_scores["level"] != "automatic")]
    js = js.dropna(subset=["value"])
    js = js.groupby(["judge", "dialogue_id", "criterion"])["value"].mean().reset_index()
    both = js.merge(human.reset_index(), on=["dialogue_id", "criterion"], how="inner")
    rows = []
    for judge in sorted(both["judge"].unique()):
        for crit in _criteria(ratings):
            g = both[(both["judge"] == judge) & (both["criterion"] == crit)]
            rows.append({"judge": judge, "criterion": crit, "n_dialogues": len(g),
                         "spearman": spearman(g["human"].tolist(), g["value"].tolist())})
    return pd.DataFrame(rows, columns=["judge", "criterion", "n_dialogues", "spearman"])


def best_rates(choices: pd.DataFrame) -> pd.DataFrame:
    recs = [(f"{r.item_id}|{r.rater}", r.shown_order, r.best_method) for r in choices.itertuples()]
    return win_rates(recs)


def _f(x: float | None, d: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def human_section(ratings: pd.DataFrame | None, choices: pd.DataFrame | None,
                  eval_scores: pd.DataFrame | None, methods: list[str] | None = None) -> list[str]:
    """Markdown lines of the report's human-evaluation section (one line when nobody rated)."""
    head = ["## Human evaluation (blind three-way, 1-5)", ""]
    if ratings is None or ratings.empty:
        return head + ["n/a (no human ratings yet: `mascot rate` collects them)", ""]
    found = set(ratings["method"])
    order = [m for m in (methods or []) if m in found] + sorted(found - set(methods or []))
    lines = head + [
        f"{ratings['rater'].nunique()} raters, {ratings['item_id'].nunique()} items, "
        f"{ratings['dialogue_id'].nunique()} dialogues, {len(ratings)} ratings. Methods were "
        "hidden and shown in a per-rater shuffled order. Cells: mean [95% bootstrap CI over "
        "dialogues] (n ratings / dialogues).", ""]
    means = method_means(ratings)
    rows = []
    for crit in [*_criteria(ratings), "all"]:
        cells = []
        for m in order:
            r = means[(means["criterion"] == crit) & (means["method"] == m)]
            if r.empty:
                cells.append("n/a (not rated)")
                continue
            r = r.iloc[0]
            cells.append(f"{r['mean']:.2f} [{r['lo']:.2f}, {r['hi']:.2f}] "
                         f"({r['n_ratings']}/{r['n_dialogues']})")
        rows.append(["**all criteria**" if crit == "all" else crit] + cells)
    lines += md_table(["criterion"] + order, rows)
    if choices is not None and len(choices):
        wr = best_rates(choices)
        lines += ["### Best pick (win rate, Wilson 95% CI)", ""]
        lines += md_table(["method", "picked", "win rate", "95% CI", "chance"], [
            [r.method, f"{r.wins}/{r.appearances}", _f(r.win_rate),
             f"[{_f(r.ci_lo)}, {_f(r.ci_hi)}]", _f(r.chance)] for r in wr.itertuples()])
    agr = rater_agreement(ratings)
    lines += ["### Inter-rater agreement (Krippendorff's alpha, ordinal)", ""]
    lines += md_table(["criterion", "alpha", "raters", "units", "units with >= 2 raters"], [
        [r.criterion, _f(r.alpha) if r.alpha is not None and not pd.isna(r.alpha)
         else "n/a (needs 2 raters on one unit and some variation)",
         r.n_raters, r.n_units, r.n_pairable] for r in agr.itertuples()])
    lines += ["### Judge-human agreement (Spearman, human mean vs judge score per dialogue)", ""]
    jh = judge_human(ratings, eval_scores) if eval_scores is not None and len(eval_scores) else None
    if jh is None or jh.empty:
        return lines + ["n/a (no judge scores for the rated dialogues in eval_scores)", ""]
    return lines + md_table(["judge", "criterion", "dialogues", "spearman"], [
        [r.judge, r.criterion, r.n_dialogues,
         _f(r.spearman) if r.spearman is not None and not pd.isna(r.spearman)
         else "n/a (< 3 dialogues or constant)"] for r in jh.itertuples()])
