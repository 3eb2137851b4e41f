"""The tiny lineage's wall time in-process vs on Ray, same machine, same profile (`cluster`).

Starts on 127.0.0.1 what tests/test_ray_cluster.py starts (lib/runtime/local_cluster.py: a Ray head
with
two logical GPUs, one `mlflow server` per run, vLLM's OpenAI server with runtime LoRA loading),
then runs `mascot demo --profile cluster --sizes tiny` twice on fresh homes: once with
`--executor in_process` (every run in the launching process, one after another) and once with the
profile's Ray executor (every step a Ray job, one run per partition, several runs at once). Prints
both walls and each run's line; nothing is asserted. Every server is stopped by its pid.

    .venv/bin/python scripts/bench_cluster.py [--sizes tiny] [--out DIR] [--only ray|in_process]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

from mascot_dag.lib.llm.models import EMBEDDED_MODEL, resolve_model
from mascot_dag.lib.runtime.local_cluster import (
    BIN,
    env_with_bin,
    mlflow_server,
    ray_head,
    stop_group,
    vllm_server,
    wait_healthy,
)


def demo(home: Path, env: dict, *args: str) -> tuple[int, float, str]:
    log = home.parent / f"demo-{home.name}.log"
    home.mkdir(parents=True, exist_ok=True)
    run_env = env_with_bin({**env, "MASCOT_HOME": str(home),
                            "DAGSTER_HOME": str(home / "dagster")})
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(BIN / "mascot"), "demo", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=run_env, start_new_session=True)
    try:
        code = proc.wait()
    finally:
        stop_group(proc)
    return code, time.monotonic() - t0, log.read_text(errors="replace")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="tiny")
    ap.add_argument("--out", default=None, help="folder for homes and logs (default: a temp)")
    ap.add_argument("--only", choices=["ray", "in_process"], default=None)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_cluster_"))
    out.mkdir(parents=True, exist_ok=True)
    models = os.environ.get("MASCOT_MODELS_DIR") or str(Path(".mascot/models").resolve())
    base = resolve_model(EMBEDDED_MODEL, models)
    env = {"MASCOT_PROFILE": "cluster", "MASCOT_SIZES": args.sizes, "MASCOT_MODELS_DIR": models,
           "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    walls = {}
    with contextlib.ExitStack() as stack:
        gen, gen_proc, gen_log = stack.enter_context(vllm_server(base, EMBEDDED_MODEL, out))
        ray = stack.enter_context(ray_head(out))
        wait_healthy(f"{gen}/health", gen_proc, 400, "vLLM's OpenAI server", gen_log)
        env.update(MASCOT_RAY_ADDRESS=ray, MASCOT_GENERATION_URL=f"{gen}/v1")
        for executor in ("in_process", "ray"):
            if args.only and executor != args.only:
                continue
            with mlflow_server(out / executor / "mlflow") as mlflow:
                code, wall, log = demo(out / executor / "home",
                                       {**env, "MASCOT_MLFLOW_URI": mlflow},
                                       "--executor", executor)
            walls[executor] = wall
            lines = [x for x in log.splitlines() if x.startswith("  ") and " s  " in x]
            print(f"\n{executor}: exit {code}, {wall:.0f} s wall ({out / executor})")
            print("\n".join(lines[-60:]))
    print("\n" + "  ".join(f"{k} {v:.0f} s" for k, v in walls.items()))


if __name__ == "__main__":
    main()
