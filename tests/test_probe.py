"""The persona probe: its panel of readers, the paired, context-clustered summary, and the one
verdict rule (a gain counts when every valid reader sees it)."""

from __future__ import annotations

import os

import polars as pl
import pytest

from mascot_dag.lib.data.personas import load_personas, personas_of_set
from mascot_dag.lib.evaluation.stats import paired_cluster_bootstrap, significance_mark
from mascot_dag.lib.stage1 import panel, probe, readers


@pytest.mark.parametrize("persona_set", ["support", "workplace"])
def test_readers_recognise_held_out_reference_utterances(persona_set):
    utterances = readers.load_reference_utterances(persona_set)
    cards = personas_of_set(load_personas(), persona_set)
    assert set(utterances) == {c.persona_id for c in cards}
    assert all(len(v) >= 30 for v in utterances.values())
    # well above chance (1/4) on utterances they never saw: both can tell personas apart; whether
    # that is enough to count is the panel's threshold (measured: support lexical 71%, semantic
    # 78%; workplace 60% and 49%, so no reader counts there yet)
    for make in readers.FITTED_READERS.values():
        assert readers.cross_validated_accuracy(make, utterances) > 0.45, make.name


def test_reference_utterances_do_not_copy_the_cards():
    """The probe must not reward copying a card: its data shares no 4-gram with the cards."""
    from mascot_dag.lib.judges.features import card_grams, copied_grams

    for card in personas_of_set(load_personas(), "support"):
        grams = card_grams(card)
        texts = readers.load_reference_utterances("support")[card.persona_id]
        assert sum(copied_grams(t, grams) > 0 for t in texts) == 0, card.persona_id


def test_bad_reference_file_names_the_file(tmp_path):
    (tmp_path / "support.yaml").write_text("utterances:\n  anchor: [1, 2]\n  beacon: ['x']\n")
    with pytest.raises(ValueError, match=r"support\.yaml: utterances\.anchor"):
        readers.load_reference_utterances("support", tmp_path)
    with pytest.raises(FileNotFoundError, match="workplace"):
        readers.load_reference_utterances("workplace", tmp_path)


def _table(gain_contexts: int, n_contexts: int = 10) -> pl.DataFrame:
    """Two personas x n contexts x 2 seeds; the adapter becomes identifiable on the first
    `gain_contexts` contexts, the base never is."""
    units, base, adapted = [], [], []
    for c in range(n_contexts):
        for persona in ("anchor", "catalyst"):
            for s in range(2):
                units.append(probe.ProbeUnit(f"c{c}", persona, s))
                base.append(f"base {c} {persona} {s}")
                adapted.append(f"base {c} {persona} {s}" if c >= gain_contexts else f"new {c}")
    t = probe.unit_table(units, base, adapted)
    changed = pl.col("text").str.starts_with("new").cast(pl.Float64)
    return t.with_columns(identifiable=changed, consistency=2.0 + changed, relevance=pl.lit(3.0),
                          copied=pl.lit(0.0))


def _by_persona(summary: pl.DataFrame) -> dict[str, dict]:
    return {r["persona"]: r for r in summary.to_dicts()}


def test_summary_is_paired_and_clustered_by_context():
    s = _by_persona(probe.summarise(_table(gain_contexts=10)))
    assert s["all"]["n_units"] == 40 and s["all"]["n_contexts"] == 10
    assert s["all"]["identifiable_gain"] == pytest.approx(1.0)
    assert s["all"]["identifiable_lo"] == pytest.approx(1.0)
    assert s["anchor"]["identical_share"] == 0.0
    assert s["all"]["relevance_gain"] == 0.0
    assert s["all"]["consistency_base"] == 2.0 and s["all"]["consistency_adapter"] == 3.0

    none = _by_persona(probe.summarise(_table(gain_contexts=0)))
    assert none["all"]["identical_share"] == 1.0
    assert none["all"]["identifiable_gain"] == 0.0

    # a gain on 2 of 10 contexts: positive, but the context bootstrap keeps the CI honest
    table = _table(gain_contexts=2)
    few = _by_persona(probe.summarise(table))
    assert few["all"]["identifiable_gain"] == pytest.approx(0.2)
    assert few["all"]["identifiable_lo"] < 0.2 < few["all"]["identifiable_hi"]


