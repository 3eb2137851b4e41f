"""Whole-lineage runs, derived from the asset graph: `make demo` and the tests' in-process path.

The asset graph is the only list of what runs and in which order. The UI's "Materialize all", the
weekly schedule and the inbox sensor submit an *asset backfill* over every partition (Dagster's
daemon launches one run per partition group once its upstreams are materialised). `make demo`
walks the same graph in the same order without a daemon (`LineageWalk`), one asset run of
`__ASSET_JOB` per group, in this process, so the models loaded by the resources are loaded once
(docs/DESIGN.md, "Whole-lineage runs"). Grouping follows the asset backfill's rule: an asset runs
together with a parent when both are unpartitioned, or share a partitions definition with an
identity mapping, or (single-run backfill policy on both) the parent's whole range is in the run;
everything else waits until every partition it maps to has succeeded. A failed run fails the
asset partitions it held and skips what depends on them, nothing else.

On a cluster (an executor other than in_process, e.g. the cluster profile's Ray executor) the same
walk launches the runs on the code location instead, one per partition and several at once
(`_run_launched`; docs/DESIGN.md "Past one machine").
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import dagster as dg
from dagster._core.storage.tags import (  # the tags the daemon puts on a range run
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)

from mascot_dag.lib.storage.home import Home

AP = tuple[dg.AssetKey, str | None]  # an asset partition; None for an unpartitioned asset

DAGSTER_YAML = """\
# Written by `mascot init` / `mascot demo` (mascot_dag/pipeline.py prepare_home).
concurrency:
  runs:
    # Every run loads its own models: on a 2-core machine two runs at once only compete.
    # Raise it (with MASCOT_EXECUTOR=multiprocess) on bigger machines.
    max_concurrent_runs: 1
  pools:
    # pool "duckdb": assets that write mascot.duckdb, one step at a time across all runs.
    default_limit: 1
    granularity: op
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config:
    # The daemon looks at the run queue every second instead of every 5 s: an asset backfill
    # queues a run per partition group, each one waited up to 5 s (a query on the local sqlite).
    dequeue_interval_seconds: 1
telemetry:
  enabled: false
"""
# Our earlier defaults, which write_dagster_yaml replaces (any other file is the user's).
_OLD_YAMLS = (
    "concurrency:\n  runs:\n    max_concurrent_runs: 1\ntelemetry:\n  enabled: false\n",
    DAGSTER_YAML.split("run_coordinator:")[0] + "telemetry:\n  enabled: false\n",
)


def prepare_home(home: Home | None = None) -> Home:
    """Create MASCOT_HOME and DAGSTER_HOME with a dagster.yaml (one run at a time, DuckDB pool,
    the run queue checked every second)."""
    home = (home or Home.from_env()).ensure()
    os.environ.setdefault("DAGSTER_HOME", str(home.dagster_home))
    write_dagster_yaml(os.environ["DAGSTER_HOME"])
    return home


def interruptible() -> None:
    """Make SIGINT and SIGTERM stop the walk (call once, in the main thread, before it starts).

    Dagster maps SIGTERM onto whatever handles SIGINT while a run executes. A process that a
    non-interactive shell starts in the background inherits SIGINT *ignored*, so `mascot demo &`
    (nohup, a CI step, a supervisor script) could not be stopped with `kill PID`: it ran on
    (measured). Both signals now raise KeyboardInterrupt in the main thread, where `_in_worker`
    waits on the asset run and stops it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # `kill -USR1 PID` prints every thread's stack to stderr: how a walk that stopped moving
    # (runs launched at once on Ray) is seen without a debugger
    import faulthandler

    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (AttributeError, OSError, RuntimeError, ValueError):  # stderr without a file
        pass  # (a test runner's captured stream): no dump, the walk runs as before


def write_dagster_yaml(dagster_home: str | os.PathLike) -> None:
    """The instance settings; a file a user wrote is kept (only our earlier default is updated)."""
    os.makedirs(dagster_home, exist_ok=True)
    cfg = os.path.join(dagster_home, "dagster.yaml")
    if os.path.exists(cfg):
        with open(cfg, encoding="utf-8") as f:
            if f.read() not in _OLD_YAMLS:
                return
    with open(cfg, "w", encoding="utf-8") as f:
        f.write(DAGSTER_YAML)


