"""Where everything lives: one home folder, MASCOT_HOME (default ./.mascot)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Home:
    root: Path

    @classmethod
    def from_env(cls, root: str | os.PathLike | None = None) -> Home:
        return cls(Path(root or os.environ.get("MASCOT_HOME", ".mascot")).resolve())

    @property
    def duckdb(self) -> Path:
        return self.root / "mascot.duckdb"

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def mlflow_uri(self) -> str:
        return f"sqlite:///{self.mlflow_db}"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlartifacts"

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster"

    @property
    def models(self) -> Path:
        # Converted base models are large (~0.5 GB) and identical for every home: MASCOT_MODELS_DIR
        # lets tests and several homes share one copy.
        return Path(os.environ.get("MASCOT_MODELS_DIR") or self.root / "models").resolve()

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    def ensure(self) -> Home:
        for p in (self.root, self.dagster_home, self.checkpoints, self.reports, self.inbox):
            p.mkdir(parents=True, exist_ok=True)
        return self