def test_unit_table_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="2 units but 1 base"):
        probe.unit_table([probe.ProbeUnit("c", "a", 0)] * 2, ["x"], ["y", "z"])


def test_paired_cluster_bootstrap_resamples_contexts_not_units():
    # one context with many identical units must not look like many independent observations
    clusters = ["a"] * 50 + ["b", "c"]
    diffs = [1.0] * 50 + [-1.0, -1.0]
    r = paired_cluster_bootstrap(clusters, diffs, n=2000, seed=1)
    assert r["n_clusters"] == 3 and r["n_units"] == 52
    assert r["lo"] < 0 < r["hi"]  # 3 contexts, 2 negative: no significant effect
    assert significance_mark(r["lo"], r["hi"], r["n_clusters"]) == ""
    clear = paired_cluster_bootstrap([f"c{i}" for i in range(30)], [0.5] * 30)
    assert clear["lo"] == clear["hi"] == 0.5
    assert significance_mark(clear["lo"], clear["hi"], clear["n_clusters"]) == "*"
    # the same clear effect on too few contexts: the CI excludes 0, but no mark
    few = paired_cluster_bootstrap(["a", "b"], [0.5, 0.7])
    assert few["lo"] > 0 and significance_mark(few["lo"], few["hi"], few["n_clusters"]) == \
        ""
    empty = paired_cluster_bootstrap([], [])
    assert empty["n_units"] == 0 and empty["mean"] != empty["mean"]  # NaN


def _roster_rows(gains: dict[str, int], n_contexts: int = 12) -> pl.DataFrame:
    """One reader's view of persona_probe-shaped rows: for each persona, the adapter is
    identifiable on its first `gain` contexts (negative: the base is identifiable there and the
    adapter is not)."""
    rows = []
    for persona, gain in gains.items():
        for c in range(n_contexts):
            for s in range(2):
                hit = c < abs(gain)
                for arm, ident in (("base", hit and gain < 0), ("adapter", hit and gain > 0)):
                    rows.append({"persona_id": persona, "context_id": f"c{c}", "seed": s,
                                 "arm": arm, "format": "training",
                                 "model_version": f"m-{persona}/1" if arm == "adapter" else "base",
                                 "text": f"{arm} {c} {s}", "predicted": persona if ident else
                                 "other", "identifiable": float(ident), "consistency": 3.0,
                                 "relevance": 3.0, "copied": 0.0})
    return pl.DataFrame(rows)


def _plant(db: str, gains: dict[str, int], others: dict[str, dict[str, int]] | None = None,
           accuracies: dict[str, float] | None = None) -> None:
    """Write persona_probe, probe_readings and probe_readers into a real DuckDB file: the
    lexical reader sees `gains`, every reader of `others` its own gains."""
    from mascot_dag.lib.storage.db import replace_many

    views = {"lexical": gains, **(others or {})}
    accuracies = accuracies or dict.fromkeys(views, 0.9)
    texts = _roster_rows(gains).drop("predicted", "identifiable")
    readings = pl.concat([_roster_rows(g).select(*panel.UNIT, "predicted", "identifiable")
                          .with_columns(reader=pl.lit(r)) for r, g in views.items()])
    replace_many(db, [("persona_probe", texts, None, None),
                      ("probe_readings", readings, None, None),
                      ("probe_readers", pl.DataFrame({"persona_set": "support",
                                                      "reader": list(accuracies),
                                                      "accuracy": list(accuracies.values())}),
                       None, None)])


ROSTER = ("anchor", "beacon", "catalyst", "action_guide")


