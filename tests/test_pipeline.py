"""Whole-lineage order from the asset graph (mascot_dag.pipeline), without running an asset.

The plan is what `make demo` executes; these tests pin the semantics the design relies on: every
asset partition exactly once, after everything it reads; every persona's candidates before any
judging; a failed partition skips only what reads it; the instance settings and the pool.
"""

from __future__ import annotations

import dagster as dg
import pytest

from mascot_dag.assets.common import DUCKDB_POOL, TRAINED_PERSONAS, method_partitions
from mascot_dag.pipeline import (
    LineageWalk,
    asset_partitions,
    parent_partitions,
    plan,
    prepare_home,
)


@pytest.fixture(scope="module")
def graph():
    from mascot_dag.definitions import defs

    return defs.resolve_asset_graph()


def K(name: str) -> dg.AssetKey:
    return dg.AssetKey(name)


def test_plan_runs_every_partition_once_after_its_parents(graph):
    steps = plan(graph)
    seen: list = []
    for step in steps:
        for key in step.assets:
            for p in step.partitions:
                ap = (key, p)
                missing = parent_partitions(graph, ap) - set(seen)
                # a parent in the same run counts as before: an unpartitioned chain, an identity
                # mapping, or (single-run range) any partition of the range
                missing -= {(k, q) for k in step.assets for q in step.partitions}
                assert not missing, f"{step.label}: runs before {missing}"
                seen.append(ap)
    assert sorted(seen, key=str) == sorted(asset_partitions(graph), key=str)  # each exactly once
    labels = [s.label for s in steps]
    # every persona's candidates before any judging: with the personas' single-run backfill
    # policy, candidates, judgments and pairs are ONE run over every persona, in that order
    judging = [s for s in steps if K("persona_judgments") in s.assets]
    assert len(judging) == 1, labels
    assert judging[0].assets == (K("candidate_responses"), K("persona_judgments"),
                                 K("persona_preference_pairs")), labels
    assert judging[0].partition_keys == tuple(TRAINED_PERSONAS), labels
    assert not any(K("candidate_responses") in s.assets for s in steps if s is not judging[0])
    personas = f"[{TRAINED_PERSONAS[0]}..{TRAINED_PERSONAS[-1]}]"
    assert f"persona_adapters {personas}" in labels
    # every eval method is one run (eval_dialogues has a single-run backfill policy), as the
    # daemon backfills it
    evals = [s for s in steps if s.assets == (K("eval_dialogues"),)]
    methods = tuple(method_partitions.get_partition_keys())
    assert [s.partition_keys for s in evals] == [methods], labels
    assert f"eval_dialogues [{methods[0]}..{methods[-1]}]" in labels
    assert steps[0].partition is None and K("contexts") in steps[0].assets
    assert len(steps) == 7, labels  # was 17 with a run per persona partition


def test_per_persona_assets_backfill_in_one_run(graph):
    """Every persona-partitioned asset has the single-run backfill policy, so the daemon's
    "Materialize all" and the in-process walk give one run per asset group, not per persona."""
    from mascot_dag.assets.common import persona_partitions

    per_persona = [k for k in graph.toposorted_asset_keys
                   if graph.get(k).partitions_def == persona_partitions]
    assert {k.to_user_string() for k in per_persona} == {
        "candidate_responses", "persona_judgments", "persona_preference_pairs",
        "persona_adapters"}
    for key in per_persona:
        policy = graph.get(key).backfill_policy
        assert policy is not None and policy.max_partitions_per_run is None, key


def _walk_with_failure(graph, failing: str):
    """Walk everything; every run holding asset `failing` fails it, and (as Dagster skips the
    steps below a failed one) whatever in that run reads it."""
    walk, ran = LineageWalk(graph, set(asset_partitions(graph))), []
    while (step := walk.next_step()) is not None:
        ran.append(step)
        bad = {K(failing)}
        for key in step.assets:  # topological order
            if graph.get(key).parent_keys & bad:
                bad.add(key)
        walk.record(step, [k for k in step.assets if k not in bad])
    return walk, ran


