"""The paper's evaluation layout: the OOD condition, persona x MBTI tables, block-level collective
fidelity and the MultiAgentESC-style vote logic (real DuckDB, real MiniLM judge, no model calls
except in tests/test_methods.py)."""

from __future__ import annotations

import polars as pl
import pytest

from mascot_dag.lib.data.split import (
    OOD_SPLIT,
    assign_split,
    assign_split_ood,
    condition_of_split,
    validate_ood,
)
from mascot_dag.lib.evaluation.esc import (
    FALLBACK_STRATEGY,
    has_majority,
    is_simple,
    latest_message,
    parse_strategy,
    vote,
)
from mascot_dag.lib.evaluation.report import ReportInputs, build_report
from mascot_dag.lib.evaluation.report_conditions import persona_mbti_table
from mascot_dag.lib.types import AGENT_CRITERIA, COLLECTIVE_CRITERIA

# ---- OOD split -----------------------------------------------------------------------------------


def test_ood_split_holds_out_valences_emotions_and_domains():
    kw = dict(ood_valences=["neutral", "Lonely"], ood_domains=["committee"])
    assert assign_split_ood("a", "empatheticdialogues", "neutral", "nostalgic", "x", **kw) == "ood"
    assert assign_split_ood("b", "empatheticdialogues", "negative", "lonely", "x", **kw) == "ood"
    assert assign_split_ood("c", "qmsum", None, None, "committee", **kw) == OOD_SPLIT
    # everything else keeps its hash split, whatever is held out
    for cid, src, val, dom in (("d", "empatheticdialogues", "positive", "emotional_support"),
                               ("e", "qmsum", None, "product")):
        assert assign_split_ood(cid, src, val, "joyful", dom, **kw) == assign_split(cid)
    # off: no context is OOD
    ids = [f"ctx{i}" for i in range(200)]
    assert {assign_split_ood(i, "empatheticdialogues", "neutral", "surprised", "x")
            for i in ids} == {"train", "eval"}
    assert condition_of_split("eval") == "in_domain"
    assert condition_of_split("ood") == "out_of_domain" and condition_of_split("train") is None
    with pytest.raises(ValueError, match="ood_valences.*'sadish'"):
        validate_ood(["sadish"], [])
    with pytest.raises(ValueError, match="ood_domains.*'sports'"):
        validate_ood([], ["sports"])
    validate_ood(["neutral", "afraid"], ["committee"])


def test_ood_contexts_never_reach_training_queries(tmp_path):
    from mascot_dag.assets.queries import pick_contexts
    from mascot_dag.lib.storage.tables import contexts_frame
    from mascot_dag.lib.types import Context
    from mascot_dag.resources.store import DuckDBStore

    store = DuckDBStore(path=str(tmp_path / "m.duckdb"))
    items = []
    for i in range(40):
        val = ("positive", "negative", "neutral")[i % 3]
        c = Context(f"ed{i}", "empatheticdialogues", "emotional_support", "s", "t",
                    emotion="joyful", valence=val)
        c.split = assign_split_ood(c.context_id, c.source, c.valence, c.emotion, c.domain,
                                   0.25, ["neutral"], ["committee"])
        items.append(c)
    for i, dom in enumerate(("academic", "committee", "product")):
        c = Context(f"qm{i}", "qmsum", dom, "topic", "t")
        c.split = assign_split_ood(c.context_id, c.source, None, None, dom, 0.0,
                                   ["neutral"], ["committee"])
        items.append(c)
    store.replace("contexts", contexts_frame(items))
    train = pick_contexts(store, "train", 0)
    assert train and all(c.valence != "neutral" and c.domain != "committee" for c in train)
    ood = pick_contexts(store, OOD_SPLIT, 2)
    assert [c.source for c in ood].count("empatheticdialogues") == 2
    assert {c.valence for c in ood if c.valence} == {"neutral"}
    assert [c.context_id for c in ood if c.source == "qmsum"] == ["qm1"]
    assert pick_contexts(store, "nosuch", 1, required=False) == []