def test_roster_verdict_pools_personas_and_still_blocks_one_made_worse():
    def verdict(gains, n_contexts=12, min_contexts=6):
        rows = _roster_rows(gains, n_contexts)
        return probe.roster_verdict(probe.summarise(rows), list(gains), min_contexts)

    # two personas gain clearly, two not at all: no single weak persona blocks the roster
    mixed = verdict({"anchor": 6, "catalyst": 6, "beacon": 0, "action_guide": 0})
    assert mixed.passed and mixed.lo > 0 and mixed.n_contexts == 12 and mixed.n_units == 96
    assert mixed.gain == pytest.approx(0.25) and not mixed.worse
    assert "beacon +0.0" in mixed.description and "pooled" in mixed.description
    # nobody gains: the pooled CI holds zero
    assert not verdict(dict.fromkeys(ROSTER, 0)).passed
    # a pooled gain, but one persona made significantly worse on every context: blocks
    worse = verdict({"anchor": 12, "catalyst": 12, "beacon": 12, "action_guide": -12})
    assert worse.gain > 0 and worse.lo > 0 and worse.worse == ("action_guide",)
    assert not worse.passed and "significantly worse: action_guide" in worse.description
    # too few contexts for a mark, however clear
    assert not verdict(dict.fromkeys(ROSTER, 4), n_contexts=4).passed


def test_roster_verdict_names_a_persona_without_probe_rows():
    summary = probe.summarise(_roster_rows({"anchor": 3, "beacon": 3}))
    with pytest.raises(ValueError, match=r"no rows for persona\(s\) \['catalyst'\]"):
        probe.roster_verdict(summary, ["anchor", "beacon", "catalyst"], 6)


@pytest.mark.parametrize("blocking", [True, False])
def test_roster_probe_asset_is_the_stage1_gate(tmp_path, blocking):
    """The asset reads persona_probe from a real DuckDB file, logs to a real MLflow store and
    fails its run only when the profile makes the check blocking."""
    import dagster as dg

    from mascot_dag.assets.probe import persona_roster_probe
    from mascot_dag.resources.settings import LineageSettings
    from mascot_dag.resources.store import DuckDBStore
    from mascot_dag.resources.tracking import MLflowResource

    db = str(tmp_path / "m.duckdb")
    tracking = MLflowResource(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                              artifact_root=str(tmp_path / "art"))
    resources = {"store": DuckDBStore(path=db), "tracking": tracking,
                 "settings": LineageSettings(probe_blocking=blocking)}

    def run(gains):
        _plant(db, gains)
        return dg.materialize([persona_roster_probe], resources=resources, raise_on_error=False)

    good = run({"anchor": 6, "catalyst": 6, "beacon": 0, "action_guide": 0})
    check = good.get_asset_check_evaluations()[0]
    assert good.success and check.passed and check.check_name == "roster_fidelity_effect"
    meta = good.asset_materializations_for_node("persona_roster_probe")[0].metadata
    assert meta["n_units"].value == 96 and meta["identifiable_gain"].value == pytest.approx(0.25)
    assert "m-anchor/1" in meta["adapters"].value

    flat = run(dict.fromkeys(ROSTER, 0))
    assert not flat.get_asset_check_evaluations()[0].passed
    assert flat.success is not blocking  # blocking: the run fails, so Stage 2 never starts

    import mlflow

    mlflow.set_tracking_uri(tracking.uri)
    runs = mlflow.search_runs(experiment_names=["stage1_persona_alignment"])
    assert sorted(runs["params.passed"]) == ["False", "True"]
    assert runs["metrics.roster_n_units"].tolist() == [96.0, 96.0]


@pytest.mark.parametrize("gains, stage2_runs", [
    (dict.fromkeys(ROSTER, 0), False),  # no gain: the blocking gate stops Stage 2
    ({"anchor": 6, "catalyst": 6, "beacon": 0, "action_guide": 0}, True),  # planted gain
])
def test_the_stage1_gate_decides_whether_the_walk_reaches_stage2(home, monkeypatch, gains,
                                                                  stage2_runs):
    """The real walk (`pipeline.run_lineage`, the demo's path) over the Stage 1 gate and the
    first Stage 2 asset, with the probe's rows planted: a failing blocking gate leaves
    group_rollouts unmade (skipped, not failed); a planted gain lets the walk go on to it.
    (group_rollouts then fails for want of adapters and contexts: what matters is whether the
    walk started it.)"""
    import dagster as dg

    from mascot_dag.pipeline import (
        AP,
        lineage_definitions,
        parse_selection,
        prepare_home,
        run_lineage,
    )
    from mascot_dag.profiles import override_settings, resources_for

    monkeypatch.setenv("MASCOT_PROFILE", "tiny")
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    prepare_home()
    resources = resources_for()
    resources["settings"] = override_settings(resources["settings"], ["probe_blocking=true"])
    _plant(str(resources["store"].db_path), gains)
    graph = lineage_definitions(resources).resolve_asset_graph()
    selection: set[AP] = parse_selection(graph, ["persona_roster_probe", "group_rollouts"])
    with dg.DagsterInstance.ephemeral() as instance:
        results = run_lineage(resources, instance, selection=selection)
        started = {e.dagster_event.step_key for r in results for e in instance.all_logs(r.run_id)
                   if e.dagster_event and e.dagster_event.event_type_value == "STEP_START"}
    gate = next(r for r in results if "persona_roster_probe" in r.step.label)
    assert "persona_roster_probe" in started
    assert ("persona_roster_probe" not in gate.failed) is stage2_runs, gate.errors
    if not stage2_runs:
        assert any("roster_fidelity_effect" in e for e in gate.errors), gate.errors
    assert ("group_rollouts" in started) is stage2_runs, started


