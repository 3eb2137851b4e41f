"""Small helpers shared by the asset modules: metadata that is measured, never decorative.

They take polars frames.
"""

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
import polars as pl

from mascot_dag.lib.data.loading import DataFileError
from mascot_dag.lib.data.personas import (
    PersonaFileError,
    load_personas,
    personas_of_set,
    trained_sets,
)
from mascot_dag.lib.data.users import UserProfileError
from mascot_dag.lib.evaluation.champion import CHAMPION
from mascot_dag.lib.evaluation.methods import METHODS
from mascot_dag.lib.markdown import markdown_table


def trained_rosters(cards, settings) -> dict[str, list[str]]:
    """{persona set: its persona ids} of every set Stage 1 aligns under `settings`
    (`train_persona_sets`, else the one `train_persona_set`; lib.data.personas.trained_sets)."""
    return {s: [c.persona_id for c in personas_of_set(cards, s)]
            for s in trained_sets(cards, settings.train_persona_sets, settings.train_persona_set)}


def _profile_rosters(cards) -> dict[str, list[str]]:
    """`trained_rosters` under the profile of this process: MASCOT_PROFILE with MASCOT_SIZES and
    MASCOT_SET (profiles.settings_from_env), the environment a worker on another machine gets
    too (lib/runtime/cluster.WORKER_ENV), so it builds the same partitions."""
    from mascot_dag.profiles import profile_name, settings_for, settings_from_env

    return trained_rosters(cards, settings_from_env(settings_for(profile_name())))


# Stage 1 aligns the profile's trained persona sets (train_persona_sets: the study, paper and
# cluster profiles every set of the folder, embedded and tiny one set); their persona ids are
# the partitions of the per-persona assets. Read from the persona folder and the profile's
# settings when the code location loads (cheap YAML parsing), so the Dagster UI shows the
# user's personas, and the workplace personas under the study profile.
_CARDS = load_personas()
TRAINED_ROSTERS = _profile_rosters(_CARDS)
TRAINED_PERSONAS = [p for ids in TRAINED_ROSTERS.values() for p in ids]
persona_partitions = dg.StaticPartitionsDefinition(TRAINED_PERSONAS)
# The MLflow experiment of every Stage 1 model (pi_SFT, reward model, adapters, probe).
STAGE1_EXPERIMENT = "stage1_persona_alignment"
# A check declared blocking whose profile setting (reward_blocking, probe_blocking) is off reports
# at WARN, which Dagster does not block on: its description says so first.
WARN_ONLY = "warn-only in this profile (it would block with the setting on): "
# The evaluation runs one partition per method, plus the current champion's re-run.
method_partitions = dg.StaticPartitionsDefinition([*METHODS, CHAMPION])


def quiet_backfill_policy_beta() -> None:
    """`backfill_policy` is marked beta in Dagster 1.13 (it has been stable in use since 1.5):
    the warning would be the one line of noise in every console that loads the definitions.
    Called by each module that passes it, right before its decorators: a filter set when this
    module was first imported may be gone by then (pytest restores filters after collection)."""
    warnings.filterwarnings("ignore", message="Parameter `backfill_policy`")


# The per-persona assets' backfill policy: a backfill of several personas ("Materialize all",
# the sensors) is ONE run over the persona range, not a run per persona. Each run is a new
# process that imports torch and loads the models; per persona that was most of Stage 1's time
# on 2 cores (docs/DESIGN.md, "Whole-lineage runs"). The assets loop over
# `context.partition_keys` (one key when a single partition is materialised).
PERSONA_BACKFILL = dg.BackfillPolicy.single_run()


def persona_rows(personas) -> tuple[str, list[str]]:
    """The `where`/`params` of `store.replace` for the rows of these personas: a run replaces
    exactly the partitions it materialises."""
    keys = list(personas)
    return f"persona_id IN ({', '.join('?' * len(keys))})", keys


def preview(df, n: int = 5, width: int = 80) -> dg.MetadataValue:
    """A short markdown preview with long cells cut, so the UI stays readable."""
    return dg.MetadataValue.md(markdown_table(df.head(n), width))

def table_metadata(df, **extra) -> dict:
    schema = dg.TableSchema(
        columns=[dg.TableColumn(name=c, type=str(t)) for c, t in df.schema.items()]
    )
    return {
        "dagster/row_count": df.height,
        "dagster/column_schema": schema,
        "preview": preview(df),
        **extra,
    }