# ---- report: conditions and persona x MBTI ------------------------------------------------------
CONTEXTS = pl.DataFrame({
    "context_id": ["c0", "c1", "c2", "c3"],
    "source": ["empatheticdialogues"] * 3 + ["qmsum"],
    "domain": ["emotional_support"] * 3 + ["committee"],
    "valence": ["positive", "negative", "neutral", None],
    "split": ["eval", "eval", "ood", "ood"],
})
RAW = {"mascot": [4, 5, 3, 3], "zero_shot": [2, 3, 2, 2]}


def _tables():
    scores, dialogues = [], []
    for method, values in RAW.items():
        for k, v in enumerate(values):
            did = f"eval:{method}:c{k}"
            dialogues.append({"dialogue_id": did, "method": method, "context_id": f"c{k}",
                              "user_profile": ["INTJ", "ENFP", "INTJ", None][k]})
            for level, crits in (("agent", AGENT_CRITERIA), ("collective", COLLECTIVE_CRITERIA)):
                scores += [dict(method=method, dialogue_id=did, level=level, judge="embedded",
                                criterion=c, value=float(v), higher_is_better=True)
                           for c in crits]
    return pl.DataFrame(scores), pl.DataFrame(dialogues)


def _turns():
    # mascot: anchor speaks to INTJ twice (consistency 5 and 3 -> 75), beacon once to ENFP (1 ->
    # 0); one failed judgment (None) is left out; c3 is a meeting (no user profile): left out
    rows = [("eval:mascot:c0", 1, "anchor", 5.0), ("eval:mascot:c2", 1, "anchor", 3.0),
            ("eval:mascot:c1", 1, "beacon", 1.0), ("eval:mascot:c1", 3, "anchor", None),
            ("eval:mascot:c3", 1, "facilitator", 5.0), ("eval:zero_shot:c0", 1, "anchor", 1.0)]
    out = []
    for did, idx, spk, v in rows:
        for c in AGENT_CRITERIA:
            out.append(dict(method=did.split(":")[1], dialogue_id=did, turn_idx=idx, speaker=spk,
                            judge="embedded", criterion=c,
                            value=v if c == "consistency" or v is None else 5.0))
    return pl.DataFrame(out)


def test_persona_mbti_table_from_turn_scores():
    _, dialogues = _tables()
    means, n = persona_mbti_table(_turns(), dialogues, "mascot", "consistency")

    def cell(frame, persona, mbti):
        return frame.filter(pl.col("speaker") == persona)[mbti].item()

    assert cell(means, "anchor", "INTJ") == 75.0 and cell(n, "anchor", "INTJ") == 2
    assert cell(means, "beacon", "ENFP") == 0.0 and cell(n, "beacon", "ENFP") == 1
    assert cell(means, "anchor", "ENFP") is None and cell(n, "anchor", "ENFP") == 0
    # meeting turns have no simulated user; rows and columns a-z
    assert means["speaker"].to_list() == n["speaker"].to_list() == ["anchor", "beacon"]
    assert means.columns == n.columns and means.columns[1:] == sorted(means.columns[1:])
    overall, _ = persona_mbti_table(_turns(), dialogues, "mascot", "overall")
    assert cell(overall, "beacon", "ENFP") == pytest.approx((0 + 4 * 100) / 5)


