"""Report sections that compare with MASCOT on paired contexts, break scores down by ED valence and
QMSum domain, and set our numbers beside the paper's.

Every comparison with MASCOT is a PAIRED difference, Δ = MASCOT − method, over the contexts both
methods were scored on (same contexts, users and seeds), with a 95% bootstrap CI that resamples
contexts (`stats.paired_cluster_bootstrap`), n = paired contexts, and '*' when the CI excludes 0
and n >= 6 (`stats.MIN_CLUSTERS_FOR_SIGNIFICANCE`).
Unpaired means of two methods would carry the between-context spread, which dwarfs the method
effect at our sizes. Numbers are 0-100; inputs are the report's judge rows already on 0-100.
Frames are polars; missing values are nulls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mascot_dag.lib.data.user_contexts import USER_CONTEXT_PREFIX
from mascot_dag.lib.evaluation.champion import pair_methods, with_context
from mascot_dag.lib.evaluation.stats import paired_cluster_bootstrap, significance_mark

REF = "mascot"
OVERALL = "overall"
N_BOOT = 2000
PAIRED_NOTE = ("Δ = mascot − method on the same contexts (positive: MASCOT ahead); [95% bootstrap "
               "CI over contexts]; * the CI excludes 0 with n >= 6; n = paired contexts.")


def md_table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out + [""]


def save_png(fig: Any, path: Path, plots: list[Path]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plots.append(path)


def item(level: str, criterion: str) -> str:
    return f"{level}/{criterion}"


def per_dialogue_items(judge: pl.DataFrame, dialogues: pl.DataFrame | None) -> pl.DataFrame:
    """One row per scored dialogue (sorted by method, dialogue_id): method, dialogue_id,
    context_id and one column per item: `<level>/<criterion>` (mean over judges),
    `<level>/overall` (mean of that level's criteria) and `overall` (mean of all criteria: the
    champion.py recipe, per dialogue). A criterion a dialogue was not scored on is null."""
    keys = ["method", "dialogue_id"]
    if judge.is_empty():
        return pl.DataFrame(schema={"method": pl.String, "dialogue_id": pl.String,
                                    "context_id": pl.String, OVERALL: pl.Float64})
    crit = (judge.group_by(*keys, "level", "criterion").agg(pl.col("value").mean())
            .with_columns(item=pl.col("level") + "/" + pl.col("criterion")))
    # columns a-z, as the item names sort; the level and overall means follow
    wide = crit.pivot(on="item", index=keys, values="value", aggregate_function="mean")
    wide = wide.select(*keys, *sorted(c for c in wide.columns if c not in keys))
    levels = (crit.with_columns(item=pl.col("level") + "/" + OVERALL)
              .pivot(on="item", index=keys, values="value", aggregate_function="mean"))
    levels = levels.select(*keys, *sorted(c for c in levels.columns if c not in keys))
    overall = crit.group_by(keys).agg(pl.col("value").mean().alias(OVERALL))
    wide = wide.join(levels, on=keys).join(overall, on=keys).sort(keys)
    return with_context(wide, dialogues)


def paired(per: pl.DataFrame, method: str, column: str = OVERALL, seed: int = 0
           ) -> dict[str, float]:
    """paired_cluster_bootstrap of MASCOT − method on `column` (NaN stats when nothing pairs)."""
    if column not in per.columns:
        return paired_cluster_bootstrap([], [])
    pairs = pair_methods(per, REF, method, column)
    return paired_cluster_bootstrap(pairs["context_id"].to_list(), pairs["diff"].to_list(),
                                    n=N_BOOT, seed=seed)


def diff_cell(r: dict[str, float], digits: int = 1) -> str:
    """'+x.x [lo, hi]* (n=N)', or n/a when no context has both methods."""
    if not r["n_clusters"] or math.isnan(r["mean"]):
        return "n/a (no paired contexts)"
    if r["n_clusters"] < 2:  # a bootstrap over one context is the point itself, not a CI
        return f"{r['mean']:+.{digits}f} (n=1, no CI)"
    mark = significance_mark(r["lo"], r["hi"], r["n_clusters"])
    return (f"{r['mean']:+.{digits}f} [{r['lo']:+.{digits}f}, {r['hi']:+.{digits}f}]{mark} "
            f"(n={int(r['n_clusters'])})")


def rubric_columns(per: pl.DataFrame, level: str, rubric: Iterable[str]) -> list[str]:
    """The criteria of `level` present in `per`: the rubric's order first, then any others."""
    found = {c.split("/", 1)[1] for c in per.columns if c.startswith(f"{level}/")} - {OVERALL}
    return [c for c in rubric if c in found] + sorted(found - set(rubric))


