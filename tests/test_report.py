"""The report end to end from hand-made tables, the overall score and the champion decision."""

from __future__ import annotations

import polars as pl
import pytest

from mascot_dag.lib.evaluation.champion import dialogue_overall, gate_decision, overall_score
from mascot_dag.lib.evaluation.paper import published_table
from mascot_dag.lib.evaluation.report import ReportInputs, build_report
from mascot_dag.lib.evaluation.stats import win_rates
from mascot_dag.lib.types import AGENT_CRITERIA, COLLECTIVE_CRITERIA

# Per-dialogue judge score (1-5) of every criterion: 0-100 = [75, 100, 75, 100] for mascot etc.
RAW = {"mascot": [4, 5, 4, 5], "mascot_p": [3, 4, 3, 4], "zero_shot": [2, 3, 2, 3]}
PROFILES = ["INTJ", "ENFP", "INTJ", "ENFP"]
# context k of every method: ED positive, ED negative, QMSum academic, ED positive
CONTEXTS = pl.DataFrame({
    "context_id": ["c0", "c1", "c2", "c3"],
    "source": ["empatheticdialogues", "empatheticdialogues", "qmsum", "empatheticdialogues"],
    "domain": ["emotional_support", "emotional_support", "academic", "emotional_support"],
    "valence": ["positive", "negative", None, "positive"],
})


def _tables(judges: tuple[str, ...] = ("llm", "embedded")) -> tuple[pl.DataFrame, pl.DataFrame]:
    scores, dialogues = [], []
    for method, values in RAW.items():
        for k, v in enumerate(values):
            did = f"eval:{method}:c{k}"
            dialogues.append({"dialogue_id": did, "method": method, "context_id": f"c{k}",
                              "user_profile": PROFILES[k]})
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
    return pl.DataFrame(scores), pl.DataFrame(dialogues)


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
    assert overall_score(pl.DataFrame(rows), "m") == pytest.approx(100 * 8 / 9)
    per = dict(dialogue_overall(scores).select("dialogue_id", "overall").rows())
    assert per["eval:mascot:c1"] == pytest.approx(100.0)


def test_judge_values_off_the_1_5_scale_are_rejected():
    scores, _ = _tables()
    scores[0, "value"] = 87.0
    with pytest.raises(ValueError, match="dialogue_id=eval:mascot:c0.*1-5 scale"):
        overall_score(scores, "mascot")


def test_report_end_to_end(tmp_path):
    scores, dialogues = _tables()
    shown = ["mascot", "mascot_p", "zero_shot"]
    wr = win_rates([(f"c{k}", shown, "mascot" if k < 3 else "zero_shot") for k in range(4)])
    prov = {"speaker_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "adapters": {"anchor": "persona-anchor v3"}, "judges": ["llm", "embedded"],
            "sizes": {"eval_contexts": 4}}  # fmt: skip
    decision = gate_decision(scores, champion_exists=False, min_contexts=4)
    res = build_report(
        ReportInputs(scores, dialogues, wr, prov, decision, methods=[*RAW, "few_shot"],
                     contexts=CONTEXTS),
        tmp_path / "rep",
    )
    md = res.markdown.read_text(encoding="utf-8")
    for method in [*RAW, "few_shot"]:
        assert method in md
    assert "persona-anchor v3" in md and "SmolLM2-135M-Instruct" in md
    assert "self_bleu ↓" in md
    # first run: mascot - zero_shot = +50 on each of the 4 contexts -> CI [50, 50], promoted
    assert decision.promote and "**Decision:** promote" in md
    assert "mascot − zero_shot = 50.00 [95% CI 50.00, 50.00], n = 4 paired contexts" in md
    assert "n/a (no judge rows)" in md  # few_shot has no rows
    assert "INTJ" in md and "ENFP" in md
    assert "mascot_c" in md and "n/a for mascot_c" in md
    assert res.headline["mascot"] == pytest.approx(87.5)
    assert res.headline["few_shot"] is None
    names = {p.name for p in res.plots}
    assert names == {"criteria_by_method.png", "mbti_heatmap.png", "win_rates.png",
                     "paper_comparison.png"}
    for p in res.plots:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000