@pytest.mark.slow
def test_adapters_identical_to_the_base_fail_the_stage1_gate(tmp_path, base_model_path):
    """Known outcome: a real LoRA adapter at its initialisation (B = 0: the base model's outputs)
    for one persona, through the real probe (generation in both formats, judge, three readers):
    every text equals the base's, the gain is exactly zero, and the verdict does not pass."""
    import polars as pl
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mascot_dag.assets.contexts import DEMO_ED
    from mascot_dag.lib.data.empathetic import load_empathetic_dialogues
    from mascot_dag.lib.data.personas import load_personas, personas_of_set
    from mascot_dag.lib.judges.embedded import EmbeddedJudge
    from mascot_dag.lib.llm.transformers_backend import TransformersChat
    from mascot_dag.profiles import settings_for

    torch.manual_seed(0)
    lora = tmp_path / "identity-lora"
    cfg = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])  # B starts at 0
    get_peft_model(AutoModelForCausalLM.from_pretrained(base_model_path), cfg).save_pretrained(lora)
    backend = TransformersChat(base_model_path, os.environ["MASCOT_MODELS_DIR"], batch_size=8)
    backend.add_adapter("identity", str(lora))
    # both formats here (the tiny profile probes the training format only, for the suite's time)
    settings = settings_for("tiny").model_copy(update={"probe_formats": ["training", "chat"]})
    roster = personas_of_set(load_personas(), "support")
    ctxs = load_empathetic_dialogues(DEMO_ED).contexts[:4]
    # the panel: the fitted readers, and the embedded model itself as the judge reader (the
    # paper profiles' LLM judge path, on the model this machine has)
    judge_reader = readers.JudgeReader(backend.generate, {
        c.persona_id: f"{c.name}, {c.role}. {c.description}" for c in roster})
    readers_panel = [*readers.fitted_panel("support", settings.seed), (judge_reader, 0.3)]
    card = roster[0]
    table, readings, summary = probe.probe_persona(
        backend.generate, EmbeddedJudge(), card, roster, ctxs, {"adapter": "identity"},
        "identity/1", settings, readers_panel)
    assert set(table["format"]) == {"training", "chat"}
    for fmt in settings.probe_formats:
        part = table.filter(pl.col("format") == fmt)
        base = part.filter(pl.col("arm") == "base").sort("context_id", "seed")
        adapted = part.filter(pl.col("arm") == "adapter").sort("context_id", "seed")
        assert base["text"].to_list() == adapted["text"].to_list()
    # the two formats are different requests (the chat one has no training scaffolding)
    training, chat = (table.filter((pl.col("format") == f) & (pl.col("arm") == "base"))
                      .sort("context_id")["text"].to_list() for f in ("training", "chat"))
    assert training != chat
    assert set(readings["reader"]) == {"lexical", "semantic", "judge"}
    assert readings.height == 3 * table.height
    judged = readings.filter(pl.col("reader") == "judge")["predicted"].to_list()
    assert all(p is None or p in {c.persona_id for c in roster} for p in judged)
    assert set(summary["reader"]) == {"lexical", "semantic", "judge"}
    accuracies = {r.name: a for r, a in readers_panel}
    verdict = panel.persona_verdict(summary, accuracies, card.persona_id, 4)
    assert verdict.gain == 0 and not verdict.passed, verdict.description
    assert "judge" in verdict.invalid  # a reader below the threshold never counts


