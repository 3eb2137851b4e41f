"""People as a reader of the persona probe (issue 34, item 5): the blind "which companion said it?"
page of `mascot rate` (web/who.py) as a real server on 127.0.0.1 over a real DuckDB file, driven by
real HTTP requests with the browser's cookie and form token; the draw, aggregation and agreement
(lib/evaluation/human_roles.py) with known outcomes; and people in the probe panel's verdict
(lib/stage1/panel.py): a reader only from PEOPLE_MIN_TEXTS answers on, and then one that can
block a gain the automatic readers pass. What was stored is read back from DuckDB.
"""

from __future__ import annotations

import html
import math
import re

import numpy as np
import polars as pl
import pytest
import requests
from conftest import rate_page
from test_human_eval import _write_db
from test_probe import ROSTER, _plant

from mascot_dag.lib.evaluation import human_roles as R
from mascot_dag.lib.stage1 import panel
from mascot_dag.lib.storage import db

EVIL = "http://evil.example"


# ---- the draw --------------------------------------------------------------------------------

def _probe(personas=ROSTER, contexts: int = 3, seeds: int = 1, formats=("training",),
           arms=R.SHOWN_ARMS) -> pl.DataFrame:
    rows = [{"persona_id": p, "context_id": f"ctx{c}", "seed": s, "arm": a, "format": f,
             "model_version": "base" if a == "base" else f"m-{p}/1",
             "text": f"That sounds hard ({p[:1]}{c}{s}{a[:1]}{f[:1]}).", "copied": 0.0}
            for p in personas for c in range(contexts) for s in range(seeds) for a in arms
            for f in formats]
    return pl.DataFrame(rows)


def test_ids_are_opaque_and_change_with_the_text():
    a = R.utterance_id("anchor", "ctx0", 0, "adapter", "chat", "Hello there.")
    assert re.fullmatch(r"[0-9a-f]{24}", a)
    assert a == R.utterance_id("anchor", "ctx0", 0, "adapter", "chat", "Hello there.")
    assert a != R.utterance_id("anchor", "ctx0", 0, "base", "chat", "Hello there.")
    assert a != R.utterance_id("anchor", "ctx0", 0, "adapter", "chat", "Hello there!")


def test_the_draw_is_one_common_order_shuffled_per_rater_within_blocks():
    texts = _probe(contexts=3, formats=("training", "chat"),
                   arms=("base", "adapter", "warm_start"))
    # a unit missing its adapter text is not asked (its gain could not be paired)
    texts = texts.filter(~((pl.col("persona_id") == "beacon") & (pl.col("context_id") == "ctx2")
                           & (pl.col("arm") == "adapter") & (pl.col("format") == "chat")))
    sets = dict.fromkeys(ROSTER, "support")
    blocks = R.pool(texts, sets)
    flat = [u for b in blocks for u in b]
    assert len(flat) == 2 * (4 * 3 * 2 - 1)  # base + adapter of every complete unit, once
    assert {u.arm for u in flat} == {"base", "adapter"}
    assert [len(b) for b in blocks] == [16, 16, 14]
    # every block holds each (format, persona) once, both arms of each unit side by side
    for b in blocks[:2]:
        assert sorted((u.format, u.persona_id) for u in b[::2]) == sorted(
            (f, p) for f in ("chat", "training") for p in ROSTER)
        assert all((x.persona_id, x.context_id, x.format) == (y.persona_id, y.context_id,
                                                               y.format)
                   for x, y in zip(b[::2], b[1::2], strict=True))
    assert R.pool(texts.reverse(), sets) == blocks  # the order does not follow the table's
    ann, bob = R.sequence("ann", blocks), R.sequence("bob", blocks)
    assert ann == R.sequence("ann", blocks) and ann != bob
    for i, b in enumerate(blocks):  # a rater's k-th block is the common k-th block, shuffled
        start = sum(map(len, blocks[:i]))
        assert sorted(u.utterance_id for u in ann[start:start + len(b)]) == sorted(
            u.utterance_id for u in b)
    assert R.roster_order("ann", ROSTER) == R.roster_order("ann", list(reversed(ROSTER)))
    assert sorted(R.roster_order("bob", ROSTER)) == sorted(ROSTER)