# ---------------------------------------------------------------------------------------------
# The order: which asset partitions may run next, from the graph alone.


@dataclass(frozen=True)
class Step:
    """One run: these assets (and their checks) for one partition key (None: unpartitioned), or,
    for an asset with a single-run backfill policy, for the range `partition_keys` (first to
    last, in the partitions definition's order; `partition` is then the first)."""

    assets: tuple[dg.AssetKey, ...]
    partition: str | None
    partition_keys: tuple[str, ...] = ()

    @property
    def partitions(self) -> tuple[str | None, ...]:
        return self.partition_keys or (self.partition,)

    @property
    def label(self) -> str:
        names = ", ".join(k.to_user_string() for k in self.assets)
        if self.partition_keys:
            return f"{names} [{self.partition_keys[0]}..{self.partition_keys[-1]}]"
        return f"{names} [{self.partition}]" if self.partition else names


def _keys(graph, key: dg.AssetKey) -> list[str | None]:
    pdef = graph.get(key).partitions_def
    return list(pdef.get_partition_keys()) if pdef else [None]


def asset_partitions(graph, keys: Iterable[dg.AssetKey] | None = None) -> list[AP]:
    keys = graph.toposorted_asset_keys if keys is None else keys
    return [(k, p) for k in keys for p in _keys(graph, k)]


def parent_partitions(graph, ap: AP) -> set[AP]:
    """The parent asset partitions that `ap` reads, through the graph's partition mappings."""
    key, partition = ap
    node = graph.get(key)
    out: set[AP] = set()
    for parent in node.parent_keys:
        pdef = graph.get(parent).partitions_def
        if pdef is None:
            out.add((parent, None))
        elif partition is None:
            out.update((parent, p) for p in pdef.get_partition_keys())
        else:
            mapping = graph.get_partition_mapping(key, parent)
            subset = node.partitions_def.empty_subset().with_partition_keys([partition])
            upstream = mapping.get_upstream_mapped_partitions_result_for_partitions(
                subset, node.partitions_def, pdef).partitions_subset
            out.update((parent, p) for p in upstream.get_partition_keys())
    return out


def _single_run(graph, key: dg.AssetKey) -> bool:
    policy = graph.get(key).backfill_policy
    return policy is not None and policy.max_partitions_per_run is None  # = single_run()


def _runs_with_parent(graph, child: dg.AssetKey, parent: dg.AssetKey) -> bool:
    """May `child` run in its parent's run (the asset backfill's rule)?"""
    c, p = graph.get(child).partitions_def, graph.get(parent).partitions_def
    if c is None or p is None:
        return c is None and p is None
    return c == p and isinstance(graph.get_partition_mapping(child, parent),
                                 dg.IdentityPartitionMapping)


