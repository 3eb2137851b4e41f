"""Stage 1's gate (group `persona_alignment`): the persona probe. Every persona speaks with and
without its adapter on held-out contexts, and a panel of readers (lib/stage1/readers.py) names
which persona each text sounds like; `roster_fidelity_effect` blocks Stage 2 when the
roster did not become more identifiable under every valid reader (lib/stage1/panel.py)."""


import dagster as dg
import polars as pl

from mascot_dag.assets.common import (
    STAGE1_EXPERIMENT,
    WARN_ONLY,
    cluster_tags,
    markdown_table,
    materialized,
    persona_partitions,
)
from mascot_dag.lib.evaluation.stats import MIN_CLUSTERS_FOR_SIGNIFICANCE
from mascot_dag.lib.stage1 import panel
from mascot_dag.lib.stage1.readers import NoReferenceUtterances, load_reference_utterances
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore
from mascot_dag.resources.tracking import MLflowResource


@dg.asset(
    op_tags=cluster_tags("persona_roster_probe"),
    group_name="persona_alignment",
    deps=[dg.AssetDep("persona_adapters", partition_mapping=dg.AllPartitionMapping())],
    kinds={"duckdb", "mlflow"},
    check_specs=[dg.AssetCheckSpec(
        "roster_fidelity_effect", asset="persona_roster_probe", blocking=True,
        description="The adapters make the roster more recognisable under every valid reader of "
                    "the probe panel (pooled CI above zero, no persona significantly worse). "
                    "Blocks Stage 2 and the evaluation only in profiles with probe_blocking "
                    "(study, paper); warn-only in the embedded and tiny profiles.")],
)
def persona_roster_probe(
    store: DuckDBStore, tracking: MLflowResource, settings: LineageSettings
) -> dg.MaterializeResult:
    """Stage 1's gate: the persona probe pooled over the roster (every persona's paired units in
    persona_probe, context-clustered CI). Blocks Stage 2 and the evaluation when the adapters do
    not make the roster more identifiable, or one persona is made significantly worse
    (`probe_blocking`; lib/stage1/probe.roster_verdict says why pooled, lib/stage1/panel.py why
    every valid reader must agree)."""
    personas = persona_partitions.get_partition_keys()
    try:
        load_reference_utterances(settings.train_persona_set)
    except NoReferenceUtterances as e:
        # a user's set without reference utterances: no reader can tell its personas apart, so
        # the gate says n/a (a warning, not a block: nothing was measured either way)
        return materialized(
            metadata={"probe": str(e), "personas": ", ".join(personas)},
            check_results=[dg.AssetCheckResult(
                check_name="roster_fidelity_effect", passed=True,
                severity=dg.AssetCheckSeverity.WARN, description=str(e))])
    result = panel.roster_panel(store.frame, personas, settings.train_persona_set,
                                MIN_CLUSTERS_FOR_SIGNIFICANCE, seed=settings.seed)
    summary, verdict, versions = result.summary, result.verdict, result.versions
    effect = {"identifiable_gain": verdict.gain, "identifiable_lo": verdict.lo,
              "identifiable_hi": verdict.hi, "n_contexts": verdict.n_contexts,
              "n_units": verdict.n_units}
    with tracking.start_run(STAGE1_EXPERIMENT, "persona-roster-probe",
                            {"asset": "persona_roster_probe"}) as run:
        tracking.log_params({"adapters": ",".join(versions), "passed": verdict.passed,
                             "significantly_worse": ",".join(verdict.worse),
                             "conservative_reader": verdict.reader,
                             "established": ",".join(verdict.established),
                             "readers_not_counted": ",".join(verdict.invalid)})
        tracking.log_metrics({f"roster_{k}": float(v) for k, v in effect.items()})
    return materialized(
        metadata={
            "mlflow_run_id": run.info.run_id,
            "adapters": ", ".join(versions),
            "probe": dg.MetadataValue.md(markdown_table(
                summary.with_columns(pl.selectors.float().round(3)))),
            "readers": dg.MetadataValue.md(markdown_table(pl.DataFrame(
                {"reader": list(result.accuracies),
                 # None: people, a reference reader that counts by definition (lib/stage1/panel)
                 "accuracy": [None if a is None else round(a, 3)
                              for a in result.accuracies.values()]}))),
            "people": dg.MetadataValue.md("\n".join(
                [f"- {c.describe()}" for c in result.people]
                + [f"- {result.raters.describe()}"])),
            "agreement": dg.MetadataValue.md(markdown_table(
                result.agreement.with_columns(pl.selectors.float().round(3)))),
            "conservative_reader": verdict.reader,
            **effect,
        },
        check_results=[dg.AssetCheckResult(
            check_name="roster_fidelity_effect", passed=verdict.passed,
            # blocking only fails the run at ERROR
            severity=dg.AssetCheckSeverity.ERROR if settings.probe_blocking
            else dg.AssetCheckSeverity.WARN,
            description=("" if settings.probe_blocking else WARN_ONLY) + verdict.description,
            metadata={**effect, "significantly_worse": ", ".join(verdict.worse),
                      "established": ", ".join(verdict.established),
                      "conservative_reader": verdict.reader},
        )],
    )
