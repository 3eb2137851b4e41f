"""Champion gate: paired per-context differences with a cluster-bootstrap CI (pure functions on
eval_scores-shaped frames), and the alias moves against a real MLflow sqlite registry."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest

from mascot_dag.assets.queries import method_versions
from mascot_dag.lib.dialogue.spec import DialogueRecord
from mascot_dag.lib.evaluation.champion import (
    PERSONA_CRITERIA,
    Decision,
    gate_decision,
    gate_tracking,
    paired_overall,
    relabel_method,
)
from mascot_dag.registry import (
    DIRECTOR_MODEL,
    apply_gate,
    champion_exists,
    current_champion_scores,
)
from mascot_dag.resources.store import DuckDBStore
from mascot_dag.resources.tracking import MLflowResource

# per-context base scores on the judges' 1-5 scale: contexts differ a lot (that is what pairing
# removes), so an unpaired comparison of means would be noisy
BASE = [2.0, 4.0, 3.0, 1.8, 3.8, 2.5, 3.5, 4.2, 1.6, 3.2, 2.2, 3.9]


def _scores(per_method: dict[str, list[float]]) -> pl.DataFrame:
    """eval_scores rows: one dialogue `eval:<method>:ctx<k>` per context, two criteria."""
    rows = []
    for method, values in per_method.items():
        for k, v in enumerate(values):
            for lvl, c in (("agent", "consistency"), ("collective", "fidelity")):
                rows.append({"method": method, "dialogue_id": f"eval:{method}:ctx{k:02d}",
                             "level": lvl, "judge": "embedded", "criterion": c, "value": v,
                             "higher_is_better": True})
    return pl.DataFrame(rows)


def _shift(values: list[float], by: float, jitter: float = 0.0) -> list[float]:
    return [v + by + (jitter if k % 2 else -jitter) for k, v in enumerate(values)]


def test_candidate_equal_to_champion_is_not_promoted():
    d = gate_decision(_scores({"mascot": BASE, "champion": BASE, "zero_shot": _shift(BASE, -0.5)}))
    assert d.rule == "vs_champion" and d.comparator == "champion"
    assert not d.promote
    assert d.diff == pytest.approx(0.0) and d.ci_lo == pytest.approx(0.0)
    assert d.n_contexts == len(BASE) and "n = 12" in d.reason


def test_clearly_better_candidate_is_promoted():
    d = gate_decision(_scores({"mascot": _shift(BASE, 0.5, 0.1), "champion": BASE}))
    assert d.promote, d.reason
    assert d.diff == pytest.approx(12.5)  # +0.5 on 1-5 = +12.5 on 0-100
    assert 10.0 < d.ci_lo < 12.5 < d.ci_hi < 15.0
    assert d.n_contexts == 12 and "promoted (beats the current champion)" in d.reason


def test_margin_must_be_cleared_by_the_whole_ci():
    scores = _scores({"mascot": _shift(BASE, 0.5, 0.1), "champion": BASE})
    # differences are 10 and 15 points (half each): CI about [11.2, 13.8]
    assert not gate_decision(scores, margin=12.0).promote  # mean 12.5 > margin, CI is not
    assert gate_decision(scores, margin=5.0).promote
    with pytest.raises(ValueError, match="margin"):
        gate_decision(scores, margin=-1.0)


def test_noisy_tiny_difference_with_two_contexts_is_not_promoted():
    two = BASE[:2]
    # both differences positive and tiny: a percentile CI over 2 contexts is [min, max] > 0
    lucky = gate_decision(_scores({"mascot": _shift(two, 0.02, 0.01), "champion": two}))
    assert lucky.ci_lo > 0 and lucky.n_contexts == 2
    assert not lucky.promote and "2 paired contexts < 8" in lucky.reason
    # noisy: even without the minimum the CI straddles zero
    noisy = _scores({"mascot": [two[0] + 0.3, two[1] - 0.2], "champion": two})
    d = gate_decision(noisy, min_contexts=1)
    assert d.ci_lo < 0 < d.ci_hi and not d.promote


def test_first_run_must_significantly_beat_zero_shot():
    better = gate_decision(_scores({"mascot": _shift(BASE, 0.4, 0.1), "zero_shot": BASE}),
                           champion_exists=False)
    assert better.rule == "first_run_vs_zero_shot" and better.comparator == "zero_shot"
    assert better.promote and "first champion" in better.reason
    same = gate_decision(_scores({"mascot": _shift(BASE, 0.0, 0.2), "zero_shot": BASE}))
    assert same.rule == "first_run_vs_zero_shot" and not same.promote
    # champion rows present but the registry says there is none: still the first-run rule
    d = gate_decision(_scores({"mascot": _shift(BASE, 0.4), "champion": _shift(BASE, 0.8),
                               "zero_shot": BASE}), champion_exists=False)
    assert d.comparator == "zero_shot" and d.promote


def test_persona_criteria_need_the_probe_panel_to_agree():
    """A candidate the judges would promote is kept out when the probe panel does not confirm
    the persona effect, and promoted when it does; without evidence the judges decide alone."""
    scores = _scores({"mascot": _shift(BASE, 0.5, 0.1), "zero_shot": BASE})
    assert gate_decision(scores, champion_exists=False).promote
    refuted = gate_decision(scores, champion_exists=False,
                            persona_evidence=(False, "semantic/training: -0.8 [-7.8, +5.9]"))
    assert not refuted.promote and "probe panel does not confirm" in refuted.reason
    assert "semantic/training: -0.8" in refuted.reason
    assert gate_decision(scores, champion_exists=False,
                         persona_evidence=(True, "every reader sees it")).promote
    # the panel cannot promote what the judges do not
    flat = _scores({"mascot": _shift(BASE, 0.0, 0.2), "zero_shot": BASE})
    assert not gate_decision(flat, champion_exists=False, persona_evidence=(True, "")).promote


def test_existing_champion_not_evaluated_fails_closed():
    d = gate_decision(_scores({"mascot": _shift(BASE, 0.8), "zero_shot": BASE}),
                      champion_exists=True)
    assert not d.promote and d.n_contexts == 0 and "not evaluated in this run" in d.reason


def test_pairs_by_context_not_by_row_order():
    scores = _scores({"mascot": _shift(BASE, 0.5), "champion": BASE[:10]})
    scores = scores.sample(fraction=1.0, shuffle=True, seed=3)  # rows in any order
    pairs = paired_overall(scores, "mascot", "champion")
    assert len(pairs) == 10  # ctx10, ctx11 have no champion dialogue
    assert pairs["diff"].to_list() == pytest.approx([12.5] * 10)
    assert pairs["context_id"].to_list() == [f"ctx{k:02d}" for k in range(10)]


def test_gate_tracking_records_decision_ci_and_n():
    d = gate_decision(_scores({"mascot": _shift(BASE, 0.5, 0.1), "champion": BASE}))
    params, metrics, tags = gate_tracking(d)
    assert params["gate.comparator"] == "champion" and params["gate.margin"] == 0.0
    assert metrics["gate.promote"] == 1.0 and metrics["gate.n_contexts"] == 12.0
    assert metrics["gate.ci_lo"] == pytest.approx(d.ci_lo)
    assert metrics["gate.diff"] == pytest.approx(12.5)
    assert tags == {"champion_decision": "promote", "champion_rule": "vs_champion"}
    empty = gate_decision(_scores({"mascot": BASE}), champion_exists=True)
    _, m, _ = gate_tracking(empty)
    assert "gate.ci_lo" not in m and not any(math.isnan(v) for v in m.values())


def test_relabel_method_renames_ids_rows_turns_directives():
    rec = DialogueRecord(
        {"dialogue_id": "eval:mascot:ed:1", "method": "mascot", "context_id": "ed:1"},
        [{"dialogue_id": "eval:mascot:ed:1", "turn_idx": 0}],
        [{"dialogue_id": "eval:mascot:ed:1", "turn_idx": 0}])
    (out,) = relabel_method([rec], "mascot", "champion")
    assert out.dialogue["dialogue_id"] == "eval:champion:ed:1"
    assert out.dialogue["method"] == "champion"
    assert out.turns[0]["dialogue_id"] == out.directives[0]["dialogue_id"] == "eval:champion:ed:1"
    assert rec.dialogue["method"] == "mascot"  # the input is not modified


def _register(tracking: MLflowResource, tmp_path, name: str) -> str:
    adapter = tmp_path / name
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with tracking.start_run("gate-test", name) as run:
        tracking.log_adapter(adapter)
    return tracking.register_version(name, run)


def test_gate_moves_alias_only_when_promoted(tmp_path):
    tracking = MLflowResource(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                              artifact_root=str(tmp_path / "art"))
    tracking.configure()
    v1 = _register(tracking, tmp_path, DIRECTOR_MODEL)
    assert not champion_exists(tracking)
    first = gate_decision(_scores({"mascot": _shift(BASE, 0.5), "zero_shot": BASE}),
                          champion_exists(tracking))
    assert first.promote and first.comparator == "zero_shot"
    assert apply_gate(tracking, first, {DIRECTOR_MODEL: v1}) == [f"{DIRECTOR_MODEL}@{v1}"]
    assert champion_exists(tracking)
    assert tracking.get_alias_version(DIRECTOR_MODEL, "champion") == v1
    from mlflow import MlflowClient

    tag = MlflowClient().get_model_version(DIRECTOR_MODEL, v1).tags["eval_overall"]
    assert float(tag) == pytest.approx(first.candidate, abs=1e-4)

    (tmp_path / "second").mkdir()
    v2 = _register(tracking, tmp_path / "second", DIRECTOR_MODEL)
    same = gate_decision(_scores({"mascot": BASE, "champion": BASE}), champion_exists(tracking))
    assert not same.promote
    assert apply_gate(tracking, same, {DIRECTOR_MODEL: v2}) == []
    assert tracking.get_alias_version(DIRECTOR_MODEL, "champion") == v1
    better = gate_decision(_scores({"mascot": _shift(BASE, 0.5, 0.1), "champion": BASE}),
                           champion_exists(tracking))
    assert better.promote
    apply_gate(tracking, better, {DIRECTOR_MODEL: v2})
    assert tracking.get_alias_version(DIRECTOR_MODEL, "champion") == v2
    assert not apply_gate(tracking, Decision(False, "kept"), {DIRECTOR_MODEL: v1})


def test_leftover_champion_dialogues_of_an_old_champion_are_not_compared(tmp_path):
    tracking = MLflowResource(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                              artifact_root=str(tmp_path / "art"))
    tracking.configure()
    v1 = _register(tracking, tmp_path, DIRECTOR_MODEL)
    (tmp_path / "second").mkdir()
    v2 = _register(tracking, tmp_path / "second", DIRECTOR_MODEL)
    tracking.set_alias(DIRECTOR_MODEL, "champion", v2)
    store = DuckDBStore(path=str(tmp_path / "m.duckdb"))
    scores = _scores({"mascot": _shift(BASE, 0.5), "champion": BASE})

    def champion_ran_with(version: str) -> None:
        store.replace("dialogues", pl.DataFrame([{
            "dialogue_id": "eval:champion:ctx00", "stage": "eval", "method": "champion",
            "context_id": "ctx00", "mode": "support", "user_profile": None, "seed": 0,
            "n_turns": 2, "models": json.dumps({"director": f"{DIRECTOR_MODEL}@v{version}"})}]))

    champion_ran_with(v1)  # left over from before the alias moved to v2
    def current():
        return current_champion_scores(tracking, scores, method_versions(store, "champion"))

    kept = current()
    assert "champion" not in set(kept["method"])
    assert not gate_decision(kept, champion_exists(tracking)).promote
    champion_ran_with(v2)
    assert len(current()) == len(scores)
    assert gate_decision(current(), True).promote


def test_eval_run_stores_the_gates_comparison_first():
    from mascot_dag.assets.common import method_partitions
    from mascot_dag.assets.evaluation import run_order

    keys = method_partitions.get_partition_keys()
    order = run_order(keys)
    assert order[:3] == ["mascot", "champion", "zero_shot"] and sorted(order) == sorted(keys)
    # a range without them keeps its partition order
    assert run_order(["sft", "few_shot", "mascot_c"]) == ["sft", "few_shot", "mascot_c"]


def test_gate_criteria_stop_a_promotion_on_relevance_alone():
    """The second study evaluation's shape: far better relevance, the persona criteria equal."""
    rows = []
    for method, rel in (("mascot", 0.9), ("zero_shot", 0.0)):
        for k, v in enumerate(BASE):
            for lvl, c, value in (("agent", "consistency", v),
                                  ("agent", "response_relevance", min(v + rel, 5.0)),
                                  ("collective", "fidelity", v + (0.05 if k % 2 else -0.05))):
                rows.append({"method": method, "dialogue_id": f"eval:{method}:ctx{k:02d}",
                             "level": lvl, "judge": "embedded", "criterion": c, "value": value,
                             "higher_is_better": True})
    scores = pl.DataFrame(rows)
    everything = gate_decision(scores, champion_exists=False)
    assert everything.promote and "over all judge criteria" in everything.reason
    persona = gate_decision(scores, champion_exists=False, criteria=PERSONA_CRITERIA)
    assert not persona.promote and persona.criteria == PERSONA_CRITERIA
    assert persona.diff == pytest.approx(0.0, abs=1e-9)
    assert "over agent/consistency" in persona.reason
    assert gate_tracking(persona)[0]["gate.criteria"].startswith("agent/consistency,")
    # bare names work; a typo or a metric (not a judge criterion) is refused, naming it
    assert gate_decision(scores, champion_exists=False, criteria=["response_relevance"]).promote
    for bad in ("consistancy", "automatic/distinct_1", "collective/consistency"):
        with pytest.raises(ValueError, match=bad.replace("/", ".")):
            gate_decision(scores, criteria=[bad])


def test_gate_criteria_setting_is_checked_when_configured():
    from pydantic import ValidationError

    from mascot_dag.profiles import settings_for
    from mascot_dag.resources.settings import LineageSettings

    assert settings_for("study").gate_criteria == list(PERSONA_CRITERIA)
    assert settings_for("embedded").gate_criteria == []
    with pytest.raises(ValidationError, match="'consistancy' is not a judge criterion"):
        LineageSettings(gate_criteria=["consistancy"])