@dataclass
class LineageWalk:
    """Asset partitions to materialise, handed out as steps in dependency order.

    `next_step()` returns the first group (in topological order) whose parents have all
    succeeded; `record(step, succeeded)` marks the rest of the step failed and skips whatever
    depends on a failure. Parents outside `todo` count as present (a missing-only re-run)."""

    graph: object
    todo: set[AP]
    done: set[AP] = field(default_factory=set)
    failed: set[AP] = field(default_factory=set)
    skipped: set[AP] = field(default_factory=set)
    # One run per partition even where a single-run backfill policy would run the whole range
    # in one (the policy saves model loads in one process; on a cluster the partitions run side
    # by side on different workers instead).
    per_partition: bool = False
    # Handed out by next_step and not yet recorded: not handed out again, not done either.
    running: set[AP] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.todo = set(self.todo)
        self._order = {k: i for i, k in enumerate(self.graph.toposorted_asset_keys)}
        self._parents = {ap: parent_partitions(self.graph, ap) for ap in self.todo}

    def _ok(self, parent: AP) -> bool:
        return parent in self.done or (parent not in self.todo and parent not in self.failed
                                       and parent not in self.skipped)

    def next_step(self) -> Step | None:
        step = self._next_step()
        if step is not None:
            self.running.update((k, p) for k in step.assets for p in step.partitions)
        return step

    def _next_step(self) -> Step | None:
        self._skip_blocked()
        ready = {ap for ap in self.todo - self.running
                 if all(self._ok(p) for p in self._parents[ap])}
        if not ready:
            return None
        grew = True
        while grew:  # children that may run in the same run as a ready parent
            grew = False
            for ap in sorted(self.todo - ready - self.running, key=self._rank):
                if all(self._ok(p) or (p in ready and p[1] == ap[1]
                                       and _runs_with_parent(self.graph, ap[0], p[0]))
                       for p in self._parents[ap]):
                    ready.add(ap)
                    grew = True
        first = min(ready, key=self._rank)
        pdef = self.graph.get(first[0]).partitions_def
        if first[1] is not None and _single_run(self.graph, first[0]) and not self.per_partition:
            # as the daemon backfills it: the contiguous ready partitions from `first`, one run
            keys = _keys(self.graph, first[0])
            run = []
            for p in keys[keys.index(first[1]):]:
                if (first[0], p) not in ready:
                    break
                run.append(p)
            return Step(self._range_assets(first[0], run), first[1],
                        tuple(run) if len(run) > 1 else ())
        group = sorted((ap for ap in ready if ap[1] == first[1]
                        and self.graph.get(ap[0]).partitions_def == pdef), key=self._rank)
        # a chained child joins only with its parent present in this group
        keys = [k for k, _ in group]
        return Step(tuple(keys), first[1])

    def _range_assets(self, first: dg.AssetKey, run: list[str]) -> tuple[dg.AssetKey, ...]:
        """`first` and the descendants that the asset backfill puts in the same single run: the
        same partitions definition and backfill policy, exactly the run's partitions to do, and
        every parent partition done or in the run (with the policy, even a non-identity mapping
        such as persona_judgments' AllPartitionMapping to every persona's candidates)."""
        node = self.graph.get(first)
        assets, inside = [first], {(first, p) for p in run}
        for key in self.graph.toposorted_asset_keys[self._order[first] + 1:]:
            other = self.graph.get(key)
            if (other.partitions_def != node.partitions_def
                    or other.backfill_policy != node.backfill_policy
                    or {p for k, p in self.todo if k == key} != set(run)):
                continue
            if all(self._ok(parent) or parent in inside
                   for p in run for parent in self._parents[(key, p)]):
                assets.append(key)
                inside.update((key, p) for p in run)
        return tuple(assets)

    def record(self, step: Step, succeeded: Iterable[dg.AssetKey]) -> None:
        ok = set(succeeded)
        for key in step.assets:
            for p in step.partitions:
                ap = (key, p)
                self.todo.discard(ap)
                self.running.discard(ap)
                (self.done if key in ok else self.failed).add(ap)

    def _skip_blocked(self) -> None:
        bad = self.failed | self.skipped
        changed = True
        while changed:
            changed = False
            for ap in list(self.todo):
                if self._parents[ap] & bad:
                    self.todo.discard(ap)
                    self.skipped.add(ap)
                    bad.add(ap)
                    changed = True

    def _rank(self, ap: AP) -> tuple:
        keys = _keys(self.graph, ap[0])
        return (self._order[ap[0]], keys.index(ap[1]))


def plan(graph) -> list[Step]:
    """The steps of a whole-lineage run when every step succeeds (what `make demo` will do)."""
    walk, steps = LineageWalk(graph, set(asset_partitions(graph))), []
    while (step := walk.next_step()) is not None:
        steps.append(step)
        walk.record(step, step.assets)
    return steps


# ---------------------------------------------------------------------------------------------
# What a re-run must redo: missing, failed or older than an upstream.


