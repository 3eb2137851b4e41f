"""The judge panel: profiles' panels, the training rule, the independent three-way picker, judge
agreement, and a panel of the embedded judge plus an LLM judge served by `mascot serve`."""

from __future__ import annotations

import dataclasses
import json
import math
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest
from conftest import mascot_serve

from mascot_dag.lib.judges.agreement import agreement, agreement_markdown
from mascot_dag.lib.judges.embedded import EmbeddedJudge
from mascot_dag.lib.judges.metric_picker import MetricPicker
from mascot_dag.lib.judges.panel import MeanJudge, training_judge, training_judgments
from mascot_dag.lib.types import AGENT_CRITERIA, COLLECTIVE_CRITERIA


def _long(judge: str, values: list, criterion: str = "c") -> list[dict]:
    return [{"item": k, "judge": judge, "criterion": criterion, "value": v}
            for k, v in enumerate(values)]


def test_agreement_rho_n_and_explicit_nan():
    rows = _long("a", [1, 2, 3, 4, 5]) + _long("b", [1, 3, 2, 5, None])  # b failed on item 4
    rows += _long("a", [2, 2, 4], "d") + _long("b", [3, 3, 3], "d")  # b constant on d
    rows += _long("a", [1, 2], "e") + _long("b", [2, 1], "e")  # only 2 shared items
    table = agreement(pl.DataFrame(rows), ["item"])
    agr = {r["criterion"]: r for r in table.iter_rows(named=True)}
    assert agr["c"]["n"] == 4  # the failed (NULL) score is not a shared item
    assert agr["c"]["rho"] == pytest.approx(0.8)
    assert math.isnan(agr["d"]["rho"]) and agr["d"]["note"] == "constant: b"
    assert math.isnan(agr["e"]["rho"]) and "fewer than 3" in agr["e"]["note"]
    assert agr["all"]["n"] == 4 + 3 + 2
    md = agreement_markdown(table)
    assert "n/a (constant: b)" in md and "0.80" in md
    # a status column marks failures too; one judge alone gives an empty table
    one = pl.DataFrame(_long("a", [1, 2, 3])).with_columns(status=pl.lit("ok"))
    assert agreement(one, ["item"]).is_empty()
    # a judge that failed everywhere still has its rows: n = 0 says so
    failed = pl.concat([one, pl.DataFrame(_long("b", [2, 3, 1]))
                        .with_columns(status=pl.lit("failed"))])
    zero = agreement(failed, ["item"])
    assert zero["criterion"].to_list() == ["all", "c"] and (zero["n"] == 0).all()
    assert zero["note"].str.contains("fewer than 3 shared items").all()
    with pytest.raises(ValueError, match="lacks column"):
        agreement(one, ["nope"])


def test_training_rule_selects_judges_and_rows():
    emb = EmbeddedJudge()  # loads nothing until it scores
    assert training_judge([emb], "mean") is emb
    assert training_judge([emb], "embedded") is emb
    with pytest.raises(ValueError, match="not in the panel"):
        training_judge([emb], "llm")
    with pytest.raises(ValueError, match="unique"):
        training_judge([emb, EmbeddedJudge()], "mean")
    judg = pl.DataFrame({"target_id": ["t", "t"], "judge": ["embedded", "llm"],
                         "criterion": "consistency", "score": [2.0, 4.0], "status": "ok"})
    assert training_judgments(judg, "embedded")["judge"].to_list() == ["embedded"]
    assert len(training_judgments(judg, "mean")) == 2


def test_metric_picker_prefers_distinct_voices_over_an_echo():
    picker = MetricPicker(persona_sets=("support",))  # one set: half the classifier fitting
    user = {"speaker": "user", "text": "My dog died last week and the house feels empty."}
    echo = [user,
            {"speaker": "anchor", "text": "My dog died last week and the house feels empty."},
            {"speaker": "catalyst", "text": "My dog died last week and the house feels empty."}]
    distinct = [user,
                {"speaker": "anchor", "text": "That sounds so painful. Of course the quiet hurts; "
                 "you loved her, and missing her makes sense."},
                {"speaker": "catalyst", "text": "What do you think she would want you to "
                 "remember about the years you had together?"}]
    assert picker.pick_best("ctx", [echo, distinct]) == 1
    assert picker.pick_best("ctx", [distinct, echo]) == 0
    assert picker.pick_best("ctx", [[user], [user]]) is None  # no agent turn: nothing to pick