def _verdict(views: dict[str, dict[str, int]], accuracies: dict[str, float], n_contexts=12):
    summary = probe.reader_summary(
        _roster_rows(next(iter(views.values())), n_contexts).drop("predicted", "identifiable"),
        pl.concat([_roster_rows(g, n_contexts).select(*panel.UNIT, "predicted", "identifiable")
                   .with_columns(reader=pl.lit(r)) for r, g in views.items()]))
    return panel.panel_verdict(summary, accuracies, list(next(iter(views.values()))), 6)


def test_the_verdict_needs_every_valid_reader():
    gain = {"anchor": 8, "catalyst": 8, "beacon": 8, "action_guide": 8}
    flat = dict.fromkeys(ROSTER, 0)
    valid = {"lexical": 0.8, "semantic": 0.8}
    both = _verdict({"lexical": gain, "semantic": gain}, valid)
    assert both.passed and set(both.established) == set(ROSTER) and not both.invalid
    # one valid reader sees nothing: no gain, and the figure reported is that reader's
    one = _verdict({"lexical": gain, "semantic": flat}, valid)
    assert not one.passed and one.reader == "semantic/training" and one.gain == 0
    assert one.established == () and "does not pass" in one.description
    # ... unless that reader is not valid (below 75% on held-out references): it does not count
    weak = _verdict({"lexical": gain, "semantic": flat}, {"lexical": 0.8, "semantic": 0.6})
    assert weak.passed and weak.invalid == ("semantic",) and weak.reader == "lexical/training"
    assert "semantic/training (reader accuracy 60%, does not count)" in weak.description
    # a persona made worse under ANY valid reader blocks, however good the pooled figure
    worse = _verdict({"lexical": gain, "semantic": {**gain, "beacon": -12}}, valid)
    assert not worse.passed and worse.worse == ("beacon",)
    assert "beacon" not in worse.established
    # no valid reader: nothing is established
    none = _verdict({"lexical": gain, "semantic": gain}, {"lexical": 0.7, "semantic": 0.7})
    assert not none.passed and none.established == () and "no valid reader" in none.description


def test_reader_agreement_is_cohens_kappa():
    rows = _roster_rows({"anchor": 6, "beacon": 0}).select(*panel.UNIT, "predicted",
                                                           "identifiable")
    same = pl.concat([rows.with_columns(reader=pl.lit(r)) for r in ("lexical", "semantic")])
    assert panel.reader_agreement(same)["kappa"].to_list() == [pytest.approx(1.0)]
    flipped = rows.with_columns(predicted=pl.when(pl.col("predicted") == "other")
                                .then(pl.col("persona_id")).otherwise(pl.lit("other")))
    opposite = pl.concat([rows.with_columns(reader=pl.lit("lexical")),
                          flipped.with_columns(reader=pl.lit("semantic"))])
    agreement = panel.reader_agreement(opposite).row(0, named=True)
    assert agreement["kappa"] < 0 and agreement["n_texts"] == rows.height