def stale_or_missing(instance: dg.DagsterInstance, graph, within: set[AP] | None = None) -> set[AP]:
    """Asset partitions whose latest materialisation is absent, came from a failed run (e.g. a
    blocking check failed after it), or is older than a parent's; plus all their descendants.

    With `within` (a `--select`ion) only those asset partitions are considered, and a parent
    outside it that was never materialised does not make a child stale: that parent will not be
    made by this walk, so redoing the child would only make it again from the same inputs (found
    2026-12-07: `--missing-only` on two personas retrained a reward model, and both adapters,
    because the other two personas' preference pairs did not exist)."""
    latest: dict[AP, tuple[int, str] | None] = {}
    for key in graph.toposorted_asset_keys:
        for p in _keys(graph, key):
            recs = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, asset_partitions=[p] if p else None),
                limit=1).records
            latest[(key, p)] = (recs[0].storage_id, recs[0].run_id) if recs else None
    run_ok: dict[str, bool] = {}
    considered = set(latest) if within is None else set(latest) & set(within)

    def older(parent: AP, rec: tuple[int, str]) -> bool:
        if latest[parent] is None:  # never made: stale, unless this walk will not make it
            return parent not in considered
        return latest[parent][0] < rec[0]

    def fresh(ap: AP) -> bool:
        rec = latest[ap]
        if rec is None:
            return False
        if rec[1] not in run_ok:
            run = instance.get_run_by_id(rec[1])
            run_ok[rec[1]] = run is not None and run.status == dg.DagsterRunStatus.SUCCESS
        return run_ok[rec[1]] and all(older(p, rec) for p in parent_partitions(graph, ap))

    redo = {ap for ap in considered if not fresh(ap)}
    for key in graph.toposorted_asset_keys:  # parents come first: one pass closes downward
        for p in _keys(graph, key):
            if (key, p) in considered and parent_partitions(graph, (key, p)) & redo:
                redo.add((key, p))
    return redo


# ---------------------------------------------------------------------------------------------
# Running the walk in this process.


@dataclass(frozen=True)
class StepResult:
    step: Step
    run_id: str
    success: bool
    seconds: float
    failed: tuple[str, ...]  # assets of the step that did not succeed
    errors: tuple[str, ...]  # step failures and failed blocking checks (console, tests)


# The console shows warnings and errors only; every event (DEBUG included) stays in the instance.
QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def lineage_definitions(resources: dict) -> dg.Definitions:
    from mascot_dag.lineage import all_assets, all_checks

    return dg.Definitions(assets=all_assets, asset_checks=all_checks, resources=resources,
                          executor=dg.in_process_executor)


def run_errors(result: dg.ExecuteInProcessResult) -> tuple[str, ...]:
    """Why a run stopped what follows it: its step failures, and its failed blocking checks
    with their descriptions (a gate says its CI and n, not just "FAILED")."""
    failures = tuple(e.step_failure_data.error.to_string()[-2000:] for e in result.all_events
                     if e.is_step_failure and e.step_failure_data.error
                     # the check's own description below says it better than this stack trace
                     and e.step_failure_data.error.cls_name != "DagsterAssetCheckFailedError")
    checks = tuple(f"check {ev.check_name} failed: {ev.description or 'no description'}"
                   for ev in result.get_asset_check_evaluations()
                   if ev.blocking and not ev.passed
                   and ev.severity == dg.AssetCheckSeverity.ERROR)
    return failures + checks


def _succeeded(result, step: Step, checks_by_op: dict[str, dg.AssetKey]) -> set[dg.AssetKey]:
    """Assets of the step that materialised and whose blocking checks did not fail."""
    made = {e.asset_key for e in result.get_asset_materialization_events()}
    # as Dagster blocks: a failed blocking check of severity ERROR (WARN only reports)
    bad = {ev.asset_key for ev in result.get_asset_check_evaluations()
           if ev.blocking and not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR}
    for e in result.all_events:
        if e.is_step_failure and e.step_key in checks_by_op:
            bad.add(checks_by_op[e.step_key])
    return {k for k in step.assets if k in made and k not in bad}


class StepInterrupted(dg.Failure):
    """Raised inside the running step when the walk is stopped (SIGINT/SIGTERM). A Failure that
    allows no retry: the assets' TRANSIENT_RETRY would otherwise restart the step, which is what
    Dagster does with an interrupt it catches itself (measured: `kill PID` became "retry in 5s")."""

    def __init__(self) -> None:
        super().__init__(description="stopped by SIGINT/SIGTERM (mascot demo was interrupted)",
                         allow_retries=False)


