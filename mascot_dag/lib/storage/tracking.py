"""MLflow helpers: experiments, runs, curves, adapter artifacts and the model registry.

Pure Python (no dagster); `mlflow` is imported inside the functions (~2-3 s). Measured with MLflow
3.17 (shared/STACK.md): `mlflow.register_model("runs:/<id>/adapter")` fails for a plain artifact
folder (it is not an MLflow Model), so versions are created from the artifact URI with
`MlflowClient.create_model_version`; `models:/<name>/<version>` and `models:/<name>@<alias>` then
download with `mlflow.artifacts.download_artifacts`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_artifact_root: Path | None = None


def configure(tracking_uri: str, artifact_root: str | Path | None = None) -> None:
    """Point MLflow (tracking and registry) at `tracking_uri`; new experiments store artifacts
    under `artifact_root` (with a sqlite store MLflow would otherwise use ./mlruns in the cwd)."""
    import mlflow

    global _artifact_root
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    _artifact_root = Path(artifact_root).resolve() if artifact_root else None


def _client() -> Any:
    from mlflow import MlflowClient

    return MlflowClient()


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EVALUATION_EXPERIMENTS = ("evaluation",)  # every other experiment of the lineage trains


def experiment(name: str) -> str:
    """The id of experiment `name`, created (artifacts under artifact_root/name) when new."""
    return _experiment_id(name)


def _experiment_id(name: str) -> str:
    client = _client()
    found = client.get_experiment_by_name(name)
    kind = "custom_model_development" if name in EVALUATION_EXPERIMENTS else "finetuning"
    if found is not None:
        if EXPERIMENT_KIND_TAG not in found.tags:  # created by an older version
            client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, kind)
        return found.experiment_id
    location = None
    if _artifact_root is not None:
        path = _artifact_root / name
        path.mkdir(parents=True, exist_ok=True)
        location = path.as_uri()
    # MLflow 3's UI opens an experiment without this tag in its GenAI mode (traces and
    # evaluations); the tag makes it a training experiment: runs with their curves
    return client.create_experiment(name, artifact_location=location,
                                    tags={EXPERIMENT_KIND_TAG: kind})


RUN_NAME_SEPARATOR = " · "


def model_short_name(model: str) -> str:
    """A base model's short name: the last part of a hub id, a folder or `embedded:<name>`
    ("HuggingFaceTB/SmolLM2-135M-Instruct" -> "SmolLM2-135M-Instruct")."""
    return model.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]


def run_name(
    subject: str,
    method: str = "",
    *,
    lora_r: int | None = None,
    steps: int | None = None,
    extra: Sequence[str] = (),
    base: str = "",
) -> str:
    """The MLflow run name that says what trained, how, how much and from which base model:
    `subject · method LoRA r<r> · <steps> steps · extra... · <base's short name>`, parts that are
    not given left out; e.g. `run_name("anchor", "GRPO", lora_r=8, steps=20,
    base="HuggingFaceTB/SmolLM2-135M-Instruct")` is "anchor · GRPO LoRA r8 · 20 steps ·
    SmolLM2-135M-Instruct". A name is for people reading the MLflow UI; code finds runs by their
    tags (`asset`, `persona`), never by name."""
    how = " ".join(p for p in (method, f"LoRA r{lora_r}" if lora_r is not None else "") if p)
    amount = f"{steps} step{'' if steps == 1 else 's'}" if steps is not None else ""
    parts = (subject, how, amount, *extra, model_short_name(base) if base else "")
    return RUN_NAME_SEPARATOR.join(p for p in parts if p)


def training_note(steps: int) -> str:
    """The run description (MLflow's "Description") of a training run of `steps` optimizer
    steps: below SMOKE_TEST_STEPS it says that the run is a smoke test."""
    from mascot_dag.lib.training.common import SMOKE_TEST_STEPS

    if steps >= SMOKE_TEST_STEPS:
        return f"{steps} optimizer steps, one point per step in each curve."
    return (f"Smoke test: {steps} optimizer step{'' if steps == 1 else 's'} (fewer than "
            f"{SMOKE_TEST_STEPS}). The curves show that training runs, not that it learned: at "
            "this length they are noise around the start. Read curves of the study or paper "
            "profile's sizes.")


@contextmanager
def start_run(
    experiment: str,
    run_name: str | None = None,
    tags: Mapping[str, str] | None = None,
    nested: bool = False,
    description: str = "",
) -> Iterator[Any]:
    """`description` is the run's "Description" in the MLflow UI (the mlflow.note.content tag).
    `with start_run("persona_alignment", run_name("anchor", "GRPO", ...), {"persona": "anchor"})
    as run:`"""
    import mlflow

    exp_id = _experiment_id(experiment)
    tags = {**(tags or {}), **({"mlflow.note.content": description} if description else {})}
    with mlflow.start_run(
        experiment_id=exp_id, run_name=run_name, tags=tags, nested=nested
    ) as run:
        yield run


def _param_value(value: Any) -> str:
    if isinstance(value, str | int | float | bool) or value is None:
        text = str(value)
    else:
        text = json.dumps(value, default=str, sort_keys=True)
    return text[:6000]  # MLflow's limit on a param value


def log_params(params: Mapping[str, Any]) -> None:
    """Log params of the active run; dataclasses/dicts/tuples are JSON-encoded."""
    import mlflow

    mlflow.log_params({k: _param_value(v) for k, v in params.items()})


def log_metrics(metrics: Mapping[str, float]) -> None:
    """Log single-valued metrics of the active run."""
    import mlflow

    mlflow.log_metrics(dict(metrics))


def set_tags(tags: Mapping[str, str]) -> None:
    """Set tags of the active run."""
    import mlflow

    mlflow.set_tags(dict(tags))


def log_artifacts(folder: str | Path, artifact_path: str) -> None:
    """Upload every file under `folder` to the active run's `artifact_path`."""
    import mlflow

    mlflow.log_artifacts(str(folder), artifact_path=artifact_path)


def log_curve(name: str, points: Sequence[tuple[int, float]], run_id: str | None = None) -> int:
    """Log a metric curve [(step, value), ...] in one batch; returns the number of points logged."""
    from mlflow.entities import Metric

    run_id = run_id or _active_run_id()
    now = int(time.time() * 1000)
    metrics = [
        Metric(key=name, value=float(v), timestamp=now, step=int(s))
        for s, v in points
        if v is not None and v == v  # NaN never equals itself
    ]
    # log_batch accepts at most 1000 metrics per call.
    for start in range(0, len(metrics), 1000):
        _client().log_batch(run_id, metrics=metrics[start : start + 1000])
    return len(metrics)


def _active_run_id() -> str:
    import mlflow

    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("no active MLflow run: call inside `with start_run(...)` or pass run_id")
    return run.info.run_id


def log_adapter(adapter_dir: str | Path, artifact_path: str = "adapter") -> str:
    """Upload an adapter folder to the active run; returns its artifact URI."""
    import mlflow

    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").exists():
        raise FileNotFoundError(
            f"{adapter_dir} is not a PEFT adapter folder (no adapter_config.json)"
        )
    mlflow.log_artifacts(str(adapter_dir), artifact_path=artifact_path)
    return f"{mlflow.active_run().info.artifact_uri}/{artifact_path}"


def register_version(
    model_name: str,
    run: Any,
    artifact_path: str = "adapter",
    tags: Mapping[str, str] | None = None,
    description: str | None = None,
) -> str:
    """Register run's `artifact_path` folder as a new version of `model_name`; returns the version.

    `run` is an `mlflow.entities.Run` or a run id.
    """
    from mlflow.exceptions import MlflowException

    client = _client()
    if isinstance(run, str):
        run = client.get_run(run)
    try:
        client.get_registered_model(model_name)
    except MlflowException:
        client.create_registered_model(model_name)
    mv = client.create_model_version(
        name=model_name,
        source=f"{run.info.artifact_uri}/{artifact_path}",
        run_id=run.info.run_id,
        tags=dict(tags or {}),
        description=description,
    )
    return str(mv.version)


def set_alias(model_name: str, alias: str, version: str | int) -> None:
    """Point `alias` (e.g. "champion") of `model_name` at `version`."""
    _client().set_registered_model_alias(model_name, alias, str(version))


def get_alias_version(model_name: str, alias: str) -> str | None:
    """The version that `alias` points to, or None when the model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        return str(_client().get_model_version_by_alias(model_name, alias).version)
    except MlflowException:
        return None


def latest_version(model_name: str) -> str | None:
    """The highest registered version of `model_name`, or None when it has none."""
    versions = _client().search_model_versions(f"name = '{model_name}'")
    return str(max(int(v.version) for v in versions)) if versions else None


def set_version_tag(model_name: str, version: str | int, key: str, value: str) -> None:
    """Tag one registered version (e.g. its evaluation score beside the `champion` alias)."""
    _client().set_model_version_tag(model_name, str(version), key, value)


def version_run_params(model_name: str, version: str | int) -> dict[str, str]:
    """The params of the run that produced a registered version ({} when it has no run)."""
    client = _client()
    run_id = client.get_model_version(model_name, str(version)).run_id
    return dict(client.get_run(run_id).data.params) if run_id else {}


def version_run_id(model_name: str, version: str | int) -> str:
    """The id of the run that produced a registered version ("" when it has none). Unlike the
    version number, it never repeats: a registry reset starts numbering at 1 again."""
    return _client().get_model_version(model_name, str(version)).run_id or ""


def run_metrics(run_id: str) -> dict[str, float]:
    """The latest value of every metric of a run."""
    return dict(_client().get_run(run_id).data.metrics)


def metric_history(run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of a metric of a run, by step ([] when it was never logged)."""
    return sorted((m.step, m.value) for m in _client().get_metric_history(run_id, key))


def download_adapter(model_uri: str, dst: str | Path) -> Path:
    """Download `models:/name/3`, `models:/name@champion` or `runs:/id/adapter` into dst; returns
    the local adapter folder (the one holding adapter_config.json)."""
    import mlflow

    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(dst)))
    if not (local / "adapter_config.json").exists():
        nested = sorted(local.rglob("adapter_config.json"))
        if not nested:
            raise FileNotFoundError(
                f"{model_uri} downloaded to {local} holds no adapter_config.json"
            )
        local = nested[0].parent
    return local


def fail_orphaned_runs(tag: str, value: str, reason: str) -> list[str]:
    """Mark FAILED every RUNNING run tagged `tag` = `value` and say why in the tag
    `mascot.orphaned`; returns their run ids. A worker killed mid-step (SIGKILL, out of memory, a
    node lost) never ends its MLflow run, which would stay RUNNING for ever; the orchestrator calls
    this once the Dagster run that owned it has ended, when nothing can still be writing to it."""
    client = _client()
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return []
    runs = client.search_runs(
        experiments, filter_string=f"tags.`{tag}` = '{value}' AND attributes.status = 'RUNNING'")
    for run in runs:
        client.set_tag(run.info.run_id, "mascot.orphaned", reason)
        client.set_terminated(run.info.run_id, status="FAILED")
    return [r.info.run_id for r in runs]