def rounded(value, digits: int = 4):
    """Floats to `digits` significant digits, inside dicts and lists too: metadata shows what is
    meaningful (0.7132), not float noise (0.71328125000000004); other values pass unchanged."""
    import math

    if isinstance(value, float) and math.isfinite(value) and value != 0:
        return round(value, max(0, digits - 1 - math.floor(math.log10(abs(value)))))
    if isinstance(value, dg.FloatMetadataValue) and value.value is not None:
        return dg.MetadataValue.float(rounded(value.value, digits))
    if isinstance(value, dg.JsonMetadataValue):
        return dg.MetadataValue.json(rounded(value.data, digits))
    if type(value) is dict:  # plain containers only: Dagster's records (TableSchema) are tuples
        return {k: rounded(v, digits) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(rounded(v, digits) for v in value)
    return value


def materialized(metadata: dict | None = None, check_results=(), **kwargs) -> dg.MaterializeResult:
    """`dg.MaterializeResult` with its metadata, and its check results' metadata, `rounded`."""
    return dg.MaterializeResult(
        metadata=rounded(metadata or {}),
        check_results=[c.with_metadata(rounded(dict(c.metadata))) for c in check_results],
        **kwargs)


def counts(df, col: str) -> dict:
    values = df.get_column(col).cast(pl.String).fill_null("n/a")
    return {k: int(v) for k, v in sorted(values.value_counts().rows())}


def base_model_path(chat) -> str:
    """The base policy that training starts from: the chat resource's model, converted if needed."""
    from mascot_dag.lib.llm.models import resolve_model
    from mascot_dag.lib.storage.home import Home

    models_dir = getattr(chat, "models_dir", "") or str(Home.from_env().models)
    return resolve_model(chat.model, models_dir)


def fingerprint(*parts) -> str:
    """Short stable hash of training inputs: a checkpoint folder is reused (resumed) only when the
    data and settings that produced it are the same."""
    import hashlib
    import json

    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# DuckDB allows one writer process per file: every asset that writes mascot.duckdb runs in this
# pool, and the instance's dagster.yaml (pipeline.prepare_home) lets one step of a pool run at a
# time across all runs. With the in-process executor and one run at a time this changes nothing;
# it is what keeps writers apart once runs or steps go parallel (docs/DESIGN.md).
DUCKDB_POOL = "duckdb"
# Transient failures (DuckDB's writer lock held past the store's own retries, MLflow's sqlite
# store busy, an endpoint that drops a request, an I/O error): the step is retried twice, 5 s
# then 15 s later. Errors in the user's input are not transient: see `input_errors_fail_at_once`.
TRANSIENT_RETRY = dg.RetryPolicy(max_retries=2, delay=5, backoff=dg.Backoff.EXPONENTIAL)
# Errors of the user's files or settings: the same input fails the same way on every attempt.
PERMANENT_INPUT_ERRORS: tuple[type[Exception], ...] = (
    DataFileError, PersonaFileError, UserProfileError)


@contextmanager
def input_errors_fail_at_once(*also: type[Exception]) -> Iterator[None]:
    """Around the part of an asset that reads user files or settings: a permanent input error
    (PERMANENT_INPUT_ERRORS, plus `also`) fails the step at once, where TRANSIENT_RETRY would
    retry it twice (~20 s and three tracebacks for one bad file). The Failure carries the
    error's own message (file, line, what is wrong); anything else, such as an OSError or a
    busy DuckDB lock, passes through to the retry policy."""
    try:
        yield
    except (*PERMANENT_INPUT_ERRORS, *also) as exc:
        # The persona and user loaders wrap any OSError in their own error: an I/O fault under
        # it (not a missing or unreadable path, which stays missing) may pass on a retry.
        cause = exc.__cause__
        if isinstance(cause, OSError) and not isinstance(cause, _PATH_ERRORS):
            raise
        raise dg.Failure(description=f"{type(exc).__name__}: {exc}", allow_retries=False) from exc


_PATH_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def user_profiles() -> list:
    """The simulated users (lib/data/users.py); a bad profile file fails the step at once."""
    from mascot_dag.lib.data.users import load_user_profiles

    with input_errors_fail_at_once():
        return load_user_profiles()


def cluster_tags(asset: str) -> dict[str, str]:
    """The op tags that carry an asset's cluster request (lib/runtime/cluster.py):
    `dagster-ray/config`
    for dagster-ray's executor, `dagster-k8s/config` for dagster-k8s. The in-process and
    multiprocess executors ignore them, so every profile runs the same definitions."""
    from mascot_dag.lib.runtime.cluster import op_tags

    return op_tags(asset)


def progress(context: dg.AssetExecutionContext, name: str):
    """A trainer callback writing a progress line per step into the run's Dagster log."""
    from mascot_dag.lib.training.callbacks import ProgressLog  # imports transformers

    return ProgressLog(context.log.info, name)


def nan_if_none(value: float | None) -> float:
    """A metadata float: NaN where a trainer reported nothing."""
    return float("nan") if value is None else float(value)
