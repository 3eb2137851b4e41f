"""`contexts`: raw human-grounded contexts (EmpatheticDialogues + QMSum) -> one keyed table."""

import os
from importlib import resources
from pathlib import Path

import dagster as dg
import polars as pl
from pydantic import Field

from mascot_dag.assets.common import (
    DUCKDB_POOL,
    TRANSIENT_RETRY,
    cluster_tags,
    counts,
    table_metadata,
)
from mascot_dag.lib.data import load_empathetic_dialogues, load_qmsum
from mascot_dag.lib.data.inbox import incoming_sources
from mascot_dag.lib.data.split import assign_split_ood, validate_ood
from mascot_dag.lib.storage.home import Home
from mascot_dag.lib.storage.tables import contexts_frame
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore

DEMO_DIR = Path(str(resources.files("mascot_dag") / "data"))
DEMO_ED = DEMO_DIR / "empatheticdialogues"
DEMO_QMSUM = DEMO_DIR / "qmsum"

class ContextsConfig(dg.Config):
    ed_path: str = Field(
        default="",
        description="EmpatheticDialogues CSV file or folder; empty: $MASCOT_ED_PATH, else the "
        "demo data.",
    )
    qmsum_path: str = Field(
        default="",
        description="QMSum folder (<Domain>/*.jsonl) or one JSONL; empty: $MASCOT_QMSUM_PATH, "
        "else demo.",
    )
    qmsum_max_chars: int = Field(default=4000, description="Cap on a topic's transcript excerpt.")
    skip_bad_rows: bool = Field(
        default=False,
        description="Skip malformed rows/lines (counted in metadata) instead of failing.",
    )

def resolve_sources(config: ContextsConfig) -> tuple[Path, Path]:
    ed = config.ed_path or os.environ.get("MASCOT_ED_PATH") or str(DEMO_ED)
    qm = config.qmsum_path or os.environ.get("MASCOT_QMSUM_PATH") or str(DEMO_QMSUM)
    return Path(ed), Path(qm)

@dg.asset(op_tags=cluster_tags("contexts"),
          group_name="contexts", kinds={"duckdb", "python"},
          pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY)
def contexts(
    context: dg.AssetExecutionContext,
    config: ContextsConfig,
    store: DuckDBStore,
    settings: LineageSettings,
) -> dg.MaterializeResult:
    """Every context, one row each, with a deterministic train/eval split from a hash of its id."""
    ed_path, qm_path = resolve_sources(config)
    ed = load_empathetic_dialogues(ed_path, skip_bad=config.skip_bad_rows)
    qm = load_qmsum(qm_path, max_chars=config.qmsum_max_chars, skip_bad=config.skip_bad_rows)
    # Files accepted from the inbox by the sensor (validated there, so strict here).
    ed_in, qm_in = incoming_sources(Home.from_env())
    for f in ed_in:
        ed.contexts += load_empathetic_dialogues(f).contexts
    for f in qm_in:
        qm.contexts += load_qmsum(f, max_chars=config.qmsum_max_chars).contexts
    items = ed.contexts + qm.contexts
    validate_ood(settings.ood_valences, settings.ood_domains)
    for c in items:
        c.split = assign_split_ood(c.context_id, c.source, c.valence, c.emotion, c.domain,
                                   settings.eval_ratio, settings.ood_valences, settings.ood_domains)
    df = contexts_frame(items)
    dupes = df.filter(pl.col("context_id").is_duplicated())["context_id"].unique(
        maintain_order=True).to_list()
    if dupes:
        raise ValueError(f"duplicate context ids from {ed_path} / {qm_path}: {dupes[:5]}")
    for msg in ed.skipped + qm.skipped:
        context.log.warning(f"skipped: {msg}")
    store.replace("contexts", df)
    return dg.MaterializeResult(
        metadata=table_metadata(
            df.select("context_id", "source", "domain", "split", "valence", "situation"),
            by_source=counts(df, "source"),
            by_split=counts(df, "split"),
            by_valence=counts(df, "valence"),
            by_domain=counts(df, "domain"),
            meetings=df["meeting_id"].n_unique(),
            skipped_rows=len(ed.skipped) + len(qm.skipped),
            ed_path=str(ed_path),
            incoming_files=len(ed_in) + len(qm_in),
            qmsum_path=str(qm_path),
        )
    )

def _check(passed: bool, description: str, **metadata) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=passed, description=description, metadata=metadata)

@dg.asset_check(asset=contexts, blocking=True)
def contexts_unique_ids_check(store: DuckDBStore) -> dg.AssetCheckResult:
    d, n = store.frame(
        "SELECT count(*) - count(DISTINCT context_id) AS d, count(*) AS n FROM contexts"
    ).row(0)
    return _check(d == 0, f"{d} duplicate ids among {n}", duplicates=int(d))

@dg.asset_check(asset=contexts, blocking=True)
def contexts_no_empty_texts_check(store: DuckDBStore) -> dg.AssetCheckResult:
    bad = store.frame(
        "SELECT context_id FROM contexts WHERE trim(text) = '' OR trim(situation) = '' LIMIT 10"
    )
    return _check(bad.is_empty(), f"{bad.height} contexts with empty text",
                  examples=bad["context_id"].to_list())

@dg.asset_check(asset=contexts)
def contexts_coverage_check(store: DuckDBStore) -> dg.AssetCheckResult:
    """Every valence (ED) and every QMSum domain is present, in the train split at least."""
    df = store.frame("SELECT source, domain, valence, split FROM contexts")
    valences = set(df.filter(source="empatheticdialogues")["valence"].drop_nulls())
    domains = set(df.filter(source="qmsum")["domain"])
    missing = sorted({"positive", "negative", "neutral"} - valences) + sorted(
        {"academic", "committee", "product"} - domains
    )
    return _check(not missing, f"missing: {missing}" if missing else "all present", missing=missing)