def test_failed_partition_skips_only_what_reads_it(graph):
    """Two adapters to redo with a gap between them are two runs: one fails, the other still
    runs, and what reads the failed one (the roster probe) is skipped."""
    anchor, catalyst, beacon = TRAINED_PERSONAS[:3]
    todo = {(K("persona_adapters"), anchor), (K("persona_adapters"), beacon),
            (K("persona_roster_probe"), None)}
    walk = LineageWalk(graph, todo)
    ran = []
    while (step := walk.next_step()) is not None:
        ran.append(step)
        walk.record(step, [k for k in step.assets if step.partition != anchor])
    assert [s.partitions for s in ran] == [(anchor,), (beacon,)]  # the sibling still ran
    assert walk.failed == {(K("persona_adapters"), anchor)}
    assert walk.done == {(K("persona_adapters"), beacon)}
    assert walk.skipped == {(K("persona_roster_probe"), None)}
    assert (K("persona_adapters"), catalyst) not in walk.todo | walk.done


def test_failed_adapters_run_skips_everything_below(graph):
    walk, ran = _walk_with_failure(graph, "persona_adapters")
    adapters = [s for s in ran if K("persona_adapters") in s.assets]
    assert [s.partition_keys for s in adapters] == [tuple(TRAINED_PERSONAS)]  # one run
    assert walk.failed == {(K("persona_adapters"), p) for p in TRAINED_PERSONAS}
    skipped = {k.to_user_string() for k, _ in walk.skipped}
    assert {"group_rollouts", "director_adapter", "eval_dialogues", "eval_report"} <= skipped
    assert not any(K("eval_report") in s.assets for s in ran)


def test_failed_candidates_block_all_judging(graph):
    # persona_judgments reads every persona's candidates (AllPartitionMapping): in the one
    # Stage 1 data run, failed candidates leave no persona judged, and nothing below runs
    walk, ran = _walk_with_failure(graph, "candidate_responses")
    stage1 = [s for s in ran if K("candidate_responses") in s.assets]
    assert [s.partition_keys for s in stage1] == [tuple(TRAINED_PERSONAS)]
    judged = {p for k, p in walk.done if k == K("persona_judgments")}
    assert not judged, judged
    assert {p for k, p in walk.skipped if k == K("persona_adapters")} == set(TRAINED_PERSONAS)
    assert not any(K("persona_reward_model") in s.assets for s in ran)


def test_missing_only_walk_treats_the_rest_as_present(graph):
    todo = {(K("eval_report"), None)}
    walk = LineageWalk(graph, todo)
    step = walk.next_step()
    assert step is not None and step.assets == (K("eval_report"),)


def test_duckdb_writers_share_a_pool_and_retry(graph):
    from mascot_dag.definitions import defs

    for name in ("contexts", "candidate_responses", "persona_judgments", "eval_dialogues",
                 "eval_scores", "group_rollouts", "persona_adapters"):
        # persona_adapters trains for minutes before one write: out of the pool, so the
        # personas train side by side on a cluster (docs/DESIGN.md "Past one machine")
        pools = set() if name == "persona_adapters" else {DUCKDB_POOL}
        assert graph.get(K(name)).pools == pools, name
        node = defs.resolve_assets_def(K(name)).node_def
        assert node.retry_policy is not None and node.retry_policy.max_retries >= 1, name


def test_prepare_home_writes_instance_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("MASCOT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home" / "dagster"))
    prepare_home()
    with dg.DagsterInstance.get() as instance:
        cfg = instance.get_concurrency_config()
        assert cfg.pool_config.default_pool_limit == 1
        assert cfg.run_queue_config.max_concurrent_runs == 1
        assert instance.run_coordinator.dequeue_interval_seconds == 1


def test_prepare_home_updates_only_our_earlier_default(tmp_path):
    from mascot_dag.pipeline import _OLD_YAMLS, DAGSTER_YAML, write_dagster_yaml

    for old in _OLD_YAMLS:
        (tmp_path / "dagster.yaml").write_text(old, encoding="utf-8")
        write_dagster_yaml(tmp_path)
        assert (tmp_path / "dagster.yaml").read_text(encoding="utf-8") == DAGSTER_YAML
    mine = "telemetry:\n  enabled: true\n"
    (tmp_path / "dagster.yaml").write_text(mine, encoding="utf-8")
    write_dagster_yaml(tmp_path)
    assert (tmp_path / "dagster.yaml").read_text(encoding="utf-8") == mine