def test_report_shows_conditions_and_persona_heatmap(tmp_path):
    scores, dialogues = _tables()
    res = build_report(ReportInputs(scores, dialogues, contexts=CONTEXTS, turn_scores=_turns(),
                                    paper_results=None,
                                    methods=["mascot", "zero_shot", "multiagent_esc"]), tmp_path)
    text = res.markdown.read_text(encoding="utf-8")
    assert "`multiagent_esc`: MultiAgentESC-style" in text
    assert "### In-domain: agent-level" in text
    assert "### Out-of-domain (held out): collective-level" in text
    assert "ED valences ['neutral'], QMSum domains ['committee']" in text
    # in-domain: c0, c1 -> mascot 75, 100 (87.5), zero_shot 25, 50: paired +50 over n=2
    assert "| mascot | 2 | 87.5 | 87.5 | 87.5 | 87.5 | 87.5 | 87.5 | – |" in text
    assert "+50.0 [+50.0, +50.0] (n=2)" in text  # exact, but 2 contexts: no significance mark
    assert "| anchor | n/a | 75.0 (2) |" in text
    assert "persona_mbti_heatmap.png" in {p.name for p in res.plots}
    in_domain = CONTEXTS.with_columns(split=pl.lit("eval"))
    off = build_report(ReportInputs(scores, dialogues, contexts=in_domain,
                                    paper_results=None), tmp_path / "off")
    off_text = off.markdown.read_text(encoding="utf-8")
    assert "n/a (no out-of-domain dialogues" in off_text
    assert "n/a (no per-turn agent scores of mascot" in off_text


# ---- collective fidelity is a block-level measurement -------------------------------------------
ANCHOR = ("Being this nervous before something important is natural. Breathe in slowly with me "
          "and notice your feet resting on the floor for a moment.")
CATALYST = ("When you picture the interview going badly, what exactly do you imagine happening? "
            "And how likely is that, honestly?")
SITUATION = "I have a job interview tomorrow morning and I can't stop shaking."


@pytest.fixture(scope="module")
def judged():
    from mascot_dag.lib.data.personas import load_personas, personas_of_set
    from mascot_dag.lib.judges import EmbeddedJudge
    from mascot_dag.lib.judges.base import BlockItem, ResponseItem

    support = personas_of_set(load_personas(), "support")
    cards = {c.persona_id: c for c in support}
    judge = EmbeddedJudge()

    def run(turns):
        cons = [judge.score_responses([ResponseItem(SITUATION, cards[s], support, t, [])])[0]
                for s, t in turns]
        mean_cons = sum(next(x.score for x in c if x.criterion == "consistency")
                        for c in cons) / len(cons)
        block = [{"speaker": "user", "text": SITUATION}] + [{"speaker": s, "text": t}
                                                           for s, t in turns]
        fid = judge.score_blocks([BlockItem(SITUATION, support, block)])[0][0]
        assert fid.criterion == "fidelity"
        return mean_cons, fid

    return run


def test_collective_fidelity_sees_speakers_who_sound_the_same(judged):
    distinct_cons, distinct = judged([("anchor", ANCHOR), ("catalyst", CATALYST)])
    same_cons, same = judged([("anchor", ANCHOR), ("catalyst", ANCHOR)])
    print(f"\ndistinct: consistency {distinct_cons:.3f} fidelity {distinct.score} "
          f"{distinct.rationale}\nsame: consistency {same_cons:.3f} fidelity {same.score} "
          f"{same.rationale}")
    # no longer the mean of per-turn consistency (the old formula gave exactly that)
    assert distinct.score != pytest.approx(distinct_cons, abs=1e-3)
    assert same.score != pytest.approx(same_cons, abs=1e-3)
    # two speakers with one voice: the block scores well below what per-turn consistency says
    assert same.score < same_cons - 0.5
    assert distinct.score >= distinct_cons - 0.25
    assert "pairwise=0.000" in same.rationale
    # one speaker alone: its block text against its card, no pair term
    _, alone = judged([("anchor", ANCHOR)])
    assert "no pair" in alone.rationale and alone.score > same.score