def test_profiles_build_their_panels(monkeypatch):
    from mascot_dag.profiles import judge_panel

    monkeypatch.delenv("MASCOT_JUDGE_BASE_URL", raising=False)
    for name in ("embedded", "study", "tiny"):
        p = judge_panel(name)
        assert p.embedded is not None and p.llm is None
        assert (p.training_judge, p.three_way_judge) == ("embedded", "metric")
    paper = judge_panel("paper")
    assert paper.llm is not None and paper.training_judge == "mean"
    monkeypatch.setenv("MASCOT_JUDGE_BASE_URL", "http://127.0.0.1:9/v1")
    p = judge_panel("embedded")
    # an LLM judge added by the environment evaluates and picks, the embedded judge still trains
    assert p.llm is not None and p.training_judge == "embedded" and p.three_way_judge == "llm"


# ---- a real panel: embedded judge + `mascot serve` as the OpenAI-compatible LLM judge ---------
METHODS = ("mascot", "zero_shot", "few_shot")


@pytest.fixture
def served_model():
    """`mascot serve` on a free loopback port (the real tiny embedded model)."""
    # the judge's client and parsing are under test: the quick-starting transformers engine
    with mascot_serve("--engine", "transformers") as url:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as r:
            model = json.load(r)["data"][0]["id"]  # the server checks the model name
        yield f"{url}/v1", model


def _prepare_store(home: Path, agent_turns: int = 2):
    """personas (the packaged cards) + one eval context with three methods' dialogues."""
    from importlib import resources

    from mascot_dag.lib.data import load_empathetic_dialogues
    from mascot_dag.lib.data.personas import load_personas
    from mascot_dag.lib.storage.tables import contexts_frame, personas_frame
    from mascot_dag.resources.store import DuckDBStore

    store = DuckDBStore(path=str(home / "mascot.duckdb"))
    cards = load_personas()
    store.replace("personas", personas_frame(cards, {c.persona_id: "packaged" for c in cards}))

    csv = resources.files("mascot_dag") / "data" / "empatheticdialogues" / "demo.csv"
    ctx = dataclasses.replace(load_empathetic_dialogues(str(csv)).contexts[0], split="eval")
    store.replace("contexts", contexts_frame([ctx]))
    replies = {  # two agent turns per method, the personas speaking in turn
        "mascot": ["That sounds really hard; it makes sense you feel shaken.",
                   "What part of it weighs on you most right now?"],
        "zero_shot": ["I am sorry to hear that.", "I am sorry to hear that, it is sad."],
        "few_shot": ["You handled a lot already, and that shows real strength.",
                     "One small step tonight: write down what you need tomorrow."],
    }
    dialogues, turns = [], []
    for m in METHODS:
        did = f"eval:{m}:{ctx.context_id}"
        dialogues.append({"dialogue_id": did, "stage": "eval", "method": m,
                          "context_id": ctx.context_id, "mode": "support", "user_profile": "INFJ",
                          "seed": 0, "n_turns": 1 + agent_turns, "models": json.dumps({})})
        texts = [("user", "user", ctx.turns[0]["text"]), ("agent", "anchor", replies[m][0]),
                 ("agent", "catalyst", replies[m][1])][: 1 + agent_turns]
        turns += [{"dialogue_id": did, "turn_idx": k, "role": role, "speaker": sp, "text": t,
                   "model_used": "test"} for k, (role, sp, t) in enumerate(texts)]
    store.replace_many([("dialogues", pl.DataFrame(dialogues), None, None),
                        ("turns", pl.DataFrame(turns), None, None)])
    return store