def test_single_run_asset_takes_only_the_contiguous_ready_range(graph):
    """A missing-only walk over some eval methods: contiguous ones share a run, a gap splits."""
    methods = list(method_partitions.get_partition_keys())
    todo = {(K("eval_dialogues"), m) for m in methods[:3] + methods[4:6]}
    walk, steps = LineageWalk(graph, todo), []
    while (step := walk.next_step()) is not None:
        steps.append(step)
        walk.record(step, step.assets)
    assert [s.partitions for s in steps] == [tuple(methods[:3]), tuple(methods[4:6])]
    assert walk.done == todo
    one = LineageWalk(graph, {(K("eval_dialogues"), methods[3])}).next_step()
    assert one is not None and one.partition_keys == () and one.partitions == (methods[3],)


def test_demo_set_overrides_profile_settings_or_names_the_bad_assignment(tmp_path):
    from typer.testing import CliRunner

    from mascot_dag.cli import app
    from mascot_dag.profiles import override_settings, settings_for

    study = settings_for("study")
    s = override_settings(study, ["probe_blocking=false", "eval_contexts=8",
                                  'ood_domains=["academic"]', "prompt_style=few_shot"])
    assert (s.probe_blocking, s.eval_contexts, s.ood_domains, s.prompt_style) == (
        False, 8, ["academic"], "few_shot")
    assert s.grpo_steps == study.grpo_steps and study.probe_blocking  # the rest, and no mutation
    for bad, says in [("nope=1", "no setting 'nope'"), ("grpo_steps=many", "grpo_steps"),
                      ("eval_contexts", "expected KEY=VALUE")]:
        with pytest.raises(ValueError, match=says):
            override_settings(study, [bad])
    # the CLI refuses before any run starts: exit 2, the assignment named, no run recorded
    # every variable the command sets is listed, so CliRunner restores it afterwards
    env = {"MASCOT_HOME": str(tmp_path / "h"), "DAGSTER_HOME": str(tmp_path / "h" / "dagster"),
           "MASCOT_PROFILE": None, "MASCOT_SET": None, "MASCOT_SIZES": None,
           "MASCOT_EXECUTOR": None}
    out = CliRunner().invoke(app, ["demo", "--profile", "tiny", "--set", "grpo_stepz=3"], env=env)
    assert out.exit_code == 2 and "grpo_stepz" in out.output
    assert not list((tmp_path / "h" / "dagster").glob("history/runs/*"))


