"""The persona probe: its independent classifier, and the paired, context-clustered summary."""

from __future__ import annotations

import os

import polars as pl
import pytest

from mascot_dag.lib.data.personas import load_personas, personas_of_set
from mascot_dag.lib.evaluation.stats import paired_cluster_bootstrap, significance_mark
from mascot_dag.lib.stage1 import probe


@pytest.mark.parametrize("persona_set", ["support", "workplace"])
def test_reference_classifier_recognises_held_out_reference_utterances(persona_set):
    utterances = probe.load_reference_utterances(persona_set)
    cards = personas_of_set(load_personas(), persona_set)
    assert set(utterances) == {c.persona_id for c in cards}
    assert all(len(v) >= 30 for v in utterances.values())
    # well above chance (1/4) on utterances it never saw: the probe can tell personas apart
    assert probe.cross_validated_accuracy(utterances) > 0.55


def test_reference_utterances_do_not_copy_the_cards():
    """The probe must not reward copying a card: its data shares no 4-gram with the cards."""
    from mascot_dag.lib.judges.features import card_grams, copied_grams

    for card in personas_of_set(load_personas(), "support"):
        grams = card_grams(card)
        texts = probe.load_reference_utterances("support")[card.persona_id]
        assert sum(copied_grams(t, grams) > 0 for t in texts) == 0, card.persona_id


def test_bad_reference_file_names_the_file(tmp_path):
    (tmp_path / "support.yaml").write_text("utterances:\n  anchor: [1, 2]\n  beacon: ['x']\n")
    with pytest.raises(ValueError, match=r"support\.yaml: utterances\.anchor"):
        probe.load_reference_utterances("support", tmp_path)
    with pytest.raises(FileNotFoundError, match="workplace"):
        probe.load_reference_utterances("workplace", tmp_path)


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
    """persona_probe-shaped rows: for each persona, the adapter is identifiable on its first
    `gain` contexts (negative: the base is identifiable there and the adapter is not)."""
    rows = []
    for persona, gain in gains.items():
        for c in range(n_contexts):
            for s in range(2):
                hit = c < abs(gain)
                for arm, ident in (("base", hit and gain < 0), ("adapter", hit and gain > 0)):
                    rows.append({"persona_id": persona, "context_id": f"c{c}", "seed": s,
                                 "arm": arm, "model_version": f"m-{persona}/1" if arm ==
                                 "adapter" else "base", "text": f"{arm} {c} {s}",
                                 "predicted": persona if ident else "other",
                                 "identifiable": float(ident), "consistency": 3.0,
                                 "relevance": 3.0, "copied": 0.0})
    return pl.DataFrame(rows)


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
    from mascot_dag.lib.storage.db import replace_rows
    from mascot_dag.resources.settings import LineageSettings
    from mascot_dag.resources.store import DuckDBStore
    from mascot_dag.resources.tracking import MLflowResource

    db = str(tmp_path / "m.duckdb")
    tracking = MLflowResource(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                              artifact_root=str(tmp_path / "art"))
    resources = {"store": DuckDBStore(path=db), "tracking": tracking,
                 "settings": LineageSettings(probe_blocking=blocking)}

    def run(gains):
        replace_rows(db, "persona_probe", _roster_rows(gains))
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

    from mascot_dag.lib.storage.db import replace_rows
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
    replace_rows(str(resources["store"].db_path), "persona_probe", _roster_rows(gains))
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
    for one persona, through the real probe (generation, judge, classifier): every text equals
    the base's, the gain is exactly zero, and the roster verdict does not pass."""
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
    settings = settings_for("tiny")
    roster = personas_of_set(load_personas(), "support")
    ctxs = load_empathetic_dialogues(DEMO_ED).contexts[:4]
    judge, rows, summaries = EmbeddedJudge(), [], []
    for card in roster[:1]:
        table, summary = probe.probe_persona(backend.generate, judge, card, roster, ctxs,
                                             {"adapter": "identity"}, "identity/1", settings)
        rows.append(table)
        summaries.append(summary)
    table = pl.concat(rows)
    base = table.filter(pl.col("arm") == "base").sort("persona_id", "context_id", "seed")
    adapted = table.filter(pl.col("arm") == "adapter").sort("persona_id", "context_id", "seed")
    assert base["text"].to_list() == adapted["text"].to_list()
    summary = probe.summarise(table, seed=settings.seed)
    verdict = probe.roster_verdict(summary, [roster[0].persona_id], 4)
    assert verdict.gain == 0 and not verdict.passed, verdict.description
