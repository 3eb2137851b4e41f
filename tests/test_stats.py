"""Report statistics against values known by hand or from the literature."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest

from mascot_dag.lib.evaluation.stats import (
    bootstrap_ci,
    judge_agreement,
    mean_std,
    spearman,
    wilson_ci,
    win_rates,
)


def test_mean_std():
    assert mean_std([1, 2, 3, None]) == (2.0, 1.0)
    assert mean_std([4]) == (4.0, 0.0)
    assert all(math.isnan(x) for x in mean_std([]))


def test_bootstrap_ci_contains_mean_and_shrinks():
    rng = np.random.default_rng(1)
    small, large = rng.normal(50, 10, 20), rng.normal(50, 10, 2000)
    lo_s, hi_s = bootstrap_ci(small)
    lo_l, hi_l = bootstrap_ci(large)
    assert lo_s < small.mean() < hi_s
    assert lo_l < large.mean() < hi_l
    # width ~ 2*1.96*10/sqrt(n): ~8.8 for n=20, ~0.9 for n=2000
    assert (hi_l - lo_l) < (hi_s - lo_s) / 5
    assert bootstrap_ci(small) == (lo_s, hi_s)  # seeded: reproducible
    assert bootstrap_ci([7.0]) == (7.0, 7.0)
    # a statistic without axis= takes the per-resample path; same seed, same resamples
    lo_m, hi_m = bootstrap_ci(small, stat=lambda a: float(np.mean(a)))
    assert (lo_m, hi_m) == pytest.approx((lo_s, hi_s))
    assert all(math.isnan(x) for x in bootstrap_ci([None]))


def test_wilson_known_values():
    lo, hi = wilson_ci(5, 10)
    assert (round(lo, 3), round(hi, 3)) == (0.237, 0.763)
    lo, hi = wilson_ci(0, 10)  # centre = half = (z^2/20)/(1+z^2/10) = 0.1388
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert all(math.isnan(x) for x in wilson_ci(0, 0))


def _by(df: pl.DataFrame, key: str) -> dict:
    return {r[key]: r for r in df.iter_rows(named=True)}


def test_win_rates_three_way():
    shown = ["mascot", "zero_shot", "few_shot"]
    records = [
        ("c1", shown, "mascot"),
        ("c2", shown[::-1], "mascot"),
        ("c3", shown, "zero_shot"),
        ("c4", shown, None),  # judge failed: not an appearance
    ]
    wr = _by(win_rates(records), "method")
    assert wr["mascot"]["wins"] == 2 and wr["mascot"]["appearances"] == 3
    assert wr["mascot"]["failed"] == 1
    assert wr["mascot"]["win_rate"] == pytest.approx(2 / 3)
    assert wr["few_shot"]["win_rate"] == 0.0
    assert wr["zero_shot"]["chance"] == pytest.approx(1 / 3)
    lo, hi = wilson_ci(2, 3)
    assert (wr["mascot"]["ci_lo"], wr["mascot"]["ci_hi"]) == (lo, hi)
    assert list(win_rates(records)["method"])[0] == "mascot"  # sorted best first


def test_win_rates_from_comparisons_table_and_errors():
    table = pl.DataFrame(
        {
            "comparison_id": ["c1", "c2"],
            "shown_order": [json.dumps(["a", "b", "c"]), json.dumps(["c", "a", "b"])],
            "winner": ["a", None],
        }
    )
    wr = _by(win_rates(table), "method")
    assert wr["a"]["wins"] == 1 and wr["a"]["appearances"] == 1
    assert wr["b"]["failed"] == 1
    with pytest.raises(ValueError, match="c9: winner 'z'"):
        win_rates([("c9", ["a", "b"], "z")])
    with pytest.raises(ValueError, match="c1 appears twice"):
        win_rates([("c1", ["a", "b"], "a"), ("c1", ["a", "b"], "b")])


def test_spearman_known_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 45]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # d = 0, 1, 1 -> 1 - 6*2 / (3*(9-1)) = 0.5
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert spearman([1, 2, None, 3], [1, 3, 5, 2]) == pytest.approx(0.5)
    assert spearman([1, 2], [1, 2]) is None
    assert spearman([1, 2, 3], [5, 5, 5]) is None


def _scores(judge: str, values: list[float], criterion: str = "fidelity") -> list[dict]:
    return [
        {"method": "mascot", "dialogue_id": f"d{k}", "level": "collective", "judge": judge,
         "criterion": criterion, "value": v, "higher_is_better": True}
        for k, v in enumerate(values)
    ]  # fmt: skip


def test_judge_agreement_pairs_and_criteria():
    rows = _scores("llm", [1, 2, 3, 4]) + _scores("embedded", [4, 3, 2, 1])
    rows += _scores("llm", [1, 2, 3], "engagement_contribution")
    rows += _scores("embedded", [2, 3, 5], "engagement_contribution")
    rows += [{**r, "judge": "metric", "level": "automatic"} for r in _scores("m", [9, 9, 9, 9])]
    agr = judge_agreement(pl.DataFrame(rows))
    assert agr["judge_a"].unique().to_list() == ["embedded"]  # metric rows are not a judge
    agr = _by(agr, "criterion")
    assert agr["fidelity"]["spearman"] == pytest.approx(-1.0)
    assert agr["engagement_contribution"]["spearman"] == pytest.approx(1.0)
    assert agr["all"]["n_items"] == 7
    single = judge_agreement(pl.DataFrame(_scores("llm", [1, 2, 3])))
    assert single.is_empty()