def _in_worker(fn: Callable[[], dg.ExecuteInProcessResult]) -> dg.ExecuteInProcessResult:
    """Run one asset run in a worker thread, so that SIGINT/SIGTERM reach the main thread (Dagster
    installs its handlers only on the main thread). On KeyboardInterrupt the step gets a
    StepInterrupted at its next Python bytecode, the run is recorded as failed (so `--missing-only`
    redoes it; DuckDB writes are transactions, so nothing is half-written) and the interrupt goes
    on to the caller."""
    box: dict = {}
    # an Event, not Thread.join: a join that KeyboardInterrupt broke leaves the thread looking
    # finished to the next join (CPython 3.11), and the run would stay "started" forever
    done = threading.Event()

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed to the main thread
            box["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=target, name="mascot-asset-run", daemon=True)
    worker.start()
    try:
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident),
                                                   ctypes.py_object(StepInterrupted))
        done.wait(120)  # a long native call (a backward pass) ends first
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


# A run that has not finished; after its process died it stays so forever (no daemon watches
# in-process runs) and keeps its slot of the "duckdb" pool, so every later demo waited on it.
UNFINISHED = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
              dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def release_orphaned_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark failed, and free the pool slots of, the unfinished runs of an earlier `mascot demo`
    whose process is gone (SIGKILL, out of memory, a power cut): found 2026-12-04, when a demo
    after a killed one waited "blocked by limit for pool duckdb" with nothing running. Only runs
    of the walk (tag `mascot/lineage`) whose recorded process id is not alive on this machine;
    runs launched by the daemon (UI, sensors) are the daemon's to monitor. Returns the run ids."""
    released = []
    for run in instance.get_runs(dg.RunsFilter(statuses=UNFINISHED)):
        if "mascot/lineage" not in run.tags:
            continue
        pids = {e.dagster_event.pid for e in instance.all_logs(run.run_id)
                if e.dagster_event is not None and e.dagster_event.pid}
        if not pids or any(p == os.getpid() or _pid_alive(p) for p in pids):
            continue
        instance.report_run_failed(run, f"process {sorted(pids)} is gone: released by the next "
                                        "`mascot demo` (pipeline.release_orphaned_runs)")
        if instance.event_log_storage.supports_global_concurrency_limits:
            instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        released.append(run.run_id)
    return released


def parse_selection(graph, specs: Iterable[str]) -> set[AP]:
    """Asset partitions named by `--select` specs: `ASSET` (every partition) or
    `ASSET:P1,P2` (those partitions). An unknown asset or partition is a ValueError naming the
    spec and what exists."""
    out: set[AP] = set()
    names = [k.to_user_string() for k in graph.toposorted_asset_keys]
    for spec in specs:
        name, _, parts = spec.partition(":")
        key = dg.AssetKey(name.strip())
        if name.strip() not in names:
            raise ValueError(f"--select {spec!r}: no asset {name.strip()!r}; the assets are "
                             f"{', '.join(names)}")
        keys = _keys(graph, key)
        if not parts:
            out.update((key, p) for p in keys)
            continue
        wanted = [p.strip() for p in parts.split(",") if p.strip()]
        if keys == [None]:
            raise ValueError(f"--select {spec!r}: {name} is not partitioned (select it by name)")
        bad = [p for p in wanted if p not in keys]
        if bad:
            raise ValueError(f"--select {spec!r}: {name} has no partition {', '.join(bad)}; it "
                             f"has {', '.join(keys)}")
        out.update((key, p) for p in wanted)
    return out


