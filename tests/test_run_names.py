"""MLflow run names say what trained, how and how much (lib.storage.tracking.run_name); code finds
runs by their tags, so a name can change without breaking a lookup."""

from __future__ import annotations

import dagster as dg
import pytest

from mascot_dag.lib.storage.tracking import model_short_name, run_name


def test_run_name_says_what_trained_how_and_how_much():
    base = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert run_name("anchor", "GRPO", lora_r=8, steps=20, base=base) == (
        "anchor · GRPO LoRA r8 · 20 steps · SmolLM2-135M-Instruct")
    assert run_name("reward model", "Bradley-Terry", lora_r=4, steps=60, extra=["120 pairs"],
                    base=base) == (
        "reward model · Bradley-Terry LoRA r4 · 60 steps · 120 pairs · SmolLM2-135M-Instruct")
    # parts not given are left out; one step is singular
    assert run_name("director", "GRPO", steps=1) == "director · GRPO · 1 step"
    assert run_name("roster probe", extra=["4 adapters", ""]) == "roster probe · 4 adapters"
    assert run_name("policy", lora_r=8) == "policy · LoRA r8"
    assert run_name("eval report") == "eval report"


@pytest.mark.parametrize("model, short", [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
    ("embedded:smollm2-135m-instruct", "smollm2-135m-instruct"),
    ("/home/x/models/smollm2-135m-instruct/", "smollm2-135m-instruct"),
    ("Qwen2.5-0.5B-Instruct", "Qwen2.5-0.5B-Instruct"),
])
def test_model_short_name(model, short):
    assert model_short_name(model) == short


def test_policy_sft_run_is_named_for_what_it_trained(base_model_path, tmp_path, home):
    """A real one-step pi_SFT (the asset, through Dagster) into an MLflow sqlite store in
    tmp_path: its run carries the descriptive name, and the `asset` tag that code looks runs up
    by."""
    from mlflow import MlflowClient

    from mascot_dag.assets.reward_model import policy_sft
    from mascot_dag.lib.storage.tables import contexts_frame
    from mascot_dag.lib.types import Context
    from mascot_dag.resources.llm import TransformersChatResource
    from mascot_dag.resources.settings import LineageSettings
    from mascot_dag.resources.store import DuckDBStore
    from mascot_dag.resources.tracking import MLflowResource

    store = DuckDBStore(path=str(tmp_path / "m.duckdb"))
    turns = [{"speaker": "speaker", "text": "I failed my driving test again."},
             {"speaker": "listener", "text": "That is frustrating; you will pass next time."}]
    store.replace("contexts", contexts_frame([
        Context(f"ed:{i}", "empatheticdialogues", "emotional_support", "a test", "t",
                emotion="sad", valence="negative", turns=turns, split="train")
        for i in range(2)]))
    tracking = MLflowResource(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                              artifact_root=str(tmp_path / "artifacts"))
    result = dg.materialize([policy_sft], resources={
        "store": store, "chat": TransformersChatResource(model=base_model_path),
        "tracking": tracking,
        "settings": LineageSettings(policy_sft_steps=1, lora_r=4),
    })
    run_id = result.asset_materializations_for_node("policy_sft")[0].metadata[
        "mlflow_run_id"].value
    tracking.configure()
    run = MlflowClient().get_run(run_id)
    short = model_short_name(base_model_path)
    assert run.info.run_name == f"policy · SFT LoRA r4 · 1 step · 2 examples · {short}"
    assert run.data.tags["asset"] == "policy_sft"
    found = MlflowClient().search_runs([run.info.experiment_id], "tags.asset = 'policy_sft'")
    assert [r.info.run_id for r in found] == [run_id]
    # the run's Description says that one step is a smoke test, not training
    note = run.data.tags["mlflow.note.content"]
    assert note.startswith("Smoke test: 1 optimizer step") and "not that it learned" in note


def test_training_note_marks_short_runs_as_smoke_tests():
    from mascot_dag.lib.storage.tracking import training_note
    from mascot_dag.lib.training.common import SMOKE_TEST_STEPS

    assert training_note(SMOKE_TEST_STEPS - 1).startswith("Smoke test")
    assert not training_note(SMOKE_TEST_STEPS).startswith("Smoke test")