def test_report_with_missing_pieces_says_na(tmp_path):
    scores, dialogues = _tables(judges=("embedded",))
    res = build_report(
        ReportInputs(scores, dialogues.drop("user_profile")), tmp_path / "r1"
    )
    md = res.markdown.read_text(encoding="utf-8")
    assert "n/a (needs two judges; only embedded scored)" in md
    assert "n/a (no completed comparisons)" in md
    assert "n/a (no champion decision given)" in md
    assert {p.name for p in res.plots} == {"criteria_by_method.png"}
    empty = build_report(ReportInputs(pl.DataFrame(), pl.DataFrame()), tmp_path / "r2")
    text = empty.markdown.read_text(encoding="utf-8")
    assert "n/a (no judge scores in eval_scores)" in text and empty.plots == []


def test_report_refuses_inverted_metric_direction(tmp_path):
    scores, dialogues = _tables()
    self_bleu = pl.col("criterion") == "self_bleu"
    scores = scores.with_columns(
        higher_is_better=pl.when(self_bleu).then(True).otherwise(pl.col("higher_is_better")))
    with pytest.raises(ValueError, match="self_bleu"):
        build_report(ReportInputs(scores, dialogues), tmp_path)


def _with_noisy_method(scores: pl.DataFrame) -> pl.DataFrame:
    """few_shot: mascot's scores +1/-1 alternating by context (mean 0 difference, noisy)."""
    noisy = scores.filter(pl.col("method") == "mascot").with_columns(
        method=pl.lit("few_shot"),
        dialogue_id=pl.col("dialogue_id").str.replace("eval:mascot:", "eval:few_shot:",
                                                      literal=True))
    ctx = pl.col("dialogue_id").str.slice(-1).cast(pl.Int64)
    judged = pl.col("level") != "automatic"
    step = ctx.replace_strict({0: 1.0, 1: -1.0, 2: 1.0, 3: -1.0})
    noisy = noisy.with_columns(
        value=pl.when(judged).then(pl.col("value") + step).otherwise(pl.col("value")))
    return pl.concat([scores, noisy])


def test_comparisons_with_mascot_are_paired_with_ci_n_and_mark(tmp_path):
    scores, dialogues = _tables()
    scores = _with_noisy_method(scores)
    md = build_report(ReportInputs(scores, dialogues, contexts=CONTEXTS), tmp_path).markdown
    text = md.read_text(encoding="utf-8")
    # zero_shot is 50 below mascot on every context although contexts differ by 25 points:
    # pairing removes the context spread, so the CI is exact; 4 contexts are still too few for a
    # significance mark (stats.MIN_CLUSTERS_FOR_SIGNIFICANCE)
    assert "+50.0 [+50.0, +50.0] (n=4)" in text and "]* (n=4)" not in text
    # few_shot: differences -25, +25, -25, +25 on 0-100 -> mean 0, CI straddles 0, no mark
    few = [ln for ln in text.splitlines() if ln.startswith("| few_shot | ")][0]
    assert "+0.0 [-25.0, +25.0] (n=4)" in few and "*" not in few
    # the ablation table shows the same paired difference for mascot_p
    assert "62.5 (Δ +25.0 [+25.0, +25.0] (n=4))" in text
    assert "## Paired differences to MASCOT" in text


def test_breakdown_by_valence_and_domain(tmp_path):
    scores, dialogues = _tables()
    text = build_report(ReportInputs(scores, dialogues, contexts=CONTEXTS),
                        tmp_path).markdown.read_text(encoding="utf-8")
    for head in ("### ED positive: agent-level", "### ED negative: collective-level",
                 "### QMSum academic: agent-level"):
        assert head in text
    assert "### ED neutral" not in text  # no neutral context in the data
    # ED positive = contexts c0, c3: mascot 75 and 100 -> 87.5 over 2 dialogues
    assert "| mascot | 2 | 87.5 | 87.5 | 87.5 | 87.5 | 87.5 | 87.5 | – |" in text
    assert "+25.0 (n=1, no CI)" in text  # one context: no interval, no mark
    bare = build_report(ReportInputs(scores, dialogues), tmp_path / "bare")
    bare_text = bare.markdown.read_text(encoding="utf-8")
    assert "n/a (no context metadata" in bare_text
    assert "n/a (no scored EmpatheticDialogues dialogue" in bare_text
    assert "paper_comparison.png" not in {p.name for p in bare.plots}