def test_scoring_reports_agent_scores_per_turn(judged):
    from mascot_dag.lib.data.personas import load_personas, personas_of_set
    from mascot_dag.lib.evaluation.scoring import TURN_COLUMNS, score_dialogues
    from mascot_dag.lib.judges import EmbeddedJudge

    support = personas_of_set(load_personas(), "support")
    dialogues = pl.DataFrame([{"dialogue_id": "eval:mascot:c0", "method": "mascot",
                               "context_id": "c0", "mode": "support", "user_profile": "INTJ"}])
    turns = pl.DataFrame([
        {"dialogue_id": "eval:mascot:c0", "turn_idx": 0, "role": "user", "speaker": "user",
         "text": SITUATION},
        {"dialogue_id": "eval:mascot:c0", "turn_idx": 1, "role": "agent", "speaker": "anchor",
         "text": ANCHOR},
        {"dialogue_id": "eval:mascot:c0", "turn_idx": 2, "role": "agent", "speaker": "catalyst",
         "text": CATALYST}])
    rows: list[dict] = []
    df = score_dialogues(dialogues, turns, {"c0": SITUATION}, {c.persona_id: c for c in support},
                         {"support": support, "workplace": []}, [EmbeddedJudge()], 4,
                         turn_rows=rows)
    ts = pl.DataFrame(rows).select(TURN_COLUMNS)
    assert len(ts) == 2 * len(AGENT_CRITERIA) and set(ts["speaker"]) == {"anchor", "catalyst"}
    cons = ts.filter(pl.col("criterion") == "consistency")["value"].mean()
    stored = df.filter((pl.col("level") == "agent")
                       & (pl.col("criterion") == "consistency"))["value"][0]
    assert stored == pytest.approx(cons)  # the dialogue mean is the mean of the turns


# ---- MultiAgentESC-style: gate, parsing and vote ------------------------------------------------


def test_esc_gate_parse_and_vote():
    assert latest_message("Context:\nx\n\nConversation so far:\nUser: thanks a lot!") == \
        "thanks a lot!"
    assert is_simple("thanks a lot!") and is_simple("ok") and is_simple("Hi there, how are you?")
    assert not is_simple("I failed again today and I feel so stupid.")
    assert not is_simple("Hello, my dog died yesterday and I cannot stop crying at all.")
    assert parse_strategy("Reflection of feelings, then a question") == "Reflection of feelings"
    assert parse_strategy("I would paraphrase what they said") == "Restatement or Paraphrasing"
    assert parse_strategy("Strategy 5.") == "Affirmation and Reassurance"
    assert parse_strategy("Self-disclosure.") == "Self-disclosure"
    assert parse_strategy("hmm") is None
    assert has_majority(["Question", "Question", None]) and not has_majority(
        ["Question", "Information", None])
    assert vote(["Information", "Question", "Question"]) == "Question"
    assert vote(["Information", "Question", None]) == "Information"  # tie: earliest proposer
    assert vote([None, None, None]) == FALLBACK_STRATEGY


def test_contexts_asset_assigns_the_ood_split(tmp_path, monkeypatch):
    import dagster as dg

    from mascot_dag.assets import contexts as contexts_mod
    from mascot_dag.lib.storage.db import query_pl
    from mascot_dag.resources.settings import LineageSettings
    from mascot_dag.resources.store import DuckDBStore

    monkeypatch.setenv("MASCOT_HOME", str(tmp_path))
    db = str(tmp_path / "m.duckdb")

    def run(settings):
        return dg.materialize([contexts_mod.contexts], raise_on_error=False, resources={
            "store": DuckDBStore(path=db), "settings": settings})

    assert run(LineageSettings(ood_valences=["neutral"], ood_domains=["committee"])).success
    df = query_pl(db, "SELECT source, domain, valence, split FROM contexts")
    ood = df.filter(pl.col("split") == "ood")
    assert len(ood) and set(ood["valence"].drop_nulls()) == {"neutral"}
    assert set(ood.filter(pl.col("source") == "qmsum")["domain"]) == {"committee"}
    held = (pl.col("valence") == "neutral").fill_null(False) | (
        pl.col("domain") == "committee").fill_null(False)
    assert (df.filter(held)["split"] == "ood").all()
    assert set(df["split"]) == {"train", "eval", "ood"}
    bad = run(LineageSettings(ood_domains=["sports"]))
    assert not bad.success
    assert "ood_domains" in str(bad.all_events) and "sports" in str(bad.all_events)
