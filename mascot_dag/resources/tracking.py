"""The MLflow resource: tracking runs, adapter artifacts and the model registry of the lineage.

Configuration only; the work happens in `mascot_dag.lib.tracking`. Defaults put MLflow's sqlite
store and artifact folder under MASCOT_HOME, so one home folder holds everything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from mascot_dag.lib import tracking
from mascot_dag.lib.home import Home


class MLflowResource(dg.ConfigurableResource):
    """Runs, curves, adapters and registered versions (alias `champion` marks the promoted one)."""

    tracking_uri: str = Field(
        default="",
        description="MLflow tracking/registry URI; empty means sqlite:///MASCOT_HOME/mlflow.db.",
    )
    artifact_root: str = Field(
        default="",
        description="Folder for new experiments' artifacts; empty means MASCOT_HOME/mlartifacts.",
    )

    @property
    def uri(self) -> str:
        return self.tracking_uri or Home.from_env().mlflow_uri

    @property
    def artifacts(self) -> Path:
        return Path(self.artifact_root) if self.artifact_root else Home.from_env().mlflow_artifacts

    def configure(self) -> None:
        """Point MLflow here (idempotent; every method calls it, since runs may share a process)."""
        if self.uri.startswith("sqlite:///"):
            Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        tracking.configure(self.uri, self.artifacts)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.configure()

    def experiment(self, name: str) -> str:
        self.configure()
        return tracking.experiment(name)

    @contextmanager
    def start_run(
        self,
        experiment: str,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        nested: bool = False,
    ) -> Iterator[Any]:
        self.configure()
        with tracking.start_run(experiment, run_name, tags, nested=nested) as run:
            yield run

    def log_params(self, params: Mapping[str, Any]) -> None:
        tracking.log_params(params)

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        tracking.log_metrics(metrics)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        tracking.set_tags(tags)

    def log_artifacts(self, folder: str | Path, artifact_path: str) -> None:
        tracking.log_artifacts(folder, artifact_path)

    def log_curve(
        self, name: str, points: Sequence[tuple[int, float]], run_id: str | None = None
    ) -> int:
        return tracking.log_curve(name, points, run_id)

    def log_adapter(self, adapter_dir: str | Path, artifact_path: str = "adapter") -> str:
        return tracking.log_adapter(adapter_dir, artifact_path)

    def register_version(
        self,
        model_name: str,
        run: Any,
        artifact_path: str = "adapter",
        tags: Mapping[str, str] | None = None,
    ) -> str:
        self.configure()
        return tracking.register_version(model_name, run, artifact_path, tags)

    def set_alias(self, model_name: str, alias: str, version: str | int) -> None:
        self.configure()
        tracking.set_alias(model_name, alias, version)

    def get_alias_version(self, model_name: str, alias: str) -> str | None:
        self.configure()
        return tracking.get_alias_version(model_name, alias)

    def latest_version(self, model_name: str) -> str | None:
        self.configure()
        return tracking.latest_version(model_name)

    def set_version_tag(self, model_name: str, version: str | int, key: str, value: str) -> None:
        self.configure()
        tracking.set_version_tag(model_name, version, key, value)

    def version_run_params(self, model_name: str, version: str | int) -> dict[str, str]:
        self.configure()
        return tracking.version_run_params(model_name, version)

    def download_adapter(self, model_uri: str, dst: str | Path) -> Path:
        self.configure()
        return tracking.download_adapter(model_uri, dst)