# ---- aggregation and agreement ---------------------------------------------------------------

def _answers(rows) -> pl.DataFrame:
    """rows: (rater, persona_id, context_id, arm, answer); seed 0, format training."""
    return pl.DataFrame([{"rater": r, "persona_id": p, "context_id": c, "seed": 0, "arm": a,
                          "format": "training", "utterance_id": "x", "answer": ans}
                         for r, p, c, a, ans in rows], schema=R.ANSWER_SCHEMA)


def test_plurality_ties_and_cant_tell():
    assert R.plurality(["anchor", "anchor", "beacon"]) == "anchor"
    assert R.plurality(["anchor", "beacon"]) is None  # a tie at the top
    assert R.plurality(["anchor", "beacon", None, None]) is None  # can't tell on top
    assert R.plurality(["anchor", None, "anchor", "beacon"]) == "anchor"
    assert R.plurality([None]) is None and R.plurality([]) is None
    readings = R.people_readings(_answers([
        ("a", "anchor", "c0", "base", "anchor"), ("b", "anchor", "c0", "base", "anchor"),
        ("c", "anchor", "c0", "base", "beacon"),
        ("a", "anchor", "c0", "adapter", "anchor"), ("b", "anchor", "c0", "adapter", "beacon"),
        ("a", "beacon", "c1", "base", None), ("b", "beacon", "c1", "base", None),
        ("a", "beacon", "c1", "adapter", "beacon")]))
    got = {(r["persona_id"], r["arm"]): (r["predicted"], r["identifiable"])
           for r in readings.to_dicts()}
    assert got == {("anchor", "base"): ("anchor", 1.0), ("anchor", "adapter"): (None, 0.0),
                   ("beacon", "base"): (None, 0.0), ("beacon", "adapter"): ("beacon", 1.0)}
    assert set(readings["reader"]) == {"people"} and readings.columns == list(R.READING_SCHEMA)


def test_answers_to_a_regenerated_text_no_longer_count():
    texts = _probe(personas=("anchor",), contexts=1)
    rows = [{"rater": "a", **{k: r[k] for k in ("persona_id", "context_id", "seed", "arm",
                                                "format")},
             "utterance_id": R.utterance_id(*[r[k] for k in panel.UNIT], r["text"]),
             "answer": "anchor"} for r in texts.to_dicts()]
    answers = pl.DataFrame(rows, schema=R.ANSWER_SCHEMA)
    assert R.matched_answers(answers, texts).height == 2
    rerun = texts.with_columns(text=pl.when(pl.col("arm") == "adapter").then(pl.lit("New text."))
                               .otherwise(pl.col("text")))
    assert R.matched_answers(answers, rerun)["arm"].to_list() == ["base"]