def _sweep_orphans(resources: dict, run_id: str) -> None:
    """Mark FAILED the MLflow runs that Dagster run `run_id` (now ended) left RUNNING: a worker
    killed mid-step cannot end its own (docs/DESIGN.md "Past one machine"). Never fails the walk:
    an unreachable tracking server here is reported by the next step that needs it."""
    tracking = resources.get("tracking")
    if tracking is None or not hasattr(tracking, "fail_orphaned_runs"):
        return
    try:
        tracking.fail_orphaned_runs(run_id, f"Dagster run {run_id} ended while this MLflow run "
                                            "was still RUNNING: its worker died mid-step")
    except Exception as exc:  # noqa: BLE001
        import logging

        logging.getLogger("mascot").warning("could not mark orphaned MLflow runs of %s: %s",
                                            run_id, exc)


def run_lineage(
    resources: dict,
    instance: dg.DagsterInstance | None = None,
    on_step: Callable[[StepResult], None] | None = None,
    missing_only: bool = False,
    tags: dict[str, str] | None = None,
    selection: set[AP] | None = None,
) -> list[StepResult]:
    """Materialise every asset partition (or only the missing/stale ones; or only those of
    `selection`), step by step, as runs of the implicit asset job recorded in `instance`
    (DAGSTER_HOME's by default).

    The executor is the code location's (profiles.executor_name: MASCOT_EXECUTOR, else `ray`
    for the cluster profile, else `in_process`). With `in_process` the runs execute here one
    after another (`make demo`); with any other they are launched on the code location
    `mascot_dag.definitions` with that executor (`ray`: each step a Ray job), one run per
    partition and up to MASCOT_MAX_CONCURRENT_RUNS (default 4) at once. `resources` then serve
    only this process's bookkeeping (the orphan sweep): the steps build theirs from the code
    location, i.e. from the same environment."""
    from mascot_dag.profiles import executor_name

    executor = executor_name()
    defs = lineage_definitions(resources)
    graph = defs.resolve_asset_graph()
    job = defs.resolve_implicit_global_asset_job_def()
    checks_by_op = {c.node_def.name: ck.asset_key
                    for c in defs.asset_checks or [] for ck in c.check_keys}
    owned = instance is None
    instance = instance or dg.DagsterInstance.get()
    try:
        release_orphaned_runs(instance)
        todo = (stale_or_missing(instance, graph, selection) if missing_only
                else set(asset_partitions(graph)))
        if selection is not None:
            todo &= set(selection)
        walk = LineageWalk(graph, todo, per_partition=executor != "in_process")
        lineage_tag = {"mascot/lineage": str(int(time.time())), **(tags or {})}
        if executor != "in_process":
            return _run_launched(walk, resources, instance, lineage_tag, checks_by_op, on_step)
        results: list[StepResult] = []
        while (step := walk.next_step()) is not None:
            t0 = time.monotonic()
            run_tags, key = dict(lineage_tag), step.partition
            if step.partition_keys:  # a single-run range, tagged as the daemon tags it
                run_tags.update({ASSET_PARTITION_RANGE_START_TAG: step.partition_keys[0],
                                 ASSET_PARTITION_RANGE_END_TAG: step.partition_keys[-1]})
                key = None
            result = _in_worker(functools.partial(
                job.execute_in_process, instance=instance, asset_selection=list(step.assets),
                partition_key=key, run_config=QUIET_RUN_CONFIG,
                tags=run_tags, raise_on_error=False))
            ok = _succeeded(result, step, checks_by_op)
            walk.record(step, ok)
            errors = run_errors(result)
            res = StepResult(step, result.run_id, result.success and len(ok) == len(step.assets),
                             time.monotonic() - t0,
                             tuple(k.to_user_string() for k in step.assets if k not in ok), errors)
            results.append(res)
            if on_step:
                on_step(res)
        return results
    finally:
        if owned:
            instance.dispose()


def _execute_launched(instance_ref, step: Step, tags: dict[str, str],
                      checks_by_op: dict[str, dg.AssetKey], reply) -> None:
    """One launched run, in a process of its own (`_run_launched` spawns it): the run of the code
    location's job for `step`, orchestrated here with its executor; sends (run id, success,
    succeeded assets, errors) back on `reply`."""
    import traceback

    from mascot_dag.cluster import code_location_job
    from mascot_dag.lib.runtime.quiet import quiet_libraries

    quiet_libraries()  # as `mascot demo` does, before the libraries are imported
    try:
        with dg.DagsterInstance.from_ref(instance_ref) as instance:
            with dg.execute_job(code_location_job(), instance=instance,
                                asset_selection=list(step.assets), run_config=QUIET_RUN_CONFIG,
                                tags=tags, raise_on_error=False) as result:
                reply.send((result.run_id, result.success,
                            _succeeded(result, step, checks_by_op), run_errors(result)))
    except BaseException:  # e.g. the code location does not load: said, not a bare exit code
        reply.send(("", False, set(), (f"{step.label}: {traceback.format_exc()[-2000:]}",)))
        raise


