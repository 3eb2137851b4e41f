"""A/B of one evaluation method under two lineage settings, paired by context.

The question a lineage change asks ("did group-aware Stage 1 make the group echo less?") is a
comparison of the SAME method on the SAME held-out contexts, users and seeds, once per setting:
two MASCOT homes, or the home's DuckDB file copied before the change and the home after it. The
evaluation asset compares methods within one run; this compares one method across two runs.

Rows in: `eval_scores` joined with `dialogues` (columns context_id, mode, level, judge,
criterion, value) of ONE method. Judge scores (1-5) are reported on 0-100 like every report;
automatic metrics keep their own unit. Two derived rows follow what the gate weighs: `gate /
persona` (mean of lib.champion.PERSONA_CRITERIA, only where a context has all of them) and
`judge / all` (mean of every judge criterion). Differences are treatment - control with a
bootstrap CI that resamples contexts (lib.stats.paired_cluster_bootstrap).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from mascot_dag.lib.evaluation.champion import JUDGE_LEVELS, PERSONA_CRITERIA, judge_rows_100
from mascot_dag.lib.evaluation.stats import paired_cluster_bootstrap, significance_mark
from mascot_dag.lib.storage.db import connect

NEEDED = ("method", "dialogue_id", "context_id", "mode", "level", "judge", "criterion", "value")
RESULT_SCHEMA = {"group": pl.String, "level": pl.String, "criterion": pl.String,
                 "n_contexts": pl.Int64, "control": pl.Float64, "treatment": pl.Float64,
                 "difference": pl.Float64, "lo": pl.Float64, "hi": pl.Float64,
                 "p_two_sided": pl.Float64, "mark": pl.String}


def per_context(rows: pl.DataFrame, label: str = "rows") -> pl.DataFrame:
    """One value per (context_id, mode, level, criterion): judges averaged, judge scores on
    0-100, plus the derived `gate/persona` and `judge/all` rows. `label` names the run in errors.
    """
    missing = [c for c in NEEDED if c not in rows.columns]
    if missing:
        raise ValueError(f"{label}: columns {missing} missing (need {list(NEEDED)})")
    try:  # the reports' own 1-5 check and 0-100 scale for judge rows
        judged = judge_rows_100(rows)
    except ValueError as exc:
        raise ValueError(f"{label}: {exc}") from exc
    auto = rows.filter(~pl.col("level").is_in(JUDGE_LEVELS)).with_columns(
        value=pl.col("value").cast(pl.Float64).fill_nan(None)).drop_nulls("value")
    df = pl.concat([judged.select(NEEDED), auto.select(NEEDED)])
    keys = ["context_id", "mode", "level", "criterion"]
    base = df.group_by(keys).agg(pl.col("value").mean())
    per_judged = base.filter(pl.col("level").is_in(JUDGE_LEVELS))
    name = pl.col("level") + "/" + pl.col("criterion")
    persona = (per_judged.filter(name.is_in(PERSONA_CRITERIA))
               .group_by("context_id", "mode")
               .agg(pl.col("value").mean(), n=pl.len())
               .filter(pl.col("n") == len(PERSONA_CRITERIA)).drop("n")
               .with_columns(level=pl.lit("gate"), criterion=pl.lit("persona")))
    overall = (per_judged.group_by("context_id", "mode").agg(pl.col("value").mean())
               .with_columns(level=pl.lit("judge"), criterion=pl.lit("all")))
    return pl.concat([base, persona.select(keys + ["value"]), overall.select(keys + ["value"])])


def compare(control: pl.DataFrame, treatment: pl.DataFrame, n_boot: int = 2000,
            seed: int = 0) -> pl.DataFrame:
    """treatment - control per (group, level, criterion), group = each mode and `all` (both
    modes pooled, still clustered by context). Only contexts both runs scored are paired; a
    context whose mode differs between the runs is an error (they are not the same design)."""
    a = per_context(control, "control")
    b = per_context(treatment, "treatment")
    modes = a.select("context_id", "mode").unique().join(
        b.select("context_id", "mode").unique(), on="context_id", suffix="_t")
    clash = modes.filter(pl.col("mode") != pl.col("mode_t"))
    if clash.height:
        r = clash.row(0, named=True)
        raise ValueError(f"context {r['context_id']} is mode {r['mode']} in control but "
                         f"{r['mode_t']} in treatment: not the same evaluation design")
    pairs = a.join(b, on=["context_id", "mode", "level", "criterion"], suffix="_t")
    if pairs.is_empty():
        raise ValueError("control and treatment share no scored context: run the same "
                         "evaluation (contexts, seeds, method) under both settings")
    pooled = pairs.with_columns(mode=pl.lit("all"))
    out = []
    for (group, level, crit), g in (pl.concat([pairs, pooled])
                                    .group_by("mode", "level", "criterion")):
        r = paired_cluster_bootstrap(g["context_id"].to_list(),
                                     (g["value_t"] - g["value"]).to_list(), n=n_boot, seed=seed)
        out.append([group, level, crit, g.height, g["value"].mean(), g["value_t"].mean(),
                    r["mean"], r["lo"], r["hi"], r["p_two_sided"],
                    significance_mark(r["lo"], r["hi"], r["n_clusters"])])
    return pl.DataFrame(out, schema=RESULT_SCHEMA, orient="row").sort("group", "level",
                                                                       "criterion")


SCORES_SQL = ("SELECT s.method, s.dialogue_id, d.context_id, d.mode, s.level, s.judge, "
              "s.criterion, s.value "
              "FROM eval_scores s JOIN dialogues d USING (dialogue_id) "
              "WHERE d.stage = 'eval' AND s.method = ?")


def load_scores(path: str | Path, method: str) -> pl.DataFrame:
    """One method's scored eval rows from a DuckDB file, opened read-only (a backup copy or
    another home is never written). Errors name the file and the method when there is none."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such DuckDB file")
    with connect(path, read_only=True) as con:
        known = {r[0] for r in con.execute("SHOW TABLES").fetchall()}
        if not {"eval_scores", "dialogues"} <= known:
            raise ValueError(f"{path}: no eval_scores/dialogues tables (not a MASCOT home's "
                             "DuckDB file, or its evaluation never ran)")
        rows = con.execute(SCORES_SQL, [method]).pl()
    if rows.is_empty():
        raise ValueError(f"{path}: no scored eval dialogues of method {method!r}")
    return rows