def test_raters_agreement_with_known_values():
    # Cohen: two raters, 50 texts, yes/yes 20, yes/no 5, no/yes 10, no/no 15 -> kappa 0.4
    cells = [("anchor", "anchor")] * 20 + [("anchor", "beacon")] * 5 + \
        [("beacon", "anchor")] * 10 + [("beacon", "beacon")] * 15
    rows = [(r, "anchor", f"c{i}", "base", pair[j]) for i, pair in enumerate(cells)
            for j, r in enumerate(("ann", "bob"))]
    rows.append(("ann", "anchor", "solo", "base", "anchor"))  # one rater only: not counted
    agree = R.rater_agreement(_answers(rows))
    assert agree.method == "Cohen" and agree.n_texts == 50 and agree.n_raters == 2
    assert agree.kappa == pytest.approx(0.4)
    assert "Cohen's kappa 0.400 on 50 texts" in agree.describe()
    # Fleiss (Fleiss 1971 / Wikipedia's worked example): 10 texts, 14 raters, 5 categories
    table = np.array([[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0],
                      [2, 2, 8, 1, 1], [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2],
                      [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]])
    assert R.fleiss_kappa(table) == pytest.approx(0.20993, abs=1e-4)
    labels = ["anchor", "beacon", "catalyst", "action_guide", None]  # None: can't tell
    rows = []
    for i, counts in enumerate(table):
        answers = [labels[j] for j, n in enumerate(counts) for _ in range(n)]
        rows += [(f"r{k}", "anchor", f"c{i}", "base", a) for k, a in enumerate(answers)]
    agree = R.rater_agreement(_answers(rows))
    assert agree.method == "Fleiss" and (agree.n_texts, agree.n_raters) == (10, 14)
    assert agree.kappa == pytest.approx(0.20993, abs=1e-4)
    # texts with varying numbers of raters: perfect agreement is 1
    varying = np.array([[3, 0], [0, 2], [4, 0]])
    assert R.fleiss_kappa(varying) == pytest.approx(1.0)
    none = R.rater_agreement(_answers([("ann", "anchor", "c0", "base", "anchor")]))
    assert none.method == "" and none.n_texts == 0 and math.isnan(none.kappa)
    assert "no text answered by two raters" in none.describe()


def test_coverage_needs_the_texts_in_pairs_and_every_persona_on_enough_contexts():
    def cover(contexts: int, seeds: int, drop: int = 0):
        rows = [("a", p, f"c{c}", arm, p) for p in ROSTER for c in range(contexts)
                for arm in R.SHOWN_ARMS for _ in range(seeds)]
        answers = _answers(rows).with_columns(
            seed=pl.int_range(pl.len()).over("persona_id", "context_id", "arm"))
        answers = answers.head(answers.height - drop)
        return R.coverage(answers, ROSTER, ["training", "chat"], "adapter",
                          panel.PEOPLE_MIN_TEXTS, 6)

    assert panel.PEOPLE_MIN_TEXTS == 64
    at = cover(8, 1)[0]  # 4 personas x 8 contexts x both arms = 64 texts in pairs
    assert at.joins and at.n_paired_texts == 64 and at.fewest_contexts == 8
    assert "a reader of the panel" in at.describe()
    short = cover(8, 1, drop=1)[0]  # one adapter text fewer: its base text is unpaired
    assert not short.joins and (short.n_texts, short.n_paired_texts) == (63, 62)
    assert "not yet a reader (needs >= 64 texts" in short.describe()
    few = cover(5, 2)[0]  # 80 texts in pairs, but every persona on 5 contexts only
    assert few.n_paired_texts == 80 and few.fewest_contexts == 5 and not few.joins
    chat = cover(8, 1)[1]
    assert chat.format == "chat" and chat.n_answers == 0 and not chat.joins


# ---- people in the panel's verdict -----------------------------------------------------------

def _plant_answers(path, see, raters=("p1", "p2"), contexts=range(12)) -> None:
    """Answers of `raters` to the planted probe texts on `contexts`: `see(row)` is the persona
    they name for a persona_probe row (None: can't tell)."""
    texts = db.query_pl(path, "SELECT * FROM persona_probe")
    rows = []
    for r in texts.to_dicts():
        if int(r["context_id"][1:]) not in contexts:
            continue
        uid = R.utterance_id(*[r[k] for k in panel.UNIT], r["text"])
        rows += [{"rater": who, **{k: r[k] for k in panel.UNIT}, "utterance_id": uid,
                  "answer": see(r)} for who in raters]
    db.replace_many(path, [("human_role_answers", pl.DataFrame(rows, schema=R.ANSWER_SCHEMA),
                            None, None)])


