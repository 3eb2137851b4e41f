"""`contexts`: raw human-grounded contexts (EmpatheticDialogues + QMSum) -> one keyed table."""

from pathlib import Path

import dagster as dg
from pydantic import Field

from mascot_dag.assets.common import (
    DUCKDB_POOL,
    TRANSIENT_RETRY,
    cluster_tags,
    counts,
    input_errors_fail_at_once,
    materialized,
    table_metadata,
)
from mascot_dag.lib.data import DataFileError, load_empathetic_dialogues, load_qmsum
from mascot_dag.lib.data.inbox import incoming_sources
from mascot_dag.lib.data.loading import MIN_KEPT_FRACTION
from mascot_dag.lib.data.sources import (
    DEMO_ED,
    DEMO_QMSUM,
    configured_sources,
    duplicate_ids_error,
    user_contexts_path,
)
from mascot_dag.lib.data.split import assign_split_ood, validate_ood
from mascot_dag.lib.data.user_contexts import load_user_contexts, persona_sets
from mascot_dag.lib.storage.home import Home
from mascot_dag.lib.storage.tables import contexts_frame
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore

__all__ = ["DEMO_ED", "DEMO_QMSUM", "ContextsConfig", "contexts", "resolve_sources"]

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
    contexts_path: str = Field(
        default="",
        description="The user's own contexts (CSV, JSONL or Parquet: context_id, text, optional "
        "mode, roster, domain, split, history); empty: $MASCOT_CONTEXTS_PATH, else none.",
    )
    qmsum_max_chars: int = Field(default=4000, description="Cap on a topic's transcript excerpt.")
    skip_bad_rows: bool = Field(
        default=False,
        description="Skip malformed rows/lines (counted in metadata) instead of failing.",
    )
    min_kept_fraction: float = Field(
        default=MIN_KEPT_FRACTION, ge=0.0, le=1.0,
        description="With skip_bad_rows: the share of each file's data lines that must load; "
        "below it (or at zero rows) the run fails and the stored rows stay.",
    )

def resolve_sources(config: ContextsConfig) -> tuple[Path, Path]:
    return configured_sources(config.ed_path, config.qmsum_path)

@dg.asset(op_tags=cluster_tags("contexts"),
          group_name="contexts", kinds={"duckdb", "python"},
          pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY)
def contexts(
    context: dg.AssetExecutionContext,
    config: ContextsConfig,
    store: DuckDBStore,
    settings: LineageSettings,
) -> dg.MaterializeResult:
    """Every context, one row each, with a deterministic train/eval split from a hash of its id.

    The table is replaced only after every source loaded: a failed load (a bad file, a
    skip_bad_rows load keeping too little of a file, an id from two sources) keeps the stored
    rows, and fails at once: retrying cannot mend an input."""
    ed_path, qm_path = resolve_sources(config)
    keep = config.min_kept_fraction
    with input_errors_fail_at_once():
        ed = load_empathetic_dialogues(ed_path, skip_bad=config.skip_bad_rows, min_kept=keep)
        qm = load_qmsum(qm_path, max_chars=config.qmsum_max_chars,
                        skip_bad=config.skip_bad_rows, min_kept=keep)
        # Files accepted from the inbox by the sensor (validated there, so strict here).
        ed_in, qm_in = incoming_sources(Home.from_env())
        for f in ed_in:
            ed.contexts += load_empathetic_dialogues(f).contexts
        for f in qm_in:
            qm.contexts += load_qmsum(f, max_chars=config.qmsum_max_chars).contexts
        user_path, own = user_contexts_path(config.contexts_path), []
        if user_path is not None:
            user = load_user_contexts(user_path, skip_bad=config.skip_bad_rows, min_kept=keep,
                                      rosters=persona_sets())
            own, ed.skipped = user.contexts, ed.skipped + user.skipped
        items = ed.contexts + qm.contexts + own
        dupes = duplicate_ids_error(items)
        if dupes:
            raise DataFileError(dupes)
    with input_errors_fail_at_once(ValueError):  # settings.ood_*: a setting, not a fault
        validate_ood(settings.ood_valences, settings.ood_domains,
                     {c.domain.lower() for c in own if c.domain})
    fixed = {c.context_id: c.split for c in own if c.split}  # a user's row may name its split
    for c in items:
        c.split = fixed.get(c.context_id) or assign_split_ood(
            c.context_id, c.source, c.valence, c.emotion, c.domain,
            settings.eval_ratio, settings.ood_valences, settings.ood_domains)
    df = contexts_frame(items)
    for msg in ed.skipped + qm.skipped:
        context.log.warning(f"skipped: {msg}")
    store.replace("contexts", df)
    return materialized(
        metadata=table_metadata(
            df.select("context_id", "source", "domain", "split", "valence", "situation"),
            by_source=counts(df, "source"),
            by_split=counts(df, "split"),
            by_valence=counts(df, "valence"),
            by_domain=counts(df, "domain"),
            meetings=df["meeting_id"].n_unique(),
            skipped_rows=len(ed.skipped) + len(qm.skipped),
            # the data lines behind the skipped records, counted per file (LoadResult.lines)
            skipped_lines=sum(n.bad for r in (ed, qm) for n in r.lines.values()),
            ed_path=str(ed_path),
            incoming_files=len(ed_in) + len(qm_in),
            user_contexts=len(own),
            contexts_path=str(user_path or ""),
            qmsum_path=str(qm_path),
        )
    )

def _check(passed: bool, description: str, **metadata) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=passed, description=description, metadata=metadata)

@dg.asset_check(asset=contexts, blocking=True,
                description="Every context id is unique (a repeated id would pair unrelated "
                            "dialogues in every paired comparison); blocks what reads contexts.")
def contexts_unique_ids_check(store: DuckDBStore) -> dg.AssetCheckResult:
    d, n = store.frame(
        "SELECT count(*) - count(DISTINCT context_id) AS d, count(*) AS n FROM contexts"
    ).row(0)
    return _check(d == 0, f"{d} duplicate ids among {n}", duplicates=int(d))

@dg.asset_check(asset=contexts, blocking=True,
                description="No context has an empty text or situation (a model asked about "
                            "nothing); blocks what reads contexts.")
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
