"""The MLflow resource: tracking runs, adapter artifacts and the model registry of the lineage.

Configuration only; the work happens in `mascot_dag.lib.storage.tracking`. Defaults put MLflow's
sqlite
store and artifact folder under MASCOT_HOME, so one home folder holds everything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from mascot_dag.lib.storage import tracking
from mascot_dag.lib.storage.home import Home

RUN_TAG = "mascot.dagster_run_id"
STEP_TAG = "mascot.step"
WORKER_TAG = "mascot.worker"


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

    # Tags on every run this resource starts: which Dagster run and step, and which worker
    # process (host:pid), so a run a killed worker left RUNNING is found and marked FAILED
    # (`fail_orphaned_runs`) and a failure names the worker.
    _run_tags: dict = PrivateAttr(default_factory=dict)

    @property
    def uri(self) -> str:
        return self.tracking_uri or Home.from_env().mlflow_uri

    @property
    def serves_artifacts(self) -> bool:
        """A tracking server (`mlflow server --serve-artifacts`): artifacts go through it, to
        wherever the server stores them, never to a folder of this worker."""
        return self.uri.startswith(("http://", "https://"))

    @property
    def artifacts(self) -> Path:
        return Path(self.artifact_root) if self.artifact_root else Home.from_env().mlflow_artifacts

    def configure(self) -> None:
        """Point MLflow here (idempotent; every method calls it, since runs may share a process)."""
        if self.uri.startswith("sqlite:///"):
            Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        tracking.configure(self.uri, None if self.serves_artifacts else self.artifacts)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        import os
        import socket

        self.configure()
        tags = {RUN_TAG: context.run_id or "", WORKER_TAG: f"{socket.gethostname()}:{os.getpid()}"}
        # dagster-ray's executor names the step in the Ray job's environment
        if step := os.environ.get("DAGSTER_RUN_STEP_KEY"):
            tags[STEP_TAG] = step
        self._run_tags = {k: v for k, v in tags.items() if v}

    def fail_orphaned_runs(self, dagster_run_id: str, reason: str) -> list[str]:
        """MLflow runs that the ended Dagster run `dagster_run_id` left RUNNING, marked FAILED."""
        self.configure()
        return tracking.fail_orphaned_runs(RUN_TAG, dagster_run_id, reason)

    def experiment(self, name: str) -> str:
        self.configure()
        return tracking.experiment(name)

    @staticmethod
    def run_name(subject: str, method: str = "", *, lora_r: int | None = None,
                 steps: int | None = None, extra: Sequence[str] = (), base: str = "") -> str:
        """What trained, how and how much, e.g. "anchor · GRPO LoRA r8 · 20 steps · SmolLM2-135M"
        (`lib.storage.tracking.run_name`); find runs by their tags, not by this name."""
        return tracking.run_name(subject, method, lora_r=lora_r, steps=steps, extra=extra,
                                 base=base)

    @staticmethod
    def training_note(steps: int) -> str:
        """A training run's description (`lib.storage.tracking.training_note`)."""
        return tracking.training_note(steps)

    @contextmanager
    def start_run(
        self,
        experiment: str,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        nested: bool = False,
        description: str = "",
    ) -> Iterator[Any]:
        self.configure()
        with tracking.start_run(experiment, run_name, {**self._run_tags, **(tags or {})},
                                nested=nested, description=description) as run:
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

    def log_curves(self, curves: dict[str, Sequence[tuple[int, float]]]) -> None:
        """Every non-empty curve of a training run, each as a metric history."""
        for name, points in curves.items():
            if points:
                self.log_curve(name, points)

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

    def version_run_id(self, model_name: str, version: str | int) -> str:
        self.configure()
        return tracking.version_run_id(model_name, version)

    def run_metrics(self, run_id: str) -> dict[str, float]:
        self.configure()
        return tracking.run_metrics(run_id)

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        self.configure()
        return tracking.metric_history(run_id, key)

    def download_adapter(self, model_uri: str, dst: str | Path) -> Path:
        self.configure()
        return tracking.download_adapter(model_uri, dst)