def test_people_join_the_verdict_only_above_the_threshold(tmp_path):
    path = str(tmp_path / "mascot.duckdb")
    gain = dict.fromkeys(ROSTER, 8)
    _plant(path, gain, others={"semantic": gain})

    def result():
        return panel.roster_panel(lambda sql, params: db.query_pl(path, sql, params), ROSTER,
                                  "support", 6)

    alone = result()
    assert alone.verdict.passed and "people" not in alone.accuracies
    assert "people/training: 0 answers on 0 texts" in alone.verdict.description
    assert "not yet a reader" in alone.verdict.description
    assert alone.raters.method == "" and alone.people[0].n_answers == 0

    # people see no gain (they name the persona on the first 4 contexts, base and adapter
    # alike), but on 4 contexts only: 64 texts in pairs, each persona on < 6 contexts
    def flat(r):
        return r["persona_id"] if int(r["context_id"][1:]) < 4 else "catalyst"

    _plant_answers(path, flat, contexts=range(4))
    early = result()
    assert early.verdict.passed and "people" not in early.accuracies
    assert early.people[0].n_paired_texts == 64 and early.people[0].fewest_contexts == 4
    assert "people/training: 128 answers on 64 texts" in early.verdict.description
    assert "Cohen's kappa 1.000 on 64 texts" in early.verdict.description
    assert not early.summary.filter(pl.col("reader") == "people").height
    # ... but people vs the automatic readers is reported already
    assert "people" in set(early.agreement["reader_a"]) | set(early.agreement["reader_b"])

    # the same people on every context: now a reader, and their "no gain" blocks the verdict
    # the lexical and semantic readers pass
    _plant_answers(path, flat)
    blocked = result()
    assert blocked.accuracies["people"] is None and blocked.people[0].joins
    assert not blocked.verdict.passed and blocked.verdict.reader == "people/training"
    assert blocked.verdict.gain == 0 and blocked.verdict.established == ()
    assert "people/training (reference reader, counts by definition)" in \
        blocked.verdict.description
    assert "a reader of the panel" in blocked.verdict.description
    text = panel.panel_text(blocked, "adapter", "support")
    assert re.search(r"people\s+training\s+reference\s+yes\s+\+0.0", text), text

    # people who hear what the readers hear (they name the lexical reader's persona): passes
    lexical = db.query_pl(path, "SELECT * FROM probe_readings WHERE reader = 'lexical'")
    named = {tuple(r[k] for k in panel.UNIT): r["predicted"] for r in lexical.to_dicts()}

    def hear(r):
        p = named[tuple(r[k] for k in panel.UNIT)]
        return p if p in ROSTER else None  # the reader's "other": people can't tell

    _plant_answers(path, hear, raters=("p1", "p2", "p3"))
    agree = result()
    assert agree.verdict.passed and set(agree.verdict.established) == set(ROSTER)
    assert agree.raters.method == "Fleiss" and agree.raters.kappa == pytest.approx(1.0)
    assert agree.raters.n_texts == 192 and agree.raters.n_raters == 3


# ---- the page --------------------------------------------------------------------------------

NAMES = {"anchor": ("The Anchor", "an emotional validator", "A calm, gentle presence."),
         "catalyst": ("The Catalyst", "a critical thinker", "Asks the questions that matter."),
         "beacon": ("The Beacon", "an optimist", "Finds the light in a hard day.")}
PAGE_ROSTER = tuple(NAMES)
CONTEXTS = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("who_home")
    path = home / "mascot.duckdb"
    _write_db(path)  # the three-way item the rating page also serves
    personas = pl.DataFrame([{"persona_id": p, "persona_set": "support", "name": n, "role": r,
                              "description": d, "behaviours": "[]", "avoid": "[]",
                              "examples": "[]", "source_file": "support.yaml"}
                             for p, (n, r, d) in NAMES.items()])
    probe = _probe(PAGE_ROSTER, contexts=CONTEXTS, arms=("base", "adapter", "warm_start"))
    db.replace_many(path, [("personas", personas, None, None),
                           ("persona_probe", probe, None, None)])
    with rate_page(home) as (base, _):
        yield base, path, probe


def _field(page: str, name: str) -> str:
    m = re.search(rf"name='{name}' value='([^']*)'", page)
    return html.unescape(m.group(1)) if m else ""