@pytest.mark.slow
def test_panel_of_embedded_and_served_llm_judge(home, served_model):
    """eval_scores holds rows of both judges; with structured outputs (the judge sends each
    reply's JSON schema, `mascot serve` enforces it) EVERY LLM judgment is ok, so the agreement
    table is filled (n > 0) for every criterion; the independent picker fills the three-way
    comparisons."""
    import dagster as dg

    from mascot_dag.assets.evaluation import eval_scores, three_way_comparisons
    from mascot_dag.resources.judge import (
        EmbeddedJudgeResource,
        JudgePanelResource,
        LLMJudgeResource,
    )
    from mascot_dag.resources.llm import OpenAIChatResource
    from mascot_dag.resources.settings import LineageSettings

    # one agent turn per dialogue (3 agent-level + 3 block requests to the LLM judge) and no
    # repair. Without structured outputs a 135M model wrote valid JSON for 0 of these 27
    # judgments (it repeats the persona card). 12-char rationales keep replies short (~110
    # tokens); 345 tokens is the worst case (every token one character), so no reply is cut.
    store = _prepare_store(home, agent_turns=1)
    base_url, model = served_model
    llm = LLMJudgeResource(chat=OpenAIChatResource(base_url=base_url, model=model),
                           max_new_tokens=345, max_retries=0, rationale_max_chars=12)
    panel = JudgePanelResource(embedded=EmbeddedJudgeResource(), llm=llm,
                               training_judge="embedded", three_way_judge="metric")
    t0 = time.monotonic()
    res = dg.materialize([eval_scores, three_way_comparisons],
                         resources={"store": store, "judges": panel,
                                    "settings": LineageSettings(block_size=4)})
    assert res.success
    scores = store.frame("SELECT * FROM eval_scores WHERE level <> 'automatic'")
    assert set(scores["judge"]) == {"embedded", "llm"}
    for j in ("embedded", "llm"):
        mine = scores.filter(pl.col("judge") == j)
        assert set(mine["method"]) == set(METHODS)
        assert set(mine["criterion"]) == set(AGENT_CRITERIA) | set(COLLECTIVE_CRITERIA)
        # no NULL (failed) judgment: structured, the LLM judge never fails either
        assert mine["value"].null_count() == 0 and mine["value"].is_between(1, 5).all()

    agr = agreement(scores, ["method", "dialogue_id", "level"])
    assert set(agr["criterion"]) == {"all", *AGENT_CRITERIA, *COLLECTIVE_CRITERIA}
    # a judge whose every value is NULL keeps its column
    wide = scores.pivot(on="judge", index=["method", "dialogue_id", "level", "criterion"],
                        values="value", aggregate_function="first")
    both = wide.select("embedded", "llm").drop_nulls()
    assert agr.filter(pl.col("criterion") == "all")["n"].item() == len(both)
    for r in agr.iter_rows(named=True):
        assert math.isnan(r["rho"]) == bool(r["note"])  # NaN only with its reason
        assert r["n"] > 0, r  # filled: every criterion has items both judges scored
    meta = res.asset_materializations_for_node("eval_scores")[0].metadata
    assert "judge A" in meta["judge_agreement"].value or "n/a" in meta["judge_agreement"].value
    assert meta["judge_agreement_n"].value["embedded~llm/all"] == len(both)

    comps = store.frame("SELECT * FROM comparisons")
    assert len(comps) == 1 and set(comps["judge"]) == {"metric"}
    assert comps["winner"][0] in METHODS and comps["status"][0] == "ok"

    # the training mean over the panel: each criterion is the mean of the judges' ok scores
    mean = MeanJudge(panel.judges())
    from mascot_dag.lib.data.personas import load_personas, personas_of_set
    from mascot_dag.lib.judges.base import BlockItem

    roster = personas_of_set(load_personas(), "support")
    block = [BlockItem("I lost my job today.", roster,
                       [{"speaker": "user", "text": "I lost my job today."},
                        {"speaker": "anchor", "text": "That is a heavy shock; it's okay to "
                         "feel lost."}])]
    per = [j.score_blocks(block)[0] for j in panel.judges()]
    for k, s in enumerate(mean.score_blocks(block)[0]):
        oks = [p[k].score for p in per if p[k].status == "ok"]
        assert s.status == "ok" and s.score == pytest.approx(sum(oks) / len(oks))
    llm_rows = scores.filter(pl.col("judge") == "llm")
    print(f"\npanel eval: {len(both)} items scored by both judges of {len(wide)}; LLM judge "
          f"valid judgments {llm_rows['value'].is_not_null().sum()}/{len(llm_rows)}; "
          f"{time.monotonic() - t0:.0f}s\n{agreement_markdown(agr)}")
