"""The whole lineage end to end on the `tiny` profile: real model, real DuckDB, real MLflow.

One module-scoped home is shared by the assertions below (the run is the expensive part).
"""

from __future__ import annotations

import json
import os

import duckdb
import pytest

# The fixture runs the whole lineage (~12 min on 2 quiet cores); it counts toward the first
# test's timeout, so the module gets more than the suite default of 900 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def lineage(tmp_path_factory):
    home = tmp_path_factory.mktemp("lineage")
    old = {k: os.environ.get(k) for k in ("MASCOT_HOME", "DAGSTER_HOME")}
    os.environ["MASCOT_HOME"] = str(home)
    os.environ["DAGSTER_HOME"] = str(home / "dagster")
    try:
        from mascot_dag.pipeline import prepare_home, run_lineage
        from mascot_dag.profiles import resources_for

        prepare_home()
        results = run_lineage(resources_for("tiny"))
        failures = [
            e.step_failure_data.error.to_string()[-2000:]
            for r in results for e in r.all_events if e.is_step_failure
        ]
        assert not failures, failures[0]
        yield home, results
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def q(home, sql):
    con = duckdb.connect(str(home / "mascot.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_stage1_tables(lineage):
    home, _ = lineage
    assert q(home, "SELECT count(DISTINCT persona_id) FROM candidates")[0][0] == 4
    crits = {r[0] for r in q(home, "SELECT DISTINCT criterion FROM judgments")}
    assert len(crits) == 5
    assert q(home, "SELECT count(*) FROM preference_pairs WHERE margin < 0.5")[0][0] == 0
    # cross-persona judging: every candidate is judged AS each of the 4 personas
    per_target = q(home, "SELECT count(DISTINCT persona_id) FROM judgments GROUP BY target_id")
    assert {r[0] for r in per_target} == {4}
    # candidates come from pi_SFT, on the few-shot sampling prompt
    models = {r[0] for r in q(home, "SELECT DISTINCT model FROM candidates")}
    assert all("mascot-policy-sft@v" in m for m in models), models


def test_persona_probe_is_paired(lineage):
    home, _ = lineage
    rows = q(home, "SELECT persona_id, arm, count(*) FROM persona_probe GROUP BY ALL")
    counts = {(p, a): n for p, a, n in rows}
    assert {p for p, _ in counts} == {"anchor", "catalyst", "beacon", "action_guide"}
    for p in {p for p, _ in counts}:
        assert counts[(p, "base")] == counts[(p, "adapter")] > 0  # same units in both arms
    unpaired = q(home, "SELECT count(*) FROM persona_probe a LEFT JOIN persona_probe b "
                       "ON a.persona_id = b.persona_id AND a.context_id = b.context_id "
                       "AND a.seed = b.seed AND b.arm = 'base' WHERE a.arm = 'adapter' "
                       "AND b.text IS NULL")[0][0]
    assert unpaired == 0


def test_registry_holds_versions_linked_to_runs(lineage):
    home, _ = lineage
    from mlflow import MlflowClient

    import mascot_dag.lib.tracking as tracking

    tracking.configure(f"sqlite:///{home}/mlflow.db", home / "mlartifacts")
    client = MlflowClient()
    names = {m.name for m in client.search_registered_models()}
    expected = {"mascot-persona-reward", "mascot-director", "mascot-persona-anchor",
                "mascot-policy-sft",
                "mascot-persona-catalyst", "mascot-persona-beacon", "mascot-persona-action-guide"}
    assert expected <= names, names
    for name in expected:
        v = client.search_model_versions(f"name = '{name}'")[0]
        assert client.get_run(v.run_id).info.status == "FINISHED"


def test_stage2_dialogues_have_directives_and_group_scores(lineage):
    home, _ = lineage
    modes = {r[0] for r in q(home, "SELECT DISTINCT mode FROM dialogues WHERE stage = 'rollout'")}
    assert modes == {"support", "meeting"}
    missing = q(home, "SELECT count(*) FROM turns t LEFT JOIN directives d "
                      "USING (dialogue_id, turn_idx) WHERE t.role = 'agent' "
                      "AND t.dialogue_id LIKE 'rollout:%' AND d.speaker IS NULL")[0][0]
    assert missing == 0
    crits = {r[0] for r in q(home, "SELECT DISTINCT criterion FROM group_judgments")}
    assert len(crits) == 4


def test_evaluation_covers_every_method_and_reports(lineage):
    home, _ = lineage
    from mascot_dag.lib.methods import METHODS

    methods = {r[0] for r in q(home, "SELECT DISTINCT method FROM eval_scores")}
    assert methods == set(METHODS)
    report = (home / "reports" / "latest.md").read_text(encoding="utf-8")
    for m in METHODS:
        assert m in report
    assert list((home / "reports").glob("*/*.png"))


def test_champion_alias_follows_the_gate_decision(lineage):
    """The first run promotes only if MASCOT significantly beats zero-shot (paired CI); the
    alias exists exactly when the report says "promote", on the versions the eval used."""
    home, _ = lineage
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    import mascot_dag.lib.tracking as tracking

    tracking.configure(f"sqlite:///{home}/mlflow.db", home / "mlartifacts")
    report = (home / "reports" / "latest.md").read_text(encoding="utf-8")
    promoted = "promote" in report and "keep current champion" not in report
    models = json.loads(q(home, "SELECT models FROM dialogues WHERE method = 'mascot' "
                                "AND stage = 'eval' LIMIT 1")[0][0])
    director = models["director"].split("@v")[1]
    try:
        champion = MlflowClient().get_model_version_by_alias("mascot-director", "champion")
    except MlflowException:
        champion = None
    if promoted:
        assert champion is not None and str(champion.version) == director
    else:
        assert champion is None


def test_chat_two_turns_with_the_trained_group(lineage):
    import subprocess
    import sys
    from pathlib import Path

    home, _ = lineage
    env = {**os.environ, "MASCOT_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "mascot"), "chat", "--turns", "2",
         "--max-new-tokens", "12"],
        input="I failed my driving test today.\nI think I was too nervous.\n",
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # champion versions when the gate promoted, else the base model with persona prompts
    assert "Using champion versions" in proc.stdout or "No champion in MLflow yet" in proc.stdout
    replies = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    assert len(replies) == 4, proc.stdout  # 2 messages x 2 agents per round


def test_report_command(lineage):
    import subprocess
    import sys
    from pathlib import Path

    home, _ = lineage
    proc = subprocess.run([str(Path(sys.executable).parent / "mascot"), "report"],
                          env={**os.environ, "MASCOT_HOME": str(home)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "latest.md" in proc.stdout
