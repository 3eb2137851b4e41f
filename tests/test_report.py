"""The report end to end from hand-made tables, the overall score and the champion decision."""

from __future__ import annotations

import pandas as pd
import pytest

from mascot_dag.lib.champion import decide_champion, dialogue_overall, overall_score
from mascot_dag.lib.report import ReportInputs, build_report
from mascot_dag.lib.stats import win_rates
from mascot_dag.lib.types import AGENT_CRITERIA, COLLECTIVE_CRITERIA

# Per-dialogue judge score (1-5) of every criterion: 0-100 = [75, 100, 75, 100] for mascot etc.
RAW = {"mascot": [4, 5, 4, 5], "mascot_p": [3, 4, 3, 4], "zero_shot": [2, 3, 2, 3]}
PROFILES = ["INTJ", "ENFP", "INTJ", "ENFP"]


def _tables(judges: tuple[str, ...] = ("llm", "embedded")) -> tuple[pd.DataFrame, pd.DataFrame]:
    scores, dialogues = [], []
    for method, values in RAW.items():
        for k, v in enumerate(values):
            did = f"{method}-{k}"
            dialogues.append({"dialogue_id": did, "method": method, "user_profile": PROFILES[k]})
            for judge in judges:
                for level, crits in (
                    ("agent", AGENT_CRITERIA),
                    ("collective", COLLECTIVE_CRITERIA),
                ):
                    scores += [dict(method=method, dialogue_id=did, level=level, judge=judge,
                                    criterion=c, value=float(v), higher_is_better=True)
                               for c in crits]  # fmt: skip
            auto = dict(
                level="automatic", judge="metric", criterion="self_bleu", value=0.1 * (k + 1)
            )
            scores.append(dict(method=method, dialogue_id=did, higher_is_better=False, **auto))
    return pd.DataFrame(scores), pd.DataFrame(dialogues)


def test_overall_score_is_mean_of_criteria_on_0_100():
    scores, _ = _tables()
    assert overall_score(scores, "mascot") == pytest.approx(87.5)  # mean(75, 100, 75, 100)
    assert overall_score(scores, "zero_shot") == pytest.approx(37.5)
    assert overall_score(scores, "few_shot") is None
    # one criterion scored by many dialogues still counts once: 8 criteria at 100 + 1 at 0 -> 8/9
    rows = [dict(method="m", dialogue_id="d", level="agent", judge="j", criterion=c, value=5.0)
            for c in AGENT_CRITERIA[:4] + COLLECTIVE_CRITERIA]  # fmt: skip
    rows += [dict(method="m", dialogue_id=f"d{k}", level="agent", judge="j",
                  criterion=AGENT_CRITERIA[4], value=1.0) for k in range(10)]  # fmt: skip
    assert overall_score(pd.DataFrame(rows), "m") == pytest.approx(100 * 8 / 9)
    per = dialogue_overall(scores).set_index("dialogue_id")["overall"]
    assert per["mascot-1"] == pytest.approx(100.0)


def test_judge_values_off_the_1_5_scale_are_rejected():
    scores, _ = _tables()
    scores.loc[0, "value"] = 87.0
    with pytest.raises(ValueError, match="dialogue_id=mascot-0.*1-5 scale"):
        overall_score(scores, "mascot")


def test_champion_decision_both_directions_and_first_champion():
    up = decide_champion(80.0, 70.0, min_improvement=5.0)
    assert up.promote and "80.00" in up.reason and "70.00" in up.reason
    down = decide_champion(72.0, 70.0, min_improvement=5.0)
    assert not down.promote and "72.00" in down.reason and "70.00" in down.reason
    tie = decide_champion(70.0, 70.0)
    assert not tie.promote
    first = decide_champion(40.0, None)
    assert first.promote and "no current champion" in first.reason and "40.00" in first.reason
    assert not decide_champion(None, 70.0).promote
    with pytest.raises(ValueError, match="min_improvement"):
        decide_champion(1.0, 0.0, min_improvement=-1)


def test_report_end_to_end(tmp_path):
    scores, dialogues = _tables()
    shown = ["mascot", "mascot_p", "zero_shot"]
    wr = win_rates([(f"c{k}", shown, "mascot" if k < 3 else "zero_shot") for k in range(4)])
    prov = {"speaker_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "adapters": {"anchor": "persona-anchor v3"}, "judges": ["llm", "embedded"],
            "sizes": {"eval_contexts": 4}}  # fmt: skip
    decision = decide_champion(overall_score(scores, "mascot"), 80.0)
    res = build_report(
        ReportInputs(scores, dialogues, wr, prov, decision, methods=[*RAW, "few_shot"]),
        tmp_path / "rep",
    )
    md = res.markdown.read_text(encoding="utf-8")
    for method in [*RAW, "few_shot"]:
        assert method in md
    assert "persona-anchor v3" in md and "SmolLM2-135M-Instruct" in md
    assert "self_bleu ↓" in md
    assert "87.50" in md and "80.00" in md  # the champion reason states both numbers
    assert "n/a (no judge rows)" in md  # few_shot has no rows
    assert "INTJ" in md and "ENFP" in md
    assert "mascot_c" in md and "n/a for mascot_c" in md
    assert res.headline["mascot"] == pytest.approx(87.5)
    assert res.headline["few_shot"] is None
    names = {p.name for p in res.plots}
    assert names == {"criteria_by_method.png", "mbti_heatmap.png", "win_rates.png"}
    for p in res.plots:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000


def test_report_with_missing_pieces_says_na(tmp_path):
    scores, dialogues = _tables(judges=("embedded",))
    res = build_report(
        ReportInputs(scores, dialogues.drop(columns=["user_profile"])), tmp_path / "r1"
    )
    md = res.markdown.read_text(encoding="utf-8")
    assert "n/a (needs two judges; only embedded scored)" in md
    assert "n/a (no completed comparisons)" in md
    assert "n/a (no champion decision given)" in md
    assert {p.name for p in res.plots} == {"criteria_by_method.png"}
    empty = build_report(ReportInputs(pd.DataFrame(), pd.DataFrame()), tmp_path / "r2")
    text = empty.markdown.read_text(encoding="utf-8")
    assert "n/a (no judge scores in eval_scores)" in text and empty.plots == []


def test_report_refuses_inverted_metric_direction(tmp_path):
    scores, dialogues = _tables()
    scores.loc[scores["criterion"] == "self_bleu", "higher_is_better"] = True
    with pytest.raises(ValueError, match="self_bleu"):
        build_report(ReportInputs(scores, dialogues), tmp_path)