def paired_section(per: pl.DataFrame, methods: list[str], rubrics: dict[str, Iterable[str]]
                   ) -> list[str]:
    """Δ to MASCOT per method: overall and every criterion."""
    lines = ["## Paired differences to MASCOT", "", PAIRED_NOTE, ""]
    others = [m for m in methods if m != REF]
    if per.is_empty() or REF not in set(per["method"].to_list()):
        return lines + [f"n/a (no judge scores for method {REF})", ""]
    if not others:
        return lines + ["n/a (no other method)", ""]
    cols = [OVERALL] + [item(lv, c) for lv, rub in rubrics.items()
                        for c in rubric_columns(per, lv, rub)]
    rows = [[m] + [diff_cell(paired(per, m, c)) for c in cols] for m in others]
    return lines + md_table(["method"] + cols, rows)


def context_groups(per: pl.DataFrame, contexts: pl.DataFrame | None) -> pl.Series:
    """Breakdown label per row of `per`: 'ED <valence>', 'QMSum <domain>', or for the user's
    contexts (ids `user:...`) 'Yours <domain>' (null if unknown)."""
    label: dict[str, str] = {}
    if contexts is not None:
        rows = contexts.iter_rows(named=True) if "context_id" in contexts.columns else []
        for r in rows:
            if str(r["context_id"]).startswith(USER_CONTEXT_PREFIX):
                label[r["context_id"]] = f"Yours {r.get('domain') or '(no domain)'}"
            elif r.get("source") == "empatheticdialogues" and isinstance(r.get("valence"), str):
                label[r["context_id"]] = f"ED {r['valence']}"
            elif r.get("source") == "qmsum" and isinstance(r.get("domain"), str):
                label[r["context_id"]] = f"QMSum {r['domain']}"
    return pl.Series("group", [label.get(c) for c in per["context_id"].to_list()],
                     dtype=pl.String)


GROUP_ORDER = ["ED positive", "ED negative", "ED neutral", "QMSum academic", "QMSum committee",
               "QMSum product"]


def breakdown_section(per: pl.DataFrame, contexts: pl.DataFrame | None, methods: list[str],
                      rubrics: dict[str, Iterable[str]]) -> list[str]:
    """The paper's layout: per ED valence and per QMSum domain, one table per level."""
    lines = ["## By ED valence and QMSum domain", ""]
    if per.is_empty():
        return lines + ["n/a (no judge scores)", ""]
    groups = context_groups(per, contexts)
    if groups.null_count() == len(groups):
        return lines + ["n/a (no context metadata: contexts table with source, valence, domain)",
                        ""]
    lines += ["Cells: mean over dialogues (0-100). Last column: " + PAIRED_NOTE, ""]
    found = set(groups.drop_nulls().to_list())
    for g in [x for x in GROUP_ORDER if x in found] + sorted(found - set(GROUP_ORDER)):
        sub = per.filter(groups == g)
        for level, rubric in rubrics.items():
            crits = rubric_columns(sub, level, rubric)
            if not crits:
                continue
            cols = [item(level, c) for c in crits] + [item(level, OVERALL)]
            rows = []
            for m in methods:
                mine = sub.filter(pl.col("method") == m)
                if mine.is_empty():
                    continue
                cells = [mean_cell(mine[c]) for c in cols]
                delta = "–" if m == REF else diff_cell(paired(sub, m, item(level, OVERALL)))
                rows.append([m, mine.height] + cells + [delta])
            lines += [f"### {g}: {level}-level", ""]
            lines += md_table(["method", "dialogues"] + crits + [OVERALL, f"Δ {level} overall"],
                              rows)
    return lines


