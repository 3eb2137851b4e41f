"""`contexts`: raw human-grounded contexts (EmpatheticDialogues + QMSum) -> one keyed table."""

import os
from importlib import resources
from pathlib import Path

import dagster as dg
from pydantic import Field

from mascot_dag.assets.common import counts, table_metadata
from mascot_dag.lib.home import Home
from mascot_dag.lib.inbox import incoming_sources
from mascot_dag.lib.loaders import load_empathetic_dialogues, load_qmsum
from mascot_dag.lib.split import assign_split
from mascot_dag.lib.tables import contexts_frame
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore

DEMO_DIR = Path(str(resources.files("mascot_dag") / "data"))
DEMO_ED = DEMO_DIR / "empatheticdialogues"
DEMO_QMSUM = DEMO_DIR / "qmsum"

class ContextsConfig(dg.Config):
    ed_path: str = Field(
        default="",
        description="EmpatheticDialogues CSV file or folder; empty: $MASCOT_ED_PATH, else the demo data.",
    )
    qmsum_path: str = Field(
        default="",
        description="QMSum folder (<Domain>/*.jsonl) or one JSONL; empty: $MASCOT_QMSUM_PATH, else demo.",
    )
    qmsum_max_chars: int = Field(default=4000, description="Cap on a topic's transcript excerpt.")
    skip_bad_rows: bool = Field(
        default=False, description="Skip malformed rows/lines (counted in metadata) instead of failing."
    )

def resolve_sources(config: ContextsConfig) -> tuple[Path, Path]:
    ed = config.ed_path or os.environ.get("MASCOT_ED_PATH") or str(DEMO_ED)
    qm = config.qmsum_path or os.environ.get("MASCOT_QMSUM_PATH") or str(DEMO_QMSUM)
    return Path(ed), Path(qm)

@dg.asset(group_name="contexts", kinds={"duckdb", "python"})
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
    for c in items:
        c.split = assign_split(c.context_id, settings.eval_ratio)
    df = contexts_frame(items)
    dupes = df.loc[df.context_id.duplicated(), "context_id"].tolist()
    if dupes:
        raise ValueError(f"duplicate context ids from {ed_path} / {qm_path}: {dupes[:5]}")
    for msg in ed.skipped + qm.skipped:
        context.log.warning(f"skipped: {msg}")
    store.replace("contexts", df)
    return dg.MaterializeResult(
        metadata=table_metadata(
            df[["context_id", "source", "domain", "split", "valence", "situation"]],
            by_source=counts(df, "source"),
            by_split=counts(df, "split"),
            by_valence=counts(df, "valence"),
            by_domain=counts(df, "domain"),
            meetings=int(df.meeting_id.nunique()),
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
    n = store.query(
        "SELECT count(*) - count(DISTINCT context_id) AS d, count(*) AS n FROM contexts"
    ).iloc[0]
    return _check(int(n.d) == 0, f"{int(n.d)} duplicate ids among {int(n.n)}", duplicates=int(n.d))

@dg.asset_check(asset=contexts, blocking=True)
def contexts_no_empty_texts_check(store: DuckDBStore) -> dg.AssetCheckResult:
    bad = store.query(
        "SELECT context_id FROM contexts WHERE trim(text) = '' OR trim(situation) = '' LIMIT 10"
    )
    return _check(bad.empty, f"{len(bad)} contexts with empty text", examples=bad.context_id.tolist())

@dg.asset_check(asset=contexts)
def contexts_coverage_check(store: DuckDBStore) -> dg.AssetCheckResult:
    """Every valence (ED) and every QMSum domain is present, in the train split at least."""
    df = store.query("SELECT source, domain, valence, split FROM contexts")
    valences = set(df.loc[df.source == "empatheticdialogues", "valence"].dropna())
    domains = set(df.loc[df.source == "qmsum", "domain"])
    missing = sorted({"positive", "negative", "neutral"} - valences) + sorted(
        {"academic", "committee", "product"} - domains
    )
    return _check(not missing, f"missing: {missing}" if missing else "all present", missing=missing)