def test_sizes_take_every_size_and_keep_the_method():
    """`--sizes tiny` on the paper profile: every size is tiny's, also those tiny leaves at their
    default (the director comparison's contexts), the method stays the paper's, and the
    director's reward horizon never reaches past the smaller judged block."""
    from mascot_dag.profiles import SIZE_SETTINGS, settings_for, with_sizes

    paper, tiny = settings_for("paper"), settings_for("tiny")
    s = with_sizes(paper, "tiny")
    assert {k for k in SIZE_SETTINGS if getattr(s, k) != getattr(tiny, k)} == set()
    assert paper.director_compare_contexts != tiny.director_compare_contexts  # a real change
    assert (s.prompt_style, s.lora_r, s.temperature) == (
        paper.prompt_style, paper.lora_r, paper.temperature)
    assert s.director_reward_horizon == tiny.block_size < paper.director_reward_horizon
    assert s.use_cpu and not (s.reward_blocking or s.probe_blocking)
    unknown = SIZE_SETTINGS - set(type(paper).model_fields)
    assert not unknown, unknown


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_asset_run_without_a_retry(tmp_path, signum):
    """`kill PID` or Ctrl-C during a step: the step fails at once (its retry policy would
    otherwise restart it, as Dagster does with interrupts it catches), the run is recorded as
    FAILED (so --missing-only redoes it) and the interrupt reaches the caller."""
    import os
    import signal
    import threading
    import time

    from mascot_dag.pipeline import _in_worker, interruptible

    @dg.asset(retry_policy=dg.RetryPolicy(max_retries=2, delay=1))
    def slow() -> None:
        for _ in range(300):  # 30 s unless stopped
            time.sleep(0.1)

    job = dg.Definitions(assets=[slow]).resolve_implicit_global_asset_job_def()
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with dg.DagsterInstance.local_temp(str(tmp_path)) as instance:
            interruptible()
            threading.Timer(1.0, os.kill, (os.getpid(), getattr(signal, signum))).start()
            t0 = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                _in_worker(lambda: job.execute_in_process(instance=instance,
                                                          raise_on_error=False))
            stopped = time.monotonic() - t0
            run = instance.get_runs()[0]
            events = [e.dagster_event.event_type_value for e in instance.all_logs(run.run_id)
                      if e.dagster_event]
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    assert stopped < 15
    assert run.status == dg.DagsterRunStatus.FAILURE
    assert "STEP_FAILURE" in events and "STEP_UP_FOR_RETRY" not in events
    # a finished run comes back unchanged
    (tmp_path / "ok").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "ok")) as instance:
        quick = dg.Definitions(assets=[dg.asset(name="quick")(lambda: None)])
        result = _in_worker(lambda: quick.resolve_implicit_global_asset_job_def()
                            .execute_in_process(instance=instance))
        assert result.success


ORPHAN_SCRIPT = """
import sys, time
import dagster as dg

@dg.asset(pool="duckdb")
def holds_the_pool() -> None:
    print("started", flush=True)
    time.sleep(120)

job = dg.Definitions(assets=[holds_the_pool]).resolve_implicit_global_asset_job_def()
with dg.DagsterInstance.get() as instance:
    job.execute_in_process(instance=instance, tags={"mascot/lineage": "1"})
"""


def test_a_killed_demo_does_not_block_the_next_one(tmp_path, monkeypatch):
    """SIGKILL leaves the run "started" and holding its duckdb pool slot; the next walk marks it
    failed and frees the slot, so its own steps are not "blocked by limit" forever."""
    import os
    import signal
    import subprocess
    import sys

    from mascot_dag.pipeline import release_orphaned_runs, write_dagster_yaml

    home = tmp_path / "dagster"
    write_dagster_yaml(home)  # the pool limit of 1, as the demo writes it
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "DAGSTER_HOME": str(home)})
    try:
        assert proc.stdout.readline().strip() == "started"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    with dg.DagsterInstance.get() as instance:
        (orphan,) = instance.get_runs()
        assert orphan.status == dg.DagsterRunStatus.STARTED
        assert instance.event_log_storage.get_concurrency_info("duckdb").claimed_slots
        assert release_orphaned_runs(instance) == [orphan.run_id]
        assert instance.get_run_by_id(orphan.run_id).status == dg.DagsterRunStatus.FAILURE
        assert not instance.event_log_storage.get_concurrency_info("duckdb").claimed_slots
        assert release_orphaned_runs(instance) == []  # nothing else, and idempotent

        @dg.asset(pool="duckdb")
        def next_writer() -> int:
            return 1

        job = dg.Definitions(assets=[next_writer]).resolve_implicit_global_asset_job_def()
        assert job.execute_in_process(instance=instance).success


def test_a_failed_gate_says_why_on_the_console(tmp_path):
    """run_errors: a failed blocking check of severity ERROR is reported with its description
    (the gate's CI and n); a warning is not an error."""
    from mascot_dag.pipeline import run_errors

    def gated(severity):
        @dg.asset(name=f"gated_{severity.value.lower()}",
                  check_specs=[dg.AssetCheckSpec("gate", asset=f"gated_{severity.value.lower()}",
                                                 blocking=True)])
        def asset():
            return dg.MaterializeResult(check_results=[dg.AssetCheckResult(
                check_name="gate", passed=False, severity=severity,
                description="pooled gain +1.0 [-2.0, +4.0] on 32 contexts")])
        return asset

    with dg.DagsterInstance.ephemeral() as instance:
        for severity, expected in ((dg.AssetCheckSeverity.ERROR,
                                    ("check gate failed: pooled gain +1.0 [-2.0, +4.0] on 32 "
                                     "contexts",)),
                                   (dg.AssetCheckSeverity.WARN, ())):
            job = dg.Definitions(assets=[gated(severity)]).resolve_implicit_global_asset_job_def()
            result = job.execute_in_process(instance=instance, raise_on_error=False)
            assert run_errors(result) == expected