def _values(col: pl.Series) -> np.ndarray:
    """The column's values without missing ones (null, or NaN from a float input)."""
    vals = col.cast(pl.Float64).drop_nulls().to_numpy()
    return vals[~np.isnan(vals)]


def mean_cell(col: pl.Series) -> str:
    """A table cell: the mean of the finite values, or n/a."""
    vals = _values(col)
    return f"{vals.mean():.1f}" if len(vals) else "n/a"


def paper_section(per: pl.DataFrame, contexts: pl.DataFrame | None, published: pl.DataFrame | None,
                  out_dir: Path, plots: list[Path]) -> list[str]:
    """Our level-overall scores on ED beside the paper's published ones, per valence and pooled."""
    lines = ["## Beside the paper (EmpatheticDialogues, overall per level, 0-100)", ""]
    if published is None or published.is_empty():
        return lines + ["n/a (no published results file)", ""]
    pub = published.filter((pl.col("criterion") == OVERALL)
                           & (pl.col("dataset") == "empatheticdialogues"))
    groups = context_groups(per, contexts)
    is_ed = groups.str.starts_with("ED ").fill_null(False)
    ours = per.filter(is_ed).with_columns(split=groups.filter(is_ed).str.strip_prefix("ED "))
    if ours.is_empty():
        return lines + ["n/a (no scored EmpatheticDialogues dialogue with context metadata)", ""]
    lines += ["Paper: GPT-class LLM judge (published figures); ours: this run's judges. Levels "
              "differ by judge; compare directions (which method leads), not absolute values.", ""]
    splits = [v for v in ("positive", "negative", "neutral") if v in set(pub["split"].to_list())]
    rows, bars = [], {}
    for level in ("agent", "collective"):
        col = item(level, OVERALL)
        for m in pub["method"].unique(maintain_order=True).to_list():
            p = pub.filter((pl.col("level") == level) & (pl.col("method") == m))
            if p.is_empty():
                continue
            mine = ours.filter(pl.col("method") == m) if col in ours.columns else ours.head(0)
            row = [level, m]
            for split in splits:
                score = p.filter(pl.col("split") == split)["score_0_100"]
                vals = _values(mine.filter(pl.col("split") == split)[col]) if mine.height else []
                row += [f"{float(score[0]):.1f}" if len(score) else "n/a (not published)",
                        f"{np.mean(vals):.1f} (n={len(vals)})" if len(vals) else "n/a"]
            rows.append(row)
            pooled = _values(mine[col]) if mine.height else []
            bars[(level, m)] = (float(p["score_0_100"].mean()),
                                float(np.mean(pooled)) if len(pooled) else np.nan)
    header = ["level", "method"] + [f"{v} {w}" for v in splits for w in ("paper", "ours (n)")]
    lines += md_table(header, rows)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.5))
    for k, level in enumerate(("agent", "collective")):
        ax = fig.add_subplot(1, 2, k + 1)
        ms = [m for (lv, m) in bars if lv == level]
        x = np.arange(len(ms))
        ax.bar(x - 0.2, [bars[(level, m)][0] for m in ms], 0.4, label="paper")
        ax.bar(x + 0.2, [bars[(level, m)][1] for m in ms], 0.4, label="ours")
        ax.set_xticks(x, ms, rotation=40, ha="right", fontsize=7)
        ax.set_ylim(0, 100)
        ax.set_title(f"{level}-level overall (ED, mean over valences)", fontsize=9)
        ax.legend(fontsize=7)
    save_png(fig, out_dir / "paper_comparison.png", plots)
    return lines + ["![paper comparison](paper_comparison.png)",
                    "Missing bars: no dialogues of that method in this run.", ""]
