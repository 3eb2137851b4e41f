"""The whole lineage end to end on the `tiny` profile: real model, real DuckDB, real MLflow.

The lineage runs the way a user runs it in the UI: `dagster dev` on a fresh MASCOT_HOME, then
"Materialize all" as the UI sends it for assets with different partitions (GraphQL
`launchPartitionBackfill` with `assetSelection` and `allPartitions: true`, the "pureAll" branch
of the webapp's launch button). The daemon runs it as an asset backfill: one asset run per
partition group, and one run over the whole range for assets with a single-run backfill policy
(every persona- and method-partitioned asset: 7 runs in all). One module-scoped home is shared
by the assertions below (the run is the expensive part); the last test re-runs the in-process
path (`make demo`) for what is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import q
from test_ui import DAGSTER, REPO, _free_port, _graphql, _stop, _wait_ready

# The fixture runs the whole lineage through the daemon (7 runs, each a process that loads the
# models, plus the daemon's 30 s backfill ticks between them); it counts toward the first
# test's timeout, so the module gets more than the suite default of 900 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
BACKFILL_TIMEOUT_S = float(os.environ.get("MASCOT_BACKFILL_TIMEOUT_S", "3000"))

LAUNCH = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId }
  ... on PythonError { message stack } ... on InvalidSubsetError { message } } }"""
BACKFILL = """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
  __typename ... on PartitionBackfill { status isAssetBackfill
    runs(limit: 200) { id jobName status tags { key value } assetSelection { path } } } } }"""
CHECKS = """{ assetNodeOrError(assetKey: {path: ["eval_report"]}) { ... on AssetNode {
  assetChecksOrError { ... on AssetChecks { checks { name
    executionForLatestMaterialization { status } } } } } } }"""


def _vars(base: str, query: str, variables: dict) -> dict:
    import urllib.request

    req = urllib.request.Request(f"{base}/graphql", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"query": query, "variables": variables}).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        body = json.loads(r.read())
    assert "errors" not in body, f"GraphQL errors: {body['errors']}"
    return body["data"]