def _run_launched(walk: LineageWalk, resources: dict, instance: dg.DagsterInstance,
                  lineage_tag: dict[str, str], checks_by_op: dict[str, dg.AssetKey],
                  on_step: Callable[[StepResult], None] | None) -> list[StepResult]:
    """The walk with runs launched on the code location's executor, several at once: every
    step the walk hands out while fewer than MASCOT_MAX_CONCURRENT_RUNS runs are in flight
    starts at once (the `duckdb` pool still lets one writing step run at a time, across runs).

    Each run is orchestrated in a spawned process of its own, never in a thread of this one:
    Dagster reconfigures Python logging (`logging.config.dictConfig`, which takes logging's
    module lock and then every handler's) as each run starts, while another run's event handler
    holds its own lock and asks for the module lock: two runs started side by side in threads
    deadlocked there (found 2026-12-07 with a thread dump: the persona_adapters runs never
    submitted a Ray job). A process per run is also how Dagster's own run launcher runs them, and
    its orchestrator gets SIGINT in its main thread, where Dagster stops the run's steps."""
    import multiprocessing
    from multiprocessing.connection import wait

    from dagster._core.storage.tags import PARTITION_NAME_TAG

    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited locks
    limit = max(1, int(os.environ.get("MASCOT_MAX_CONCURRENT_RUNS", "4")))
    ref = instance.get_ref()
    results: list[StepResult] = []
    flying: dict = {}  # process sentinel -> (process, reply pipe, step, start)
    try:
        while True:
            while len(flying) < limit and (step := walk.next_step()) is not None:
                run_tags = dict(lineage_tag)
                if step.partition is not None:
                    run_tags[PARTITION_NAME_TAG] = step.partition
                receive, send = spawn.Pipe(duplex=False)
                proc = spawn.Process(target=_execute_launched, name=f"mascot-run {step.label}",
                                     args=(ref, step, run_tags, checks_by_op, send))
                proc.start()
                send.close()  # the child's end: EOF here once the child is gone
                flying[proc.sentinel] = (proc, receive, step, time.monotonic())
            if not flying:
                return results
            for sentinel in wait(list(flying)):
                proc, receive, step, t0 = flying.pop(sentinel)
                proc.join()
                try:
                    run_id, success, ok, errors = receive.recv()
                except EOFError:  # the orchestrating process died before it could answer
                    run_id, success, ok = "", False, set()
                    errors = (f"{step.label}: the process orchestrating its run exited with "
                              f"code {proc.exitcode} before the run ended",)
                receive.close()
                walk.record(step, ok)
                res = StepResult(step, run_id, success and len(ok) == len(step.assets),
                                 time.monotonic() - t0,
                                 tuple(k.to_user_string() for k in step.assets if k not in ok),
                                 errors)
                results.append(res)
                if run_id:
                    _sweep_orphans(resources, run_id)
                if on_step:
                    on_step(res)
    except KeyboardInterrupt:
        # a terminal's Ctrl-C reached the runs' processes too; `kill PID` reached only this one
        for proc, *_ in flying.values():
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGINT)
        for proc, *_ in flying.values():
            proc.join(120)  # Dagster stops the run's steps (Ray jobs) and records the run
        raise


def lineage_backfill(graph, tags: dict[str, str] | None = None) -> dg.RunRequest:
    """A run request that the sensor daemon turns into an asset backfill of every partition of
    every asset: the same thing as the UI's "Materialize all"."""
    from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset

    return dg.RunRequest.for_asset_graph_subset(AssetGraphSubset.all(graph), tags=tags or {})
