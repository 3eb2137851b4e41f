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
    input_errors_fail_at_once,
    markdown_table,
    materialized,
    trained_rosters,
)
from mascot_dag.lib.data.personas import load_personas
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
    """Stage 1's gate: the persona probe pooled over each trained set's roster (every persona's
    paired units in persona_probe, context-clustered CI); it passes only when every trained
    set's verdict passes (a set without reference utterances: n/a). Blocks Stage 2 and the
    evaluation when the adapters do not make a roster more identifiable, or one persona is made
    significantly worse
    (`probe_blocking`; lib/stage1/probe.roster_verdict says why pooled, lib/stage1/panel.py why
    every valid reader must agree)."""
    with input_errors_fail_at_once():
        rosters = trained_rosters(load_personas(), settings)
    results, not_probed = {}, {}
    for persona_set, personas in rosters.items():  # every trained set, its own roster
        try:
            load_reference_utterances(persona_set)
        except NoReferenceUtterances as e:
            # a user's set without reference utterances: no reader can tell its personas apart,
            # so its gate says n/a (not a block: nothing was measured either way)
            not_probed[persona_set] = str(e)
            continue
        results[persona_set] = panel.roster_panel(store.frame, personas, persona_set,
                                                  MIN_CLUSTERS_FOR_SIGNIFICANCE,
                                                  seed=settings.seed)
    if not results:
        return materialized(
            metadata={"probe": "; ".join(not_probed.values()),
                      "personas": ", ".join(p for ids in rosters.values() for p in ids)},
            check_results=[dg.AssetCheckResult(
                check_name="roster_fidelity_effect", passed=True,
                severity=dg.AssetCheckSeverity.WARN, description="; ".join(not_probed.values()))])
    # the gate passes only when every probed set's verdict passes (panel.sets_verdict)
    verdict = panel.sets_verdict({s: r.verdict for s, r in results.items()})
    versions = [v for r in results.values() for v in r.versions]
    effect = _effect(verdict)
    name = tracking.run_name("roster probe", extra=[f"{len(versions)} adapters",
                                                    f"{verdict.n_contexts} contexts"])
    with tracking.start_run(STAGE1_EXPERIMENT, name, {"asset": "persona_roster_probe"}) as run:
        tracking.log_params({"adapters": ",".join(versions), "passed": verdict.passed,
                             "significantly_worse": ",".join(verdict.worse),
                             "conservative_reader": verdict.reader,
                             "established": ",".join(verdict.established),
                             "readers_not_counted": ",".join(verdict.invalid),
                             **({"sets_passed": ",".join(
                                 f"{s}={r.verdict.passed}" for s, r in results.items()),
                                 "sets_not_probed": ",".join(not_probed)}
                                if len(rosters) > 1 else {})})
        tracking.log_metrics({f"roster_{k}": float(v) for k, v in effect.items()})
        if len(results) > 1:
            tracking.log_metrics({f"roster_{s}_{k}": float(v) for s, r in results.items()
                                  for k, v in _effect(r.verdict).items()})
    if len(results) == 1:  # one set: its tables unprefixed, as before
        metadata = _set_metadata(next(iter(results.values())))
    else:
        metadata = {f"{s}/{k}": v for s, r in results.items()
                    for k, v in _set_metadata(r).items()}
        metadata["sets"] = dg.MetadataValue.md(markdown_table(pl.DataFrame(
            [{"set": s, "passed": r.verdict.passed, "personas": len(rosters[s]),
              "gain": round(r.verdict.gain, 3), "lo": round(r.verdict.lo, 3),
              "hi": round(r.verdict.hi, 3), "n_contexts": r.verdict.n_contexts,
              "reader": r.verdict.reader} for s, r in results.items()])))
    if not_probed:
        metadata["not_probed"] = "; ".join(not_probed.values())
    description = verdict.description + "".join(f"; {s}: n/a" for s in not_probed)
    return materialized(
        metadata={"mlflow_run_id": run.info.run_id, "adapters": ", ".join(versions),
                  **metadata, "conservative_reader": verdict.reader, **effect},
        check_results=[dg.AssetCheckResult(
            check_name="roster_fidelity_effect", passed=verdict.passed,
            # blocking only fails the run at ERROR
            severity=dg.AssetCheckSeverity.ERROR if settings.probe_blocking
            else dg.AssetCheckSeverity.WARN,
            description=("" if settings.probe_blocking else WARN_ONLY) + description,
            metadata={**effect, "significantly_worse": ", ".join(verdict.worse),
                      "established": ", ".join(verdict.established),
                      "conservative_reader": verdict.reader},
        )],
    )


def _effect(verdict) -> dict:
    return {"identifiable_gain": verdict.gain, "identifiable_lo": verdict.lo,
            "identifiable_hi": verdict.hi, "n_contexts": verdict.n_contexts,
            "n_units": verdict.n_units}


def _set_metadata(result) -> dict:
    """One set's probe tables: per-reader summary, readers' accuracies, people, agreement."""
    return {
        "probe": dg.MetadataValue.md(markdown_table(
            result.summary.with_columns(pl.selectors.float().round(3)))),
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
    }