def test_paper_numbers_beside_ours(tmp_path):
    published = published_table()
    assert set(published["method"].to_list()) == {
        "mascot", "zero_shot", "zero_shot_cot", "few_shot", "few_shot_cot", "sft",
        "self_consistency", "multiagent_esc"}
    scores, dialogues = _tables()
    res = build_report(ReportInputs(scores, dialogues, contexts=CONTEXTS), tmp_path)
    text = res.markdown.read_text(encoding="utf-8")
    # the paper's MASCOT agent overall on positive ED is 76.9; ours over c0, c3 is 87.5 (n=2)
    assert "| agent | mascot | 76.9 | 87.5 (n=2) | 70.5 | 100.0 (n=1) | 76.4 | n/a |" in text
    assert "paper_comparison.png" in {p.name for p in res.plots}
    bad = tmp_path / "bad.csv"
    bad.write_text("level,dataset,split,method,criterion,score_0_100\n"
                   "agent,empatheticdialogues,positive,GPT-9,overall,99\n")
    with pytest.raises(ValueError, match="GPT-9"):
        published_table(bad)


def test_the_report_opens_with_a_verdict_in_plain_words(tmp_path):
    """The first section says what Stage 1, Stage 2 and the gate found, with figures, CI and n;
    small n is called out; a short GRPO run is called a smoke test; missing parts say what to
    run."""
    from mascot_dag.lib.evaluation.verdict import Stage1Figures
    from mascot_dag.lib.stage1.panel import PanelVerdict

    scores, dialogues = _tables()
    decision = gate_decision(scores, champion_exists=False, min_contexts=8)
    probe = PanelVerdict(False, 0.0, 0.0, 0.0, 12, 96, "semantic/training", (), (), ("lexical",),
                         {}, "")
    stage1 = Stage1Figures(probe, "", {"heldout_accuracy": 0.625, "heldout_accuracy_lo": 0.5,
                                       "heldout_accuracy_hi": 0.75},
                           {"anchor": (1.13, 0.70, 4), "beacon": (0.9, 1.1, 4)})
    director = pl.DataFrame([
        {"dialogue_id": f"d{c}", "context_id": f"c{c}", "arm": arm, "valid_first": 1.0,
         "retry_rate": 0.0, "fallback_rate": 0.0, "distinct_speakers": 2.0,
         "speaker_entropy": 1.0, "group_reward": 0.5 + (0.1 if arm == "trained" else 0.0)}
        for c in range(2) for arm in ("base", "trained")])
    res = build_report(ReportInputs(scores, dialogues, champion=decision, stage1=stage1,
                                    director_comparison=director), tmp_path / "rep")
    md = res.markdown.read_text(encoding="utf-8")
    first = md.split("\n## ")[1]
    assert first.startswith("Verdict: did training work?"), md[:500]
    assert "no persona effect is established" in first
    assert "semantic/training" in first and "+0.0 points [+0.0, +0.0]" in first
    assert "n = 96 paired units on 12 held-out contexts" in first
    assert "lexical (below the accuracy bar)" not in first and "do not count" in first
    assert "held-out pair accuracy 0.62 [0.50, 0.75] (chance 0.50)" in first
    assert "anchor 1.13 -> 0.70" in first and "smoke test" in first
    assert "group reward 0.500 -> 0.600" in first and "n = 2 units on 2 contexts" in first
    assert "Too small to conclude anything" in first and "4 paired evaluation contexts" in first
    assert "**Champion**: no champion yet" in first
    bare = build_report(ReportInputs(scores, dialogues), tmp_path / "bare").markdown.read_text(
        encoding="utf-8").split("\n## ")[1]
    assert "Stage 1 (persona alignment)**: not measured" in bare
    assert "materialise director_comparison" in bare and "no decision given" in bare