def test_cluster_walk_hands_out_each_partition_while_others_run(graph):
    """On a cluster the walk gives one run per partition (no single-run range) and hands out
    every ready one while others are still running, never one twice, never a child before its
    parent is recorded: the personas' adapters go to different workers at the same time."""
    from mascot_dag.pipeline import parse_selection

    todo = parse_selection(graph, ["persona_preference_pairs:anchor,beacon",
                                   "persona_reward_model", "persona_adapters:anchor,beacon"])
    walk = LineageWalk(graph, todo, per_partition=True)
    first, second = walk.next_step(), walk.next_step()
    assert {(s.assets, s.partition) for s in (first, second)} == {
        ((K("persona_preference_pairs"),), "anchor"), ((K("persona_preference_pairs"),), "beacon")}
    assert walk.next_step() is None  # the reward model waits for both, nothing handed out twice
    walk.record(first, first.assets)
    assert walk.next_step() is None
    walk.record(second, second.assets)
    rm = walk.next_step()
    assert rm.assets == (K("persona_reward_model"),) and walk.next_step() is None
    walk.record(rm, rm.assets)
    adapters = [walk.next_step(), walk.next_step()]
    assert sorted(s.partition for s in adapters) == ["anchor", "beacon"]
    assert all(s.partition_keys == () for s in adapters)  # not one range run
    assert walk.next_step() is None
    with pytest.raises(ValueError, match="no partition poet.*anchor"):
        parse_selection(graph, ["persona_adapters:poet"])
    with pytest.raises(ValueError, match="no asset 'persona_adaptors'"):
        parse_selection(graph, ["persona_adaptors"])


def test_missing_only_within_a_selection_ignores_parents_it_will_not_make():
    """`--missing-only --select pairs:a,b --select model --select adapters:a,b` after a run of
    that selection: nothing to redo, although pairs c and d (read by the model) were never made.
    The same walk without the selection still redoes them and everything below them."""
    from mascot_dag.pipeline import stale_or_missing

    parts = dg.StaticPartitionsDefinition(["a", "b", "c", "d"])

    @dg.asset(partitions_def=parts)
    def pairs():
        return 1

    @dg.asset(deps=[pairs])
    def model():
        return 1

    @dg.asset(partitions_def=parts, deps=[model])
    def adapters():
        return 1

    defs = dg.Definitions(assets=[pairs, model, adapters])
    graph = defs.resolve_asset_graph()
    selection = {(K("pairs"), "a"), (K("pairs"), "b"), (K("model"), None),
                 (K("adapters"), "a"), (K("adapters"), "b")}
    with dg.DagsterInstance.ephemeral() as instance:
        for p in ("a", "b"):
            assert dg.materialize([pairs], instance=instance, partition_key=p).success
        assert dg.materialize([pairs, model], instance=instance, selection=[model]).success
        for p in ("a", "b"):
            assert dg.materialize([model, adapters], instance=instance, partition_key=p,
                                  selection=[adapters]).success
        assert stale_or_missing(instance, graph, selection) == set()
        everything = stale_or_missing(instance, graph)
        assert everything == {(K("pairs"), "c"), (K("pairs"), "d"), (K("model"), None),
                              *((K("adapters"), p) for p in "abcd")}
        # pairs[a] made again: the model and the selected adapters are older than it now
        assert dg.materialize([pairs], instance=instance, partition_key="a").success
        assert stale_or_missing(instance, graph, selection) == {
            (K("model"), None), (K("adapters"), "a"), (K("adapters"), "b")}