def _materialize_all(base: str, nodes: list[dict]) -> dict:
    """Launch what the UI's Materialize all launches, wait until the backfill ends."""
    keys = [{"path": n["assetKey"]["path"]} for n in nodes]
    out = _vars(base, LAUNCH, {"p": {"assetSelection": keys, "allPartitions": True,
                                     "tags": [{"key": "mascot/test", "value": "lineage"}]}})
    launched = out["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    deadline = time.monotonic() + BACKFILL_TIMEOUT_S
    while True:
        bf = _vars(base, BACKFILL, {"id": launched["backfillId"]})["partitionBackfillOrError"]
        if bf["status"] not in ("REQUESTED", "CANCELING", "FAILING"):
            return bf
        assert time.monotonic() < deadline, f"backfill still {bf['status']}: {bf['runs']}"
        time.sleep(3)  # the daemon ticks every 30 s; a 10 s poll added ~5 s on average


@pytest.fixture(scope="module")
def lineage(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lineage")
    home = tmp / "home"
    old = {k: os.environ.get(k) for k in ("MASCOT_HOME", "DAGSTER_HOME")}
    os.environ["MASCOT_HOME"] = str(home)
    os.environ["DAGSTER_HOME"] = str(home / "dagster")
    from mascot_dag.pipeline import prepare_home

    prepare_home()  # dagster.yaml: one run at a time, the duckdb pool
    env = {**os.environ, "MASCOT_PROFILE": "tiny", "HF_HUB_OFFLINE": "1"}
    port = _free_port()
    base, log = f"http://127.0.0.1:{port}", tmp / "dagster_dev.log"
    cmd = ["setsid", "env", "--default-signal=INT,TERM", str(DAGSTER), "dev",
           "-h", "127.0.0.1", "-p", str(port), "-m", "mascot_dag.definitions"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        nodes = _wait_ready(base, proc, log)
        t0 = time.monotonic()
        backfill = _materialize_all(base, nodes)
        checks = _graphql(base, CHECKS)["assetNodeOrError"]["assetChecksOrError"]["checks"]
        print(f"\nMaterialize all: {backfill['status']} in {time.monotonic() - t0:.0f} s, "
              f"{len(backfill['runs'])} runs", file=sys.stderr)
    finally:
        _stop(proc)
    try:
        failed = [r for r in backfill["runs"] if r["status"] != "SUCCESS"]
        assert backfill["status"] == "COMPLETED_SUCCESS" and not failed, (
            f"{backfill['status']}: failed runs {failed}\n{log.read_text()[-3000:]}")
        yield {"home": home, "backfill": backfill, "checks": checks}
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_materialize_all_is_asset_runs_through_eval_report(lineage):
    """Every run of the backfill is an asset run of the real assets (no nesting op, no
    ephemeral job); the persona-partitioned assets run as ONE run per asset group over every
    persona (their single-run backfill policy: candidates, judgments and pairs together, then the
    adapters), ONE run for every eval method (eval_dialogues' policy), and eval_report's check
    ran."""
    runs = lineage["backfill"]["runs"]
    assert lineage["backfill"]["isAssetBackfill"]
    assert {r["jobName"] for r in runs} == {"__ASSET_JOB"}, {r["jobName"] for r in runs}
    from mascot_dag.assets.common import method_partitions, persona_partitions

    tags = [{t["key"]: t["value"] for t in r["tags"]} for r in runs]
    parts = {t["dagster/partition"] for t in tags if "dagster/partition" in t}
    assert not parts, f"a run per partition: {parts}"
    ranges = {}
    for r, t in zip(runs, tags, strict=True):
        if "dagster/asset_partition_range_start" in t:
            key = (t["dagster/asset_partition_range_start"], t["dagster/asset_partition_range_end"])
            ranges.setdefault(key, []).append(
                sorted("/".join(a["path"]) for a in r["assetSelection"] or []))
    personas = persona_partitions.get_partition_keys()
    methods = method_partitions.get_partition_keys()
    assert {k: sorted(v) for k, v in ranges.items()} == {
        (personas[0], personas[-1]): [["candidate_responses", "persona_judgments",
                                       "persona_preference_pairs"], ["persona_adapters"]],
        (methods[0], methods[-1]): [["eval_dialogues"]]}, ranges
    assert len(runs) == 7, [r["assetSelection"] for r in runs]
    checks = {c["name"]: c["executionForLatestMaterialization"] for c in lineage["checks"]}
    assert checks["champion_gate"] is not None, checks
    assert checks["champion_gate"]["status"] in ("SUCCEEDED", "FAILED"), checks


def test_stage1_tables(lineage):
    home = lineage["home"]
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
    home = lineage["home"]
    rows = q(home, "SELECT persona_id, arm, count(*) FROM persona_probe GROUP BY ALL")
    counts = {(p, a): n for p, a, n in rows}
    assert {p for p, _ in counts} == {"anchor", "catalyst", "beacon", "action_guide"}
    for p in {p for p, _ in counts}:
        assert counts[(p, "base")] == counts[(p, "adapter")] > 0  # same units in both arms
    unpaired = q(home, "SELECT count(*) FROM persona_probe a LEFT JOIN persona_probe b "
                       "ON a.persona_id = b.persona_id AND a.context_id = b.context_id "
                       "AND a.seed = b.seed AND a.format = b.format AND b.arm = 'base' "
                       "WHERE a.arm = 'adapter' AND b.text IS NULL")[0][0]
    assert unpaired == 0
    # the tiny profile probes the training format only (the chat format: tests/test_probe.py)
    assert {r[0] for r in q(home, "SELECT DISTINCT format FROM persona_probe")} == {"training"}
    # every text read by every reader of the panel, each reader's validity stored
    readers = {r[0] for r in q(home, "SELECT reader FROM probe_readers")}
    assert readers == {"lexical", "semantic"}  # the tiny profile has no LLM judge
    unread = q(home, "SELECT count(*) FROM persona_probe p CROSS JOIN probe_readers r "
                     "LEFT JOIN probe_readings x USING (persona_id, context_id, seed, arm, "
                     "format, reader) WHERE x.identifiable IS NULL")[0][0]
    assert unread == 0


def test_registry_holds_versions_linked_to_runs(lineage):
    home = lineage["home"]
    from mlflow import MlflowClient

    import mascot_dag.lib.storage.tracking as tracking

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
    # the director's run says how far its steps moved the weights (LoRA B starts at zero)
    director = client.search_model_versions("name = 'mascot-director'")[0]
    assert client.get_run(director.run_id).data.metrics["lora_delta_relative"] > 0
    # the tiny profile trains group-aware: one of its two GRPO prompts shows another persona's
    # turn, and the novelty reward is one of the rewards
    anchor = client.search_model_versions("name = 'mascot-persona-anchor'")[0]
    params = client.get_run(anchor.run_id).data.params
    assert "novelty_reward" in params["reward_funcs"], params["reward_funcs"]
    assert params["prompts_with_group_history"] == "1", params
    # MLflow as a training tracker: training experiments are of the training kind (MLflow 3's
    # UI shows runs with curves, not its GenAI views), each curve one point per optimizer step
    for exp in client.search_experiments():
        if exp.name == "Default":
            continue
        kind = "custom_model_development" if exp.name == "evaluation" else "finetuning"
        assert exp.tags.get("mlflow.experimentKind") == kind, (exp.name, exp.tags)
    steps = int(params["max_steps"])
    for key in ("reward", "loss"):
        history = client.get_metric_history(anchor.run_id, key)
        assert sorted(m.step for m in history) == list(range(1, steps + 1)), (key, history)


def test_stage2_dialogues_have_directives_and_group_scores(lineage):
    home = lineage["home"]
    modes = {r[0] for r in q(home, "SELECT DISTINCT mode FROM dialogues WHERE stage = 'rollout'")}
    assert modes == {"support", "meeting"}
    missing = q(home, "SELECT count(*) FROM turns t LEFT JOIN directives d "
                      "USING (dialogue_id, turn_idx) WHERE t.role = 'agent' "
                      "AND t.dialogue_id LIKE 'rollout:%' AND d.speaker IS NULL")[0][0]
    assert missing == 0
    crits = {r[0] for r in q(home, "SELECT DISTINCT criterion FROM group_judgments")}
    assert len(crits) == 4


def test_evaluation_covers_every_method_and_reports(lineage):
    home = lineage["home"]
    from mascot_dag.lib.evaluation.methods import METHODS

    methods = {r[0] for r in q(home, "SELECT DISTINCT method FROM eval_scores")}
    assert methods == set(METHODS)
    report = (home / "reports" / "latest.md").read_text(encoding="utf-8")
    for m in METHODS:
        assert m in report
    assert list((home / "reports").glob("*/*.png"))


def test_champion_alias_follows_the_gate_decision(lineage):
    """The first run promotes only if MASCOT significantly beats zero-shot (paired CI); the
    alias exists exactly when the report says "promote", on the versions the eval used."""
    home = lineage["home"]
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    import mascot_dag.lib.storage.tracking as tracking

    tracking.configure(f"sqlite:///{home}/mlflow.db", home / "mlartifacts")
    report = (home / "reports" / "latest.md").read_text(encoding="utf-8")
    promoted = "**Decision:** promote" in report
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

    home = lineage["home"]
    # the chat speaks as the profile that trained the group evaluated it (mascot_dag.companions)
    env = {**os.environ, "MASCOT_HOME": str(home), "HF_HUB_OFFLINE": "1", "MASCOT_PROFILE": "tiny"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "mascot"), "chat", "--turns", "2",
         "--max-new-tokens", "12"],
        input="I failed my driving test today.\nI think I was too nervous.\n",
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the champion when the gate promoted, else the latest trained versions, labelled so
    assert "models: champion" in proc.stdout or "models: latest, not promoted" in proc.stdout
    replies = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    from mascot_dag.profiles import settings_for

    per_round = settings_for("tiny").agents_per_round  # as evaluated, not a chat default
    assert len(replies) == 2 * per_round, proc.stdout


def test_report_command(lineage):
    import subprocess
    import sys
    from pathlib import Path

    home = lineage["home"]
    proc = subprocess.run([str(Path(sys.executable).parent / "mascot"), "report"],
                          env={**os.environ, "MASCOT_HOME": str(home)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "latest.md" in proc.stdout
    # the verdict first, in plain words, with its figures; then the overall table with headers
    verdict = proc.stdout.split("## Verdict: did training work?")[1].split("\n## ")[0]
    assert "Stage 1, persona probe" in verdict and "Stage 2 (director)" in verdict
    assert "Too small to conclude anything" in verdict  # the tiny profile's 2 contexts
    assert "Stage 1, reward model" in verdict
    if "GRPO reward" in verdict:
        assert "smoke test" in verdict  # the tiny profile's GRPO steps
    assert "| method | overall |" in proc.stdout


def test_probe_command_prints_the_panel(lineage):
    """`mascot probe` on the demo's home: one row per reader and format with the reader's
    accuracy, the agreement of the readers (kappa) and the verdict line."""
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run([str(Path(sys.executable).parent / "mascot"), "probe"],
                          env={**os.environ, "MASCOT_HOME": str(lineage["home"])},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    rows = [ln.split() for ln in out.splitlines()
            if ln.split()[:1] in (["lexical"], ["semantic"])]
    assert sorted((r[0], r[1]) for r in rows) == [("lexical", "training"),
                                                  ("semantic", "training")], out
    assert all(r[2].endswith("%") and r[3] in ("yes", "no") for r in rows), out
    assert "Cohen's kappa" in out and "verdict: " in out, out


def test_rerun_materialises_only_what_is_missing(lineage):
    """Re-materialise one eval method's partition behind the lineage's back: its descendants are
    now older than it (stale), so `mascot demo --missing-only`'s in-process walk redoes exactly
    what reads it, nothing upstream and not the fresh partition itself. (SQLite event storage
    cannot wipe one partition, so staleness stands in for a lost or failed partition; both go
    through the same `stale_or_missing`.)"""
    import dagster as dg

    from mascot_dag.definitions import defs
    from mascot_dag.pipeline import lineage_definitions, run_lineage
    from mascot_dag.profiles import resources_for

    graph = defs.resolve_asset_graph()
    key = dg.AssetKey("eval_dialogues")
    resources = resources_for("tiny")
    with dg.DagsterInstance.get() as instance:
        job = lineage_definitions(resources).resolve_implicit_global_asset_job_def()
        assert job.execute_in_process(instance=instance, asset_selection=[key],
                                      partition_key="zero_shot").success
        results = run_lineage(resources, instance=instance, missing_only=True)
    done = {(k.to_user_string(), p) for r in results for k in r.step.assets
            for p in r.step.partitions}
    below, stack = set(), [key]
    while stack:  # every descendant (all unpartitioned here)
        for child in graph.get(stack.pop()).child_keys - below:
            below.add(child)
            stack.append(child)
    expected = {(k.to_user_string(), None) for k in below}
    assert all(r.success for r in results), [r.errors for r in results]
    assert done == expected, (done, expected)
    # the in-process walk records runs of the same asset job as the daemon's
    with dg.DagsterInstance.get() as instance:
        assert instance.get_run_by_id(results[0].run_id).job_name == "__ASSET_JOB"
