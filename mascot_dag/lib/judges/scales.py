"""The embedded judge's scales: how MiniLM cosines and feature values become 1-5 scores.

Shared by the response scorer (`embedded.EmbeddedJudge`) and the block scorer (`blocks`), which
calibrate on the same cosines.
"""

from __future__ import annotations

import numpy as np

from mascot_dag.lib.types import Score

ECHO_COS = 0.9  # a turn this close to an earlier one repeats it (paraphrase level for MiniLM)

GENERIC_ASSISTANT = (  # the default register the personas must stand out from, if alone
    "I'm sorry to hear that. It's important to take care of yourself and reach out for help.",
)


def clip01(x: float) -> float:
    return float(min(1.0, max(0.0, x)))


def ramp(x: float, lo: float, hi: float) -> float:
    """Linear map of x from [lo, hi] onto [0, 1], clipped."""
    return clip01((x - lo) / (hi - lo))


# Calibration of MiniLM cosines (measured on ED situations, see tests/test_judges.py):
# on-topic replies sit at ~0.3-0.6 to their situation, replies to another situation at ~0-0.15.
REL_LO, REL_HI = 0.05, 0.6  # relevance score: cos 0.05 -> 0, 0.6 -> 1
GATE_LO, GATE_HI = 0.05, 0.35  # relevance gate for fidelity and others: on topic from cos 0.35
MARGIN_SCALE = 0.2  # fidelity: margin -0.2 -> 0, 0 (tie with the closest other) -> 0.5, +0.2 -> 1


def to_score(criterion: str, x: float, why: str) -> Score:
    return Score(criterion=criterion, score=round(1.0 + 4.0 * clip01(x), 4), rationale=why)


def unit(v: np.ndarray) -> np.ndarray:
    return v / (np.linalg.norm(v) or 1.0)
