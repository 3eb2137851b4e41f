"""Blind human evaluation: the rating logic, the statistics, the asset, and `mascot rate` served
for real (a subprocess on 127.0.0.1) and driven by headless Chromium and by raw HTTP POSTs.

The database is written directly with the schema (three eval dialogues of one context and the
judge's scores of them), so no model is needed.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import rate_page

from mascot_dag.lib.evaluation import human as H
from mascot_dag.lib.evaluation.human_stats import (
    alpha_ordinal,
    human_section,
    judge_human,
    method_means,
    rater_agreement,
)
from mascot_dag.lib.storage import db

CTX = "ed:hit:7_conv:14"
METHODS3 = ("mascot", "zero_shot", "few_shot")
ITEM = f"{CTX}:0"  # mascot + the two baselines present: one trio, k = 0
CRITS = [c for _, c, _ in H.CRITERIA]


def _write_db(path: Path) -> None:
    """One eval context, three methods' dialogues, judge scores; no comparisons (the rating page
    then applies the three_way_comparisons rule itself)."""
    ctx = pl.DataFrame([{"context_id": CTX, "source": "empatheticdialogues",
                         "domain": "emotional_support", "split": "eval",
                         "situation": "I failed my driving test again.",
                         "text": "Seeker: I failed my driving test again and I feel stupid."}])
    personas = pl.DataFrame([{"persona_id": p, "persona_set": "support", "name": n, "role": r,
                              "description": "d", "behaviours": "[]", "avoid": "[]",
                              "examples": "[]", "source_file": "support.yaml"}
                             for p, n, r in (("anchor", "The Anchor", "emotional validator"),
                                             ("catalyst", "The Catalyst", "critical thinker"))])
    dialogues, turns, scores = [], [], []
    for k, m in enumerate(METHODS3):
        did = f"eval:{m}:{CTX}"
        dialogues.append({"dialogue_id": did, "stage": "eval", "method": m, "context_id": CTX,
                          "mode": "support", "user_profile": "INTJ", "seed": 0, "n_turns": 3})
        for i, (role, sp, text) in enumerate([
                ("user", "user", "I failed my driving test again and I feel stupid."),
                ("agent", "anchor", f"That sounds really disheartening (reply {k})."),
                ("agent", "catalyst", f"What part of the test went wrong, do you think? ({k})")]):
            turns.append({"dialogue_id": did, "turn_idx": i, "role": role, "speaker": sp,
                          "text": text, "model_used": "base+prompt"})
        for level, c, _ in H.CRITERIA:
            scores.append({"method": m, "dialogue_id": did, "level": level, "judge": "embedded",
                           "criterion": c, "value": 1.0 + k, "higher_is_better": True})
    db.replace_many(path, [("contexts", ctx, None, None), ("personas", personas, None, None),
                           ("dialogues", pl.DataFrame(dialogues), None, None),
                           ("turns", pl.DataFrame(turns), None, None),
                           ("eval_scores", pl.DataFrame(scores), None, None)])


def _item() -> H.Item:
    return H.Item(ITEM, CTX, METHODS3, tuple(f"eval:{m}:{CTX}" for m in METHODS3))


def _form(rater: str, item: str = ITEM, slot_score=None, best: str = "A", **extra) -> dict:
    slot_score = slot_score or {"A": 5, "B": 3, "C": 1}
    form = {"rater": rater, "item": item, "best": best}
    form |= {H.field_name(s, c): str(slot_score[s]) for s in H.SLOTS for c in CRITS}
    return form | extra


def _as_qs(form: dict) -> dict[str, list[str]]:
    return {k: [v] for k, v in form.items()}


# ---- pure logic ------------------------------------------------------------------------------

def test_items_follow_the_three_way_rule_from_either_source(tmp_path):
    path = tmp_path / "m.duckdb"
    _write_db(path)
    dialogues = db.query_pl(path, "SELECT * FROM dialogues")
    from_rule = H.build_items(dialogues)
    # the judge saw them in another order; the item is the same, in canonical order
    comp = pl.DataFrame([{"comparison_id": f"{ITEM}:embedded", "context_id": CTX,
                          "judge": "embedded", "shown_order": json.dumps(["zero_shot", "mascot",
                                                                          "few_shot"])}])
    from_table = H.build_items(dialogues, comp)
    assert from_rule == from_table == [H.Item(ITEM, CTX, ("mascot", "few_shot", "zero_shot"),
                                              (f"eval:mascot:{CTX}", f"eval:few_shot:{CTX}",
                                               f"eval:zero_shot:{CTX}"))]
    # two methods only: no three-way item
    assert H.build_items(dialogues.filter(pl.col("method") != "few_shot")) == []


def test_shuffle_is_deterministic_per_rater_and_differs_between_raters():
    item = _item()
    orders = {r: tuple(H.shown_order(r, item)) for r in (f"rater{i}" for i in range(24))}
    again = {r: tuple(H.shown_order(r, item)) for r in orders}
    assert orders == again
    assert all(sorted(o) == [0, 1, 2] for o in orders.values())
    assert len(set(orders.values())) >= 4  # 24 raters over the 6 permutations
    other = H.Item("other:0", "other", item.methods, item.dialogue_ids)
    assert any(H.shown_order(r, other) != list(orders[r]) for r in orders)  # per item too


def test_validation_names_every_bad_field():
    item = _item()
    ok = H.parse_submission(item, _as_qs(_form("alice", comment="  fine  ")))
    assert ok["best"] == "A" and ok["comment"] == "fine" and len(ok["scores"]) == 27
    bad = _form("alice", best="D", comment="x" * (H.MAX_COMMENT + 1))
    bad[H.field_name("B", "fidelity")] = "7"
    bad[H.field_name("C", "consistency")] = "2.5"
    del bad[H.field_name("A", "social_contribution")]
    bad["evil"] = "1"
    with pytest.raises(H.RatingError) as e:
        H.parse_submission(item, _as_qs(bad))
    msg = str(e.value)
    for needle in ("s.B.fidelity", "got '7'", "s.C.consistency", "'2.5'",
                   "missing score for dialogue A, criterion social_contribution",
                   "best: pick", "'D'", f"at most {H.MAX_COMMENT}", "unknown field 'evil'"):
        assert needle in msg, (needle, msg)
    assert len(e.value.problems) == 6
    for rater in ("", " ", "x" * 65, "<script>"):
        with pytest.raises(H.RatingError, match="rater"):
            H.parse_submission(item, _as_qs(_form(rater)))
    dup = _as_qs(_form("alice"))
    dup["best"] = ["A", "B"]
    with pytest.raises(H.RatingError, match="best given 2 times"):
        H.parse_submission(item, dup)


def test_resubmission_replaces_the_raters_answer_only(tmp_path):
    from mascot_dag.web.rate import Ratings

    path = tmp_path / "m.duckdb"
    _write_db(path)
    store, item = Ratings(path), H.build_items(db.query_pl(path, "SELECT * FROM dialogues"))[0]
    assert store.save(item, H.parse_submission(item, _as_qs(_form("bob")))) == (27, False)
    assert store.save(item, H.parse_submission(item, _as_qs(_form("alice")))) == (27, False)
    sub = H.parse_submission(item, _as_qs(_form("alice", slot_score=dict.fromkeys("ABC", 2),
                                                best="C")))
    assert store.save(item, sub) == (27, True)
    r = db.query_pl(path, "SELECT rater, count(*) n, min(score) lo, max(score) hi "
                          "FROM human_ratings GROUP BY rater ORDER BY rater")
    assert r.to_dicts() == [{"rater": "alice", "n": 27, "lo": 2, "hi": 2},
                                    {"rater": "bob", "n": 27, "lo": 1, "hi": 5}]
    c = db.query_pl(path, "SELECT * FROM human_choices WHERE rater = 'alice'")
    assert len(c) == 1
    # slot C is the dialogue alice's shuffle put third
    assert c["best_dialogue_id"][0] == item.dialogue_ids[H.shown_order("alice", item)[2]]
    shown = [item.methods[i] for i in H.shown_order("alice", item)]
    assert json.loads(c["shown_order"][0]) == shown
    # a failing transaction (a score outside the CHECK) leaves alice's rows as they were
    ratings, choice = H.submission_rows(item, sub)
    ratings = ratings.with_columns(
        score=pl.when(pl.int_range(pl.len()) == 5).then(9).otherwise(pl.col("score")))
    with pytest.raises(Exception, match="(?i)check|constraint"):
        db.replace_many(path, H.replace_changes(item, "alice", ratings,
                                                choice.with_columns(best_method=pl.lit("x"))))
    after = db.query_pl(path, "SELECT count(*) n, max(score) hi FROM human_ratings "
                              "WHERE rater = 'alice'")
    assert after.to_dicts() == [{"n": 27, "hi": 2}]
    assert db.query_pl(path, "SELECT best_method FROM human_choices WHERE rater='alice'") \
        ["best_method"][0] != "x"


def test_krippendorff_alpha_on_known_matrices():
    nan = np.nan
    # Krippendorff (2011), "Computing Krippendorff's alpha-reliability", 4 coders x 12 units:
    # nominal 0.743, ordinal 0.815, interval 0.849.
    data = [[1, 2, 3, 3, 2, 1, 4, 1, 2, nan, nan, nan],
            [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, nan, 3],
            [nan, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, nan],
            [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, nan]]
    assert alpha_ordinal(np.array(data)) == pytest.approx(0.815, abs=5e-4)
    assert alpha_ordinal(np.array([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]])) == pytest.approx(1.0)
    assert alpha_ordinal(np.array([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]])) < 0
    assert alpha_ordinal(np.array([[1, 2, 3]])) is None  # one rater
    assert alpha_ordinal(np.array([[3, 3], [3, 3]])) is None  # no variation: 0/0
    assert alpha_ordinal(np.array([[1, nan], [nan, 2]])) is None  # no unit rated twice


def _ratings(values: dict[tuple[str, str], list[int]]) -> pl.DataFrame:
    """(dialogue_id, criterion) -> scores of raters r0, r1, ..."""
    rows = []
    for (did, crit), scores in values.items():
        for k, s in enumerate(scores):
            rows.append({"item_id": "i:0", "rater": f"r{k}", "dialogue_id": did,
                         "method": did.split(":")[1], "context_id": "c", "level": H.LEVEL_OF[crit],
                         "criterion": crit, "score": s, "shown_position": 0})
    return pl.DataFrame(rows)


def test_judge_human_spearman_and_method_means():
    dids = [f"eval:m{k % 2}:c{k}" for k in range(4)]
    ratings = _ratings({**{(d, "consistency"): [k + 1, k + 2] for k, d in enumerate(dids)},
                        **{(d, "fidelity"): [4 - k, 4 - k] for k, d in enumerate(dids)}})
    scores = pl.DataFrame([{"method": "m", "dialogue_id": d, "level": lv, "judge": "embedded",
                            "criterion": c, "value": v, "higher_is_better": True}
                           for k, d in enumerate(dids)
                           for lv, c, v in (("agent", "consistency", [1.5, 2.0, 2.5, 4.5][k]),
                                            ("collective", "fidelity", [1.0, 2.0, 4.0, 3.0][k]),
                                            ("automatic", "distinct_1", 0.5))])
    jh_table = judge_human(ratings, scores)
    jh = {r["criterion"]: r for r in jh_table.iter_rows(named=True)}
    assert jh["consistency"]["spearman"] == pytest.approx(1.0)
    # human 4,3,2,1 vs judge ranks 1,2,4,3: rho = 1 - 6*sum(d^2)/(n(n^2-1)) = 1 - 6*18/60 = -0.8
    assert jh["fidelity"]["spearman"] == pytest.approx(-0.8)
    assert set(jh_table["n_dialogues"]) == {4}
    # one dialogue less than 3 scored: undefined, not a number
    assert judge_human(ratings.filter(pl.col("dialogue_id").is_in(dids[:2])), scores)["spearman"] \
        .is_null().all()
    means = {(r["criterion"], r["method"]): r
             for r in method_means(ratings, n_boot=200).iter_rows(named=True)}
    m0 = means[("consistency", "m0")]  # dialogues c0 (1, 2) and c2 (3, 4)
    assert m0["mean"] == pytest.approx(2.5) and m0["n_ratings"] == 4 and m0["n_dialogues"] == 2
    assert m0["lo"] <= 2.5 <= m0["hi"] and m0["lo"] >= 1.5 and m0["hi"] <= 3.5
    agr = {r["criterion"]: r for r in rater_agreement(ratings).iter_rows(named=True)}
    assert agr["fidelity"]["alpha"] == pytest.approx(1.0)  # both raters always agree
    assert agr["fidelity"]["n_raters"] == 2 and agr["fidelity"]["n_units"] == 4
    lines = "\n".join(human_section(ratings, None, scores, ["m1", "m0"]))
    assert "2 raters, 1 items, 4 dialogues, 16 ratings" in lines
    assert "| consistency | 3.50" in lines  # m1 first: dialogues c1 (2, 3) and c3 (4, 5)
    assert "| embedded | fidelity | 4 | -0.80 |" in lines
    assert human_section(pl.DataFrame(), None, scores)[2].startswith("n/a (no human ratings yet")


def test_report_and_asset_with_and_without_ratings(home, tmp_path):
    import dagster as dg

    from mascot_dag.assets.human import human_ratings
    from mascot_dag.lib.evaluation.report import ReportInputs, build_report
    from mascot_dag.resources.store import DuckDBStore

    path = home / "mascot.duckdb"
    _write_db(path)
    res = dg.materialize([human_ratings], resources={"store": DuckDBStore()})
    md = res.asset_materializations_for_node("human_ratings")[0].metadata
    assert md["ratings"].value == 0 and "mascot rate" in md["note"].value

    from mascot_dag.web.rate import Ratings

    store, item = Ratings(path), H.build_items(db.query_pl(path, "SELECT * FROM dialogues"))[0]
    for r, best in (("ann", "A"), ("ben", "B")):
        store.save(item, H.parse_submission(item, _as_qs(_form(r, best=best))))
    res = dg.materialize([human_ratings], resources={"store": DuckDBStore()})
    md = res.asset_materializations_for_node("human_ratings")[0].metadata
    assert md["ratings"].value == 54 and md["raters"].value == 2 and md["best_picks"].value == 2
    report = build_report(ReportInputs(
        db.query_pl(path, "SELECT * FROM eval_scores"),
        db.query_pl(path, "SELECT * FROM dialogues"), paper_results=None,
        human_ratings=db.query_pl(path, "SELECT * FROM human_ratings"),
        human_choices=db.query_pl(path, "SELECT * FROM human_choices")), tmp_path / "r1")
    text = report.markdown.read_text()
    assert "2 raters, 1 items, 3 dialogues, 54 ratings" in text
    assert "Krippendorff" in text and "### Best pick" in text
    # 3 dialogues: Spearman is defined (judge 1 < 2 < 3 by method); it shows per criterion
    assert "| embedded | consistency | 3 |" in text


# ---- the real server -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("rate_home")
    _write_db(home / "mascot.duckdb")
    with rate_page(home) as (base, _):
        yield base, home / "mascot.duckdb"


@functools.cache
def _browser_state(base: str) -> tuple[str, str]:
    """The cookie and form token a browser holds after opening the item page: the page's guard
    refuses POSTs without them (tests/test_web_security.py tries those)."""
    q = urllib.parse.urlencode({"rater": "tester", "item": ITEM})
    with urllib.request.urlopen(f"{base}/item?{q}", timeout=60) as r:
        cookie = r.headers["set-cookie"].split(";")[0]
        token = re.search(r"name='csrf_token' value='([^']+)'", r.read().decode()).group(1)
    return cookie, token


def _post(base: str, form: dict | str, ctype: str = "application/x-www-form-urlencoded"):
    data = form if isinstance(form, str) else urllib.parse.urlencode(form)
    cookie, token = _browser_state(base)
    req = urllib.request.Request(f"{base}/item", data=data.encode(), method="POST",
                                 headers={"Content-Type": ctype, "Cookie": cookie,
                                          "X-CSRF-Token": token})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _count(path: Path, rater: str) -> tuple[int, int]:
    r = db.query_pl(path, "SELECT (SELECT count(*) FROM human_ratings WHERE rater = ?) a, "
                          "(SELECT count(*) FROM human_choices WHERE rater = ?) b", [rater, rater])
    return int(r["a"][0]), int(r["b"][0])


def _wait_for(browser, text: str, timeout: float = 30.0) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, timeout).until(lambda b: text in b.page_source,
                                          f"page never showed {text!r}")


def test_rate_a_whole_item_in_the_browser(server, browser, tmp_path):
    from selenium.webdriver.common.by import By

    base, path = server
    browser.get(base + "/")
    browser.find_element(By.ID, "rater").send_keys("Grace H")
    browser.find_element(By.ID, "start").click()
    # a click that submits a form returns before the next page has loaded (on a busy machine
    # the old page is still there): wait for what the next page shows
    _wait_for(browser, "0 of 1 items rated")
    browser.find_element(By.ID, "next").click()
    _wait_for(browser, 'id="submit"')
    page = browser.page_source
    # blind: neither methods nor dialogue ids reach the page
    for hidden in ("mascot", "zero_shot", "few_shot", "eval:"):
        assert hidden not in page.lower(), hidden
    assert "neither flat nor" in page  # a criterion's definition beside its scale
    assert "The Anchor (emotional validator)" in page
    values = {"A": 5, "B": 3, "C": 1}
    for s in H.SLOTS:
        for c in CRITS:
            browser.find_element(By.ID, f"{H.field_name(s, c)}.{values[s]}").click()
    browser.find_element(By.ID, "best.B").click()
    shot = tmp_path / "rate_form.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    browser.find_element(By.ID, "submit").click()
    _wait_for(browser, 'id="confirmation"')
    confirmation = browser.find_element(By.ID, "confirmation").text
    assert "Grace H" in confirmation and "27 ratings" in confirmation and "1 of 1" in confirmation
    done = tmp_path / "rate_done.png"
    browser.save_screenshot(str(done))
    assert done.stat().st_size > 0
    item = H.build_items(db.query_pl(path, "SELECT * FROM dialogues"))[0]
    order = H.shown_order("Grace H", item)
    rows = db.query_pl(path, "SELECT * FROM human_ratings WHERE rater = 'Grace H'")
    assert len(rows) == 27
    for pos, s in enumerate(H.SLOTS):  # what was clicked for slot s landed on its dialogue
        sel = rows.filter(pl.col("dialogue_id") == item.dialogue_ids[order[pos]])
        assert set(sel["score"]) == {values[s]} and set(sel["shown_position"]) == {pos}
        assert len(sel) == 9
    choice = db.query_pl(path, "SELECT * FROM human_choices WHERE rater = 'Grace H'")
    assert choice["best_method"].to_list() == [item.methods[order[1]]]
    # reopening the item shows the stored answer and says a new one replaces it
    q = urllib.parse.urlencode({"rater": "Grace H", "item": ITEM})
    browser.get(f"{base}/item?{q}")
    _wait_for(browser, "replaces that answer")
    assert browser.find_element(By.ID, "best.B").is_selected()
    assert browser.find_element(By.ID, f"{H.field_name('C', 'fidelity')}.1").is_selected()


def test_bad_posts_are_clear_4xx_and_store_nothing(server):
    base, path = server
    status, body = _post(base, {"rater": "mallory", "item": ITEM})
    assert status == 422 and "s.A.consistency" in body and "best: missing" in body
    form = _form("mallory")
    form[H.field_name("B", "fidelity")] = "6"
    status, body = _post(base, form)
    assert status == 422 and "s.B.fidelity" in body and "got &#x27;6&#x27;" in body
    status, body = _post(base, _form("mallory", item="nope:0"))
    assert status == 404 and "unknown item &#x27;nope:0&#x27;" in body
    status, body = _post(base, _form("mallory", comment="x" * 40_000))
    assert status == 413 and "request body over" in body
    status, body = _post(base, _form("mallory", comment="y" * 2500))
    assert status == 422 and "comment: at most 2000 characters (got 2500)" in body
    status, body = _post(base, _form("x" * 80))
    assert status == 422 and "rater: give a name" in body
    status, body = _post(base, json.dumps(_form("mallory")), ctype="application/json")
    assert status == 415
    status, _ = _post(base, _form("mallory", item=""))
    assert status == 404
    assert _count(path, "mallory") == (0, 0)
    assert db.query_pl(path, "SELECT count(*) n FROM human_ratings WHERE length(rater) > 64"
                       )["n"][0] == 0


def test_concurrent_raters(server):
    base, path = server
    posts = [_form("carol", slot_score=dict.fromkeys("ABC", 2)),
             _form("carol", slot_score=dict.fromkeys("ABC", 4), best="C"),
             _form("dave"),
             _form("erin", best="Z")]
    results: list = [None] * len(posts)

    def go(i: int) -> None:
        results[i] = _post(base, posts[i])

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(posts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert [r[0] for r in results] == [200, 200, 200, 422], results
    assert "best: pick" in results[3][1]
    assert _count(path, "dave") == (27, 1) and _count(path, "erin") == (0, 0)
    # carol's two submissions raced: exactly one of them is stored, whole
    assert _count(path, "carol") == (27, 1)
    carol = db.query_pl(path, "SELECT DISTINCT score FROM human_ratings WHERE rater = 'carol'")
    best = db.query_pl(path, "SELECT best_dialogue_id FROM human_choices WHERE rater = 'carol'")
    item = H.build_items(db.query_pl(path, "SELECT * FROM dialogues"))[0]
    order = H.shown_order("carol", item)
    expect = {2: item.dialogue_ids[order[0]], 4: item.dialogue_ids[order[2]]}
    assert len(carol) == 1 and best["best_dialogue_id"][0] == expect[int(carol["score"][0])]


def test_export_csv_and_parquet(server, tmp_path):
    from mascot_dag.web.rate import export

    base, path = server
    assert _post(base, _form("frank", best="C"))[0] == 200
    env = {**os.environ, "MASCOT_HOME": str(path.parent)}
    out = tmp_path / "ratings.csv"  # the command once; the parquet writer in-process
    proc = subprocess.run([sys.executable, "-m", "mascot_dag.cli", "rate", "--export", str(out)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "ratings ->" in proc.stdout, proc.stderr
    n = export(path, tmp_path / "ratings.parquet")
    for df in (pl.read_csv(out), pl.read_parquet(tmp_path / "ratings.parquet")):
        assert len(df) == n
        frank = df.filter(pl.col("rater") == "frank")
        assert len(frank) == 27 and frank["chosen_best"].sum() == 9
        assert set(frank["best_method"]) == {frank.filter(pl.col("chosen_best"))["method"][0]}
        assert {"method", "criterion", "score", "best_method", "shown_position"} <= set(df.columns)
    with pytest.raises(ValueError, match="use a .csv or .parquet"):
        export(path, tmp_path / "r.xlsx")