def _keywords(utterances: dict[str, list[str]], persona: str, n: int) -> list[str]:
    """The words most particular to a persona's references (count here / count elsewhere)."""
    import re
    from collections import Counter

    def words(pid):
        return Counter(w for t in utterances[pid] for w in re.findall(r"[a-z']+", t.lower()))

    mine = words(persona)
    other = sum((words(q) for q in utterances if q != persona), Counter())
    score = {w: c / (1 + other[w]) for w, c in mine.items() if c >= 2 and len(w) > 3}
    return [w for w, _ in sorted(score.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def test_keyword_stuffing_gains_nothing_under_the_panel_while_a_true_shift_does():
    """Known outcomes with the real readers, fitted on three quarters of the support
    references: 'adapter' texts that say what ANOTHER persona says (a held-out reference of
    it) plus two of the intended persona's most particular words fool the lexical reader
    alone, so the panel gives no gain; 'adapter' texts that truly are the intended persona
    (its held-out references) give a gain every reader sees."""
    import numpy as np

    refs = readers.load_reference_utterances("support")
    rng = np.random.default_rng(0)
    train, held = {}, {}
    for pid, texts in refs.items():
        order = rng.permutation(len(texts))
        held[pid] = [texts[i] for i in order[:len(texts) // 4]]
        train[pid] = [texts[i] for i in order[len(texts) // 4:]]
    fitted = [(readers.LexicalReader(train), 0.0), (readers.SemanticReader(train), 0.0)]
    ids = sorted(refs)

    def probe_of(adapter_text) -> pl.DataFrame:
        rows = []
        for pid in ids:
            others = [q for q in ids if q != pid]
            for i in range(len(held[pid])):
                q = others[i % len(others)]
                base = held[q][i % len(held[q])]
                for arm, text in (("base", base), ("adapter", adapter_text(pid, i, base))):
                    rows.append({"persona_id": pid, "context_id": f"{pid}-{i}", "seed": 0,
                                 "arm": arm, "format": "training", "text": text,
                                 "consistency": 3.0, "relevance": 3.0, "copied": 0.0})
        texts = pl.DataFrame(rows)
        return probe.reader_summary(texts, probe.read_texts(fitted, texts))

    def pooled(summary, reader):
        return summary.filter((pl.col("reader") == reader) & (pl.col("persona") == "all")).row(
            0, named=True)

    # the rule under test, not the readers' validity (at three quarters of the references
    # they sit just under 75%; the threshold has its own test above)
    every = {"lexical": 1.0, "semantic": 1.0}
    # measured: lexical +27.5 [+15.0, +42.5], semantic +5.0 [-5.0, +15.0] (n = 40 units)
    stuffed = probe_of(lambda pid, i, base: f"{base} {' '.join(_keywords(train, pid, 2))}")
    assert pooled(stuffed, "lexical")["identifiable_lo"] > 0.05  # fooled: a "significant" gain
    assert pooled(stuffed, "semantic")["identifiable_lo"] < 0  # not fooled: CI holds zero
    verdict = panel.panel_verdict(stuffed, every, ids, 6)
    assert not verdict.passed and verdict.reader == "semantic/training", verdict.description
    shifted = probe_of(lambda pid, i, base: held[pid][i])
    verdict = panel.panel_verdict(shifted, every, ids, 6)
    assert verdict.passed and verdict.lo > 0.2, verdict.description


def test_a_database_from_before_the_panel_keeps_its_probe_rows(tmp_path):
    """An older file (persona_probe with the one classifier's prediction in it) is migrated on
    the first write connection: texts keep their rows as the training format, the prediction
    becomes the lexical reader's reading, nothing is lost."""
    import duckdb

    from mascot_dag.lib.storage import db

    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("""CREATE TABLE persona_probe (
            persona_id VARCHAR NOT NULL, context_id VARCHAR NOT NULL, seed INTEGER NOT NULL,
            arm VARCHAR NOT NULL, model_version VARCHAR NOT NULL, text VARCHAR NOT NULL,
            predicted VARCHAR, identifiable DOUBLE NOT NULL, consistency DOUBLE,
            relevance DOUBLE, copied DOUBLE NOT NULL,
            PRIMARY KEY (persona_id, context_id, seed, arm))""")
        con.execute("INSERT INTO persona_probe VALUES ('anchor', 'ed:1', 0, 'adapter', 'm/1', "
                    "'I hear you.', 'anchor', 1.0, 4.0, 3.0, 0.0), ('anchor', 'ed:1', 0, 'base', "
                    "'base', 'Ok.', 'beacon', 0.0, 2.0, 3.0, 0.0)")
    with db.connect(path):
        pass
    texts = db.query_pl(path, "SELECT * FROM persona_probe ORDER BY arm")
    assert texts["format"].to_list() == ["training", "training"]
    assert texts["text"].to_list() == ["I hear you.", "Ok."] and "predicted" not in texts.columns
    readings = db.query_pl(path, "SELECT * FROM probe_readings ORDER BY arm")
    assert readings.select("arm", "reader", "predicted", "identifiable").rows() == [
        ("adapter", "lexical", "anchor", 1.0), ("base", "lexical", "beacon", 0.0)]