def _shown(page: str) -> str:
    m = re.search(r"<div class='utterance' id='utterance'>(.*?)</div>", page, re.S)
    return html.unescape(m.group(1)) if m else ""


def _session(base: str, rater: str) -> tuple[requests.Session, str, str]:
    """A browser on the rater's next utterance: (session, page, form token)."""
    s = requests.Session()
    page = s.get(f"{base}/who", params={"rater": rater}, timeout=30)
    assert page.status_code == 200, page.text[:300]
    return s, page.text, _field(page.text, "csrf_token")


def _stored(path, rater: str) -> pl.DataFrame:
    return db.query_pl(path, "SELECT * FROM human_role_answers WHERE rater = ? ORDER BY "
                             "answered_at", [rater])


def test_the_index_links_the_task_and_the_page_is_blind(server):
    base, path, probe = server
    index = requests.get(f"{base}/", params={"rater": "ann"}, timeout=30)
    assert index.status_code == 200 and "id='who'" in index.text
    assert "0 of 18 answered" in index.text  # 3 personas x 3 contexts x base + adapter
    s, page, token = _session(base, "ann")
    assert token and _field(page, "rater") == "ann"
    for p, (name, role, desc) in NAMES.items():
        assert f"value='{p}'" in page and name in page and html.escape(role) in page
        assert html.escape(desc) in page
    assert "value='-'" in page and "Can't tell" in page.replace("&#x27;", "'")
    # walk every utterance the rater is shown (each page opened by its id): persona, arm,
    # context, seed and model never show; pages differ only in the text and its opaque id
    texts = {r["text"]: r for r in probe.filter(pl.col("arm") != "warm_start").to_dicts()}
    seen, skeletons = set(), set()
    first = _field(page, "u")
    blocks = R.pool(probe, dict.fromkeys(PAGE_ROSTER, "support"))
    for u in R.sequence("ann", blocks):
        one = s.get(f"{base}/who", params={"rater": "ann", "u": u.utterance_id}, timeout=30)
        assert one.status_code == 200
        text = _shown(one.text)
        row = texts[text]
        seen.add((row["persona_id"], row["arm"]))
        assert _field(one.text, "u") == u.utterance_id == R.utterance_id(
            *[row[k] for k in panel.UNIT], text)
        for hidden in ("adapter", "base", "warm", row["context_id"], row["model_version"],
                       "persona_id", "arm"):
            assert hidden not in one.text.replace(html.escape(text), ""), hidden
        skeletons.add(one.text.replace(html.escape(text), "TEXT").replace(u.utterance_id, "ID"))
    assert seen == {(p, a) for p in PAGE_ROSTER for a in ("base", "adapter")}
    assert len(skeletons) == 1  # nothing but the text and its id tells two utterances apart
    assert first == R.sequence("ann", blocks)[0].utterance_id  # the rater's own first one
    assert _stored(path, "ann").is_empty()  # looking stores nothing


