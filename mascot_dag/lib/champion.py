"""The overall evaluation score of a method and the champion decision built on it.

Overall score, exactly: take the `eval_scores` rows of the method whose level is 'agent' or
'collective' (judge scores; automatic metrics are excluded because their directions and scales
differ), drop failed judgments (value NULL), map each 1-5 value to 0-100 with `types.to_100`,
average per (level, criterion) over dialogues and judges, then take the unweighted mean of those
criterion means. Each criterion counts once, however many dialogues or judges scored it; with the
full rubric that is the mean of 9 criteria (5 agent-level + 4 collective).

The champion (MLflow alias `champion`) moves only when the candidate's overall score beats the
current champion's by more than `min_improvement` points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from mascot_dag.lib.types import to_100

JUDGE_LEVELS = ("agent", "collective")


def judge_rows_100(eval_scores: pd.DataFrame) -> pd.DataFrame:
    """The judge-score rows (levels agent/collective, value not NULL) with `value` on 0-100.

    Raises when a judge value lies outside 1-5: eval_scores stores judges' raw 1-5 scores, and a
    row already on 0-100 would otherwise be stretched silently.
    """
    df = eval_scores[eval_scores["level"].isin(JUDGE_LEVELS)].dropna(subset=["value"]).copy()
    bad = df[(df["value"] < 1.0) | (df["value"] > 5.0)]
    if len(bad):
        r = bad.iloc[0]
        raise ValueError(
            f"eval_scores row (method={r['method']}, dialogue_id={r['dialogue_id']}, "
            f"judge={r['judge']}, criterion={r['criterion']}) has value {r['value']}; judge scores "
            "must be stored on the judges' 1-5 scale (reports convert them to 0-100)"
        )
    df["value"] = df["value"].map(to_100)
    return df


def criterion_means(eval_scores: pd.DataFrame, method: str) -> pd.Series:
    """Mean 0-100 score per (level, criterion) of one method (empty when it has no judge rows)."""
    df = judge_rows_100(eval_scores[eval_scores["method"] == method])
    return df.groupby(["level", "criterion"])["value"].mean()


def overall_score(eval_scores: pd.DataFrame, method: str) -> float | None:
    """Unweighted mean of the method's per-criterion 0-100 means (see module doc); None if none."""
    means = criterion_means(eval_scores, method)
    return float(means.mean()) if len(means) else None


def dialogue_overall(eval_scores: pd.DataFrame) -> pd.DataFrame:
    """Per-dialogue overall scores (method, dialogue_id, overall), same recipe within a dialogue:
    mean over judges per (level, criterion), then the mean of those. Used for bootstrap CIs."""
    df = judge_rows_100(eval_scores)
    per_crit = df.groupby(["method", "dialogue_id", "level", "criterion"])["value"].mean()
    out = per_crit.groupby(["method", "dialogue_id"]).mean().rename("overall").reset_index()
    return out


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str
    candidate: float | None = None
    current: float | None = None


def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.2f}"


def decide_champion(
    candidate_overall: float | None,
    current_overall: float | None,
    min_improvement: float = 0.0,
) -> Decision:
    """Promote when there is no current champion, or candidate > current + min_improvement.

    A candidate without a score (no judge rows, all judgments failed) is never promoted. The reason
    always states both numbers (0-100 overall scores).
    """
    if min_improvement < 0:
        raise ValueError(f"min_improvement must be >= 0 points, got {min_improvement}")
    if candidate_overall is not None and math.isnan(candidate_overall):
        candidate_overall = None
    if current_overall is not None and math.isnan(current_overall):
        current_overall = None
    cand, cur = _fmt(candidate_overall), _fmt(current_overall)
    if candidate_overall is None:
        return Decision(
            False,
            f"not promoted: the candidate has no overall score (candidate {cand}, current {cur})",
            candidate_overall,
            current_overall,
        )
    if current_overall is None:
        return Decision(
            True,
            f"promoted: no current champion (candidate {cand}, current {cur})",
            candidate_overall,
            current_overall,
        )
    threshold = current_overall + min_improvement
    if candidate_overall > threshold:
        return Decision(
            True,
            f"promoted: candidate {cand} > current {cur} + min_improvement {min_improvement:g}",
            candidate_overall,
            current_overall,
        )
    return Decision(
        False,
        f"kept current champion: candidate {cand} <= current {cur} + min_improvement "
        f"{min_improvement:g}",
        candidate_overall,
        current_overall,
    )
