"""A cluster on one machine, on 127.0.0.1: a Ray head, `mlflow server`, vLLM's OpenAI server.

What tests/test_ray_cluster.py and scripts/bench_cluster.py start, and what README "Scaling
out" starts by hand. Each server runs in a process group of its own (`start_new_session`), and is
stopped by that group's id (SIGTERM, then SIGKILL), never by name: `ray stop` kills every Ray
process of the machine, including other users'. `ray start --head --block` keeps the head in the
foreground, so the pid we hold is the head's; without `--block` it daemonizes and the pid is
gone at once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    """A free TCP port on the loopback interface (servers here bind 127.0.0.1 only)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_with_bin(extra: dict | None = None) -> dict:
    """This environment with the virtualenv's bin first on PATH (Ray's job supervisor runs the
    step's `dagster api execute_step` from PATH; exit code 127 without it)."""
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            **(extra or {})}


def start(cmd: list, log: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
                                env=env_with_bin(env), start_new_session=True)


def stop_group(proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """SIGTERM the process group `proc` leads, SIGKILL it after `timeout_s`."""
    try:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, what: str,
                 log: Path | Callable[[], str]) -> None:
    """Poll `url` until it answers 200; a RuntimeError naming `what` and the tail of its output
    (a log file, or a callable returning the output so far) when the process exits or
    `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            if callable(log):
                where, tail = "", log()
            else:
                where = f", log {log}"
                tail = log.read_text(errors="replace") if log.exists() else ""
            raise RuntimeError(f"{what} did not answer {url} (exit code {proc.poll()}{where}):\n"
                               f"{tail[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)


@contextlib.contextmanager
def ray_head(log_dir: Path, num_cpus: int = 2, num_gpus: int = 2,
             timeout_s: float = 180) -> Iterator[str]:
    """A Ray head with a dashboard (the jobs API) on free ports; `num_gpus` logical GPUs, so
    GPU-tagged steps schedule on a machine without one. Yields the jobs API address."""
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    dash = free_port()
    ports = {"--port": free_port(), "--dashboard-port": dash,
             "--ray-client-server-port": free_port(), "--node-manager-port": free_port(),
             "--object-manager-port": free_port(), "--metrics-export-port": free_port(),
             "--dashboard-agent-listen-port": free_port(),
             "--dashboard-agent-grpc-port": free_port(), "--runtime-env-agent-port": free_port()}
    cmd = [BIN / "ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1",
           f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}", "--include-dashboard=true",
           "--dashboard-host=127.0.0.1", "--disable-usage-stats", f"--temp-dir={temp}",
           *(f"{k}={v}" for k, v in ports.items())]
    log = log_dir / "ray_head.log"
    # On SIGTERM a head drains for up to 30 s (for Ray Serve replicas); its jobs are stopped
    # below and nothing else runs on this one-machine head, so the wait was 30 s of nothing in
    # every test teardown (measured).
    # Ray's memory monitor kills a task when the MACHINE's memory passes 95%, whoever uses it:
    # on a one-machine head shared with other work (the test suite's other worker, a vLLM
    # server) it killed a reward-model step that held ~2 GiB (measured: the suite on 3 workers).
    # Off here; the kernel's OOM killer still guards the machine.
    proc = start(cmd, log, {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
                            "RAY_memory_monitor_refresh_ms": "0"})
    address = f"http://127.0.0.1:{dash}"
    try:
        wait_healthy(f"{address}/api/jobs/", proc, timeout_s, "the Ray head", log)
        yield address
    finally:
        with contextlib.suppress(Exception):  # job entrypoints run in sessions of their own
            from ray.job_submission import JobStatus, JobSubmissionClient

            client = JobSubmissionClient(address)
            for job in client.list_jobs():
                if job.status in (JobStatus.PENDING, JobStatus.RUNNING):
                    client.stop_job(job.submission_id)
        stop_group(proc, timeout_s=30)
        shutil.rmtree(temp, ignore_errors=True)


@contextlib.contextmanager
def mlflow_server(root: Path, timeout_s: float = 120) -> Iterator[str]:
    """`mlflow server` on root/mlflow.db (sqlite) serving artifacts from root/artifacts."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [BIN / "mlflow", "server", "--host", "127.0.0.1", "--port", port, "--workers", "1",
           "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
           "--artifacts-destination", root / "artifacts"]
    log = root / "server.log"
    proc = start(cmd, log)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, timeout_s, "mlflow server", log)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_group(proc)


@contextlib.contextmanager
def vllm_server(model_path: str, served_name: str, log_dir: Path,
                max_model_len: int = 2048) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    """vLLM's OpenAI server on `model_path` (answering to `served_name`) with runtime LoRA
    loading; yields (url, process, log) at once: wait for `url`/health with `wait_healthy` (a
    start takes ~40 s on CPU, overlapped with the other servers')."""
    from mascot_dag.lib.llm.vllm_backend import server_command
    from mascot_dag.lib.llm.vllm_server import server_env

    port = free_port()
    cmd = server_command(model_path, port=port, served_model_name=served_name,
                         max_model_len=max_model_len)
    log = log_dir / "vllm_server.log"
    proc = start(cmd, log, server_env())
    try:
        yield f"http://127.0.0.1:{port}", proc, log
    finally:
        stop_group(proc)