def test_answers_are_stored_then_replaced(server):
    base, path, probe = server
    s, page, token = _session(base, "bea")
    uid, text = _field(page, "u"), _shown(page)
    row = probe.filter(pl.col("text") == text).row(0, named=True)
    r = s.post(f"{base}/who", data={"csrf_token": token, "rater": "bea", "u": uid,
                                    "answer": "catalyst"}, headers={"Origin": base}, timeout=30)
    assert r.status_code == 200 and "id='confirmation'" in r.text and "saved" in r.text
    assert _field(r.text, "u") != uid and "1 of 18 answered" in r.text  # on to the next one
    got = _stored(path, "bea")
    assert got.height == 1
    assert got.select(*panel.UNIT, "utterance_id", "answer").row(0) == (
        row["persona_id"], row["context_id"], row["seed"], row["arm"], row["format"], uid,
        "catalyst")
    # the same text again ("change it"): the earlier answer shows, and is replaced
    again = s.get(f"{base}/who", params={"rater": "bea", "u": uid}, timeout=30)
    assert "answered this one before" in again.text
    assert re.search(r"value='catalyst' id='answer.catalyst' required checked", again.text)
    r = s.post(f"{base}/who", data={"csrf_token": token, "rater": "bea", "u": uid,
                                    "answer": "-"}, timeout=30)
    assert r.status_code == 200 and "replaced your earlier answer" in r.text
    got = _stored(path, "bea")
    assert got.height == 1 and got["answer"][0] is None and got["utterance_id"][0] == uid
    # another rater's answer to the same text is a row of its own
    s2, _, token2 = _session(base, "cal")
    r = s2.post(f"{base}/who", data={"csrf_token": token2, "rater": "cal", "u": uid,
                                     "answer": "anchor"}, timeout=30)
    assert r.status_code == 200 and _stored(path, "cal")["answer"].to_list() == ["anchor"]
    assert _stored(path, "bea")["answer"].to_list() == [None]
    # answering everything ends the task
    for _ in range(40):
        page = s.get(f"{base}/who", params={"rater": "bea"}, timeout=30).text
        if "id='all-done'" in page:
            break
        r = s.post(f"{base}/who", data={"csrf_token": token, "rater": "bea",
                                        "u": _field(page, "u"), "answer": "beacon"}, timeout=30)
        assert r.status_code == 200
    assert "id='all-done'" in page and _stored(path, "bea").height == 18


def test_bad_answers_are_clear_4xx_and_store_nothing(server):
    base, path, _ = server
    s, page, token = _session(base, "mallory")
    uid = _field(page, "u")

    def post(form: dict, **kw) -> requests.Response:
        return s.post(f"{base}/who", data=form, timeout=30, **kw)

    ok = {"csrf_token": token, "rater": "mallory", "u": uid, "answer": "anchor"}
    r = post({**ok, "u": "0" * 24})
    assert r.status_code == 404 and "unknown utterance" in r.text
    r = post({**ok, "answer": "zeus"})
    assert r.status_code == 422 and "unknown companion &#x27;zeus&#x27;" in r.text
    assert _field(r.text, "u") == uid and _field(r.text, "csrf_token") == token  # form again
    r = post({**ok, "answer": ""})
    assert r.status_code == 422 and "answer: missing" in r.text
    r = post({k: v for k, v in ok.items() if k != "answer"})
    assert r.status_code == 422 and "answer: missing" in r.text
    r = post({**ok, "persona": "anchor"})
    assert r.status_code == 422 and "unknown field &#x27;persona&#x27;" in r.text
    r = post(f"csrf_token={token}&rater=mallory&u={uid}&answer=anchor&answer=beacon",
             headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 422 and "field answer given 2 times" in r.text
    r = post({**ok, "rater": "x" * 80})
    assert r.status_code == 422 and "rater: give a name" in r.text
    r = post({**ok, "note": "y" * 5000})
    assert r.status_code == 413
    r = s.post(f"{base}/who", json=ok, headers={"X-CSRF-Token": token}, timeout=30)
    assert r.status_code == 415
    # the guard: no token, another session's token, another origin
    r = post({k: v for k, v in ok.items() if k != "csrf_token"})
    assert r.status_code == 403 and "form token" in r.text
    _, _, other = _session(base, "someone")
    assert post({**ok, "csrf_token": other}).status_code == 403
    r = post(ok, headers={"Origin": EVIL})
    assert r.status_code == 403 and "cross-origin" in r.text
    r = requests.post(f"{base}/who", data=ok, timeout=30)  # no cookie
    assert r.status_code == 403
    r = s.get(f"{base}/who", params={"rater": "mallory", "u": "nope"}, timeout=30)
    assert r.status_code == 404
    r = s.get(f"{base}/who", params={"rater": ""}, timeout=30)
    assert r.status_code == 422
    assert _stored(path, "mallory").is_empty()
    assert db.query_pl(path, "SELECT count(*) n FROM human_role_answers WHERE length(rater) > 64"
                       )["n"][0] == 0
