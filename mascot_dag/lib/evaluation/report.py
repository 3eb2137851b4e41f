"""The evaluation report: markdown tables and PNG plots from the evaluation tables.

Input DataFrames (polars) are shaped like
the DuckDB tables `eval_scores` and `dialogues` (judge scores on the judges' 1-5 scale; shown here
on 0-100). Every section renders whatever data exists: a missing
method, judge, profile or comparison becomes "n/a (reason)", never an exception. Directions of
automatic metrics come from `metrics.METRICS` (lm-evaluation-harness style), so a table cannot
show a lower-is-better metric as if higher were better. Plots use matplotlib's Agg canvas directly
(no pyplot global state), so reports render on headless workers.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mascot_dag.lib.evaluation.champion import dialogue_overall, judge_rows_100, overall_score
from mascot_dag.lib.evaluation.human_stats import human_section
from mascot_dag.lib.evaluation.methods import METHOD_LABELS
from mascot_dag.lib.evaluation.metrics import METRICS
from mascot_dag.lib.evaluation.paper import published_table, results_path
from mascot_dag.lib.evaluation.report_conditions import condition_section, persona_mbti_section
from mascot_dag.lib.evaluation.report_sections import (
    PAIRED_NOTE,
    breakdown_section,
    diff_cell,
    md_table,
    paired,
    paired_section,
    paper_section,
    per_dialogue_items,
    save_png,
)
from mascot_dag.lib.evaluation.stats import bootstrap_ci, mean_std
from mascot_dag.lib.evaluation.verdict import Stage1Figures, champion_section, verdict_section
from mascot_dag.lib.stage2.director_eval import report_section as director_section
from mascot_dag.lib.types import AGENT_CRITERIA, COLLECTIVE_CRITERIA

SCORE_COLUMNS = [
    "method",
    "dialogue_id",
    "level",
    "judge",
    "criterion",
    "value",
    "higher_is_better",
]
# Reading order of methods: MASCOT, its ablations, the current champion re-run beside it (the
# gate's comparator), then the paper's baselines; others follow a-z.
METHOD_ORDER = ["mascot", "mascot_p", "mascot_c", "champion", "zero_shot", "zero_shot_cot",
                "few_shot", "few_shot_cot", "sft", "self_consistency",
                "multiagent_esc"]
ABLATIONS = ["mascot", "mascot_p", "mascot_c"]
ARROW = {True: "↑", False: "↓", None: "–"}


@dataclass
class ReportInputs:
    """Frames are polars."""

    eval_scores: pl.DataFrame
    dialogues: pl.DataFrame | None
    win_rates: pl.DataFrame | None = None  # `stats.win_rates` output
    provenance: dict[str, Any] = field(default_factory=dict)
    champion: dict[str, Any] | Any | None = None  # dict or `champion.Decision`
    methods: list[str] | None = None  # methods expected; those without rows show as n/a
    title: str = "MASCOT evaluation report"
    contexts: pl.DataFrame | None = None  # `contexts` rows (context_id, source, valence, domain)
    paper_results: Path | None = field(default_factory=results_path)  # None: no paper section
    turn_scores: pl.DataFrame | None = None  # `eval_turn_scores` rows (per-persona tables)
    human_ratings: pl.DataFrame | None = None  # `human_ratings` rows (None/empty: not rated)
    human_choices: pl.DataFrame | None = None  # `human_choices` rows
    director_comparison: pl.DataFrame | None = None  # `director_comparison` rows
    stage1: Stage1Figures | None = None  # the verdict section's Stage 1 figures


@dataclass
class ReportResult:
    markdown: Path
    plots: list[Path]
    headline: dict[str, float | None]  # method -> overall score (0-100), None without judge rows


def _methods(data: ReportInputs, scores: pl.DataFrame) -> list[str]:
    found = set(data.methods or [])
    found |= set(scores["method"].drop_nulls().to_list())
    if "method" in data.dialogues.columns:
        found |= set(data.dialogues["method"].drop_nulls().to_list())
    known = [m for m in METHOD_ORDER if m in found]
    return known + sorted(found - set(known))


_table = md_table
_save = save_png


def _num(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _cell(values: list[float], digits: int = 1, centre: float | None = None) -> str:
    """'mean ± std [95% bootstrap CI] (n)' or n/a; `centre` overrides the mean (aggregation)."""
    if not values:
        return "n/a (no rows)"
    mean, std = mean_std(values)
    lo, hi = bootstrap_ci(values)
    c = mean if centre is None else centre
    return f"{c:.{digits}f} ± {std:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}] (n={len(values)})"


def _criteria(judge: pl.DataFrame, level: str) -> list[str]:
    rubric = AGENT_CRITERIA if level == "agent" else COLLECTIVE_CRITERIA
    found = set(judge.filter(pl.col("level") == level)["criterion"].to_list())
    return [c for c in rubric if c in found] + sorted(found - set(rubric))


def _per_dialogue(judge: pl.DataFrame, method: str, level: str, criterion: str) -> list[float]:
    """0-100 values of one criterion, one per dialogue in dialogue_id order (mean over judges
    first; the order fixes which values a seeded bootstrap draws)."""
    sel = judge.filter((pl.col("method") == method) & (pl.col("level") == level)
                       & (pl.col("criterion") == criterion))
    return (sel.group_by("dialogue_id").agg(pl.col("value").mean()).sort("dialogue_id")
            ["value"].to_list())


def _criteria_section(scores, judge, methods, out_dir, plots) -> list[str]:
    lines = ["## Judge scores by criterion (0-100)", ""]
    judges = sorted(judge["judge"].unique().to_list())
    if judge.is_empty():
        return lines + ["n/a (no judge scores in eval_scores)", ""]
    lines += [
        f"Averaged over judges ({', '.join(judges)}) per dialogue; mean ± std [95% bootstrap CI "
        "over dialogues] (n dialogues). Higher is better for every criterion.",
        "",
    ]
    bars: dict[str, list[float]] = {m: [] for m in methods}
    labels = []
    for level in ("agent", "collective"):
        crits = _criteria(judge, level)
        lines += [f"### {level.capitalize()}-level", ""]
        if not crits:
            lines += [f"n/a (no {level}-level judge rows)", ""]
            continue
        rows = []
        for c in crits:
            vals = {m: _per_dialogue(judge, m, level, c) for m in methods}
            rows.append([c] + [_cell(vals[m]) for m in methods])
            labels.append(c)
            for m in methods:
                bars[m].append(float(np.mean(vals[m])) if vals[m] else np.nan)
        lines += _table(["criterion"] + methods, rows)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(8, 1.1 * len(labels)), 4.5))
    ax = fig.add_subplot()
    shown = [m for m in methods if not np.all(np.isnan(bars[m]))]  # no empty legend entries
    width = 0.8 / max(len(shown), 1)
    for k, m in enumerate(shown):
        ax.bar(np.arange(len(labels)) + k * width, bars[m], width, label=m)
    ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels, rotation=30, ha="right")
    ax.set_ylabel("score (0-100)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, ncol=min(len(shown), 5))
    _save(fig, out_dir / "criteria_by_method.png", plots)
    lines += ["![criteria](criteria_by_method.png)", ""]
    rows = []
    for m in methods:
        per_judge = [overall_score(scores.filter(pl.col("judge") == j), m) for j in judges]
        rows.append([m] + [_num(v) if v is not None else "n/a (not scored)" for v in per_judge])
    return lines + ["### Overall by judge", ""] + _table(["method"] + judges, rows)


def _ablation_section(scores: pl.DataFrame, judge: pl.DataFrame, per: pl.DataFrame) -> list[str]:
    lines = [
        "## Ablations: MASCOT vs MASCOT-P (no persona grounding) vs MASCOT-C (random order)",
        "",
    ]
    present = [m for m in ABLATIONS if m in set(judge["method"].to_list())]
    if "mascot" not in present:
        return lines + ["n/a (no judge scores for method mascot)", ""]
    missing = [m for m in ABLATIONS if m not in present]
    items = [(lv, c) for lv in ("agent", "collective") for c in _criteria(judge, lv)]
    rows = []
    for lv, c in items + [("", "overall")]:
        means = {}
        for m in present:
            if c == "overall":
                means[m] = overall_score(scores, m)
            else:
                v = _per_dialogue(judge, m, lv, c)
                means[m] = float(np.mean(v)) if v else None
        row = [f"{lv} / {c}" if lv else "**overall**"]
        for m in ABLATIONS:
            if m not in present:
                row.append("n/a")
            elif m == "mascot" or means[m] is None or means["mascot"] is None:
                row.append(_num(means[m]))
            else:
                col = f"{lv}/{c}" if lv else "overall"
                row.append(f"{means[m]:.1f} (Δ {diff_cell(paired(per, m, col))})")
        rows.append(row)
    lines += _table(["criterion"] + ABLATIONS, rows)
    lines.append("Parentheses: " + PAIRED_NOTE)
    if missing:
        lines.append(f"n/a for {', '.join(missing)}: no judge scores for that method.")
    return lines + [""]


def _mbti_section(per, dialogues, methods, out_dir, plots) -> list[str]:
    lines = ["## Overall score by simulated user profile (MBTI)", ""]
    if per.is_empty() or "user_profile" not in dialogues.columns:
        return lines + ["n/a (no judge scores or no user_profile column)", ""]
    profiles = dialogues.select(pl.col("dialogue_id").cast(pl.String),
                                pl.col("user_profile").cast(pl.String))
    per = per.join(profiles, on="dialogue_id", how="inner").drop_nulls("user_profile")
    if per.is_empty():
        return lines + ["n/a (no scored dialogue has a user profile; meeting mode has none)", ""]
    # methods in report order, profiles a-z; a pair without dialogues is null (NaN in the grid)
    types = sorted(per["user_profile"].unique().to_list())
    wide = per.pivot(on="user_profile", index="method", values="overall", aggregate_function="mean")
    order = [m for m in methods if m in set(wide["method"].to_list())]
    wide = (pl.DataFrame({"method": order}, schema={"method": pl.String})
            .join(wide, on="method", how="left", maintain_order="left").select("method", *types))
    grid = wide.select(types).to_numpy().astype(float)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6, 0.7 * grid.shape[1] + 2), max(2.5, 0.5 * grid.shape[0] + 1.5)))
    ax = fig.add_subplot()
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(grid.shape[1]), types, rotation=45, ha="right")
    ax.set_yticks(range(grid.shape[0]), order)
    for (i, j), v in np.ndenumerate(grid):
        ax.text(j, i, "" if np.isnan(v) else f"{v:.0f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="overall (0-100)")
    _save(fig, out_dir / "mbti_heatmap.png", plots)
    rows = [[m] + [_num(v) for v in row] for m, row in zip(order, grid.tolist(), strict=True)]
    lines += _table(["method"] + [str(c) for c in types], rows)
    return lines + ["![mbti](mbti_heatmap.png)", "n/a cells: no scored dialogue for that pair.", ""]


def _agreement_section(scores: pl.DataFrame) -> list[str]:
    lines = ["## Judge agreement (Spearman rank correlation over shared items)", ""]
    judged = scores.filter(pl.col("level").ne_missing("automatic"))
    judges = sorted(set(judged["judge"].to_list()) - {"metric"})
    if len(judges) < 2:
        only = judges[0] if judges else "none"
        return lines + [f"n/a (needs two judges; only {only} scored)", ""]
    from mascot_dag.lib.judges.agreement import agreement

    # items: one dialogue's value at one level and criterion; failed judgments (NULL) left out
    agr = agreement(judged, ["method", "dialogue_id", "level"])
    rows = [[r["judge_a"], r["judge_b"], r["criterion"], r["n"],
             f"n/a ({r['note']})" if math.isnan(r["rho"]) else f"{r['rho']:.2f}"]
            for r in agr.iter_rows(named=True)]  # fmt: skip
    return lines + _table(["judge A", "judge B", "criterion", "items", "spearman"], rows)


def _direction(name: str, rows: pl.DataFrame) -> bool | None:
    stored = rows["higher_is_better"].drop_nulls().to_list()
    if name in METRICS:
        hib = METRICS[name].higher_is_better
        stored = {bool(v) for v in stored}
        if hib is not None and stored and stored != {hib}:
            raise ValueError(
                f"eval_scores metric {name}: higher_is_better {stored} contradicts "
                f"metrics.METRICS ({hib}); rewrite those rows from the registry"
            )
        return hib
    return bool(stored[0]) if stored else None


def _automatic_section(scores: pl.DataFrame, methods: list[str]) -> list[str]:
    lines = ["## Automatic metrics", ""]
    auto = scores.filter(pl.col("level") == "automatic")
    if auto.is_empty():
        return lines + ["n/a (no automatic metric rows)", ""]
    criteria = set(auto["criterion"].to_list())
    names = [n for n in METRICS if n in criteria]
    names += sorted(criteria - set(names))
    rows = []
    for name in names:
        sel = auto.filter(pl.col("criterion") == name)
        hib = _direction(name, sel)
        cells = []
        for m in methods:
            vals = sel.filter(pl.col("method") == m)["value"].drop_nulls().to_list()
            centre = METRICS[name].aggregation(vals) if name in METRICS and vals else None
            cells.append(_cell(vals, 3, centre) if vals else "n/a (no values)")
        rows.append([f"{name} {ARROW[hib]}"] + cells)
    lines += _table(["metric"] + methods, rows)
    return lines + ["↑ higher is better, ↓ lower is better, – descriptive (not ranked).", ""]


def _winrate_section(wr: pl.DataFrame | None, out_dir, plots) -> list[str]:
    lines = ["## Three-way comparisons: win rates (Wilson 95% CI)", ""]
    if wr is None or wr.is_empty() or wr["appearances"].sum() == 0:
        return lines + ["n/a (no completed comparisons)", ""]
    rows = [[r["method"], f"{r['wins']}/{r['appearances']}", _num(r["win_rate"], 3),
             f"[{_num(r['ci_lo'], 3)}, {_num(r['ci_hi'], 3)}]", _num(r["chance"], 3), r["failed"]]
            for r in wr.iter_rows(named=True)]  # fmt: skip
    lines += _table(["method", "wins", "win rate", "95% CI", "chance", "judge failed"], rows)
    from matplotlib.figure import Figure

    ok = wr.filter(pl.col("appearances") > 0)
    fig = Figure(figsize=(max(5, 0.9 * len(ok)), 3.5))
    ax = fig.add_subplot()
    rate = ok["win_rate"].to_numpy()
    err = np.vstack([rate - ok["ci_lo"].to_numpy(), ok["ci_hi"].to_numpy() - rate])
    ax.bar(ok["method"].to_list(), rate, yerr=err, capsize=4, color="tab:blue")
    ax.axhline(float(ok["chance"].mean()), color="grey", ls="--", label="chance")
    ax.set_ylim(0, 1)
    ax.set_ylabel("win rate")
    ax.legend()
    _save(fig, out_dir / "win_rates.png", plots)
    return lines + ["![win rates](win_rates.png)", ""]


def _bullets(d: dict[str, Any], indent: int = 0) -> list[str]:
    out = []
    for k, v in d.items():
        pad = "  " * indent
        if isinstance(v, dict):
            out += [f"{pad}- **{k}**:"] + _bullets(v, indent + 1)
        elif isinstance(v, list | tuple):
            out.append(f"{pad}- **{k}**: {', '.join(str(x) for x in v) or 'n/a (empty)'}")
        else:
            out.append(f"{pad}- **{k}**: {'n/a' if v is None else v}")
    return out


def build_report(data: ReportInputs, out_dir: Path) -> ReportResult:
    """Write `report.md` and its PNGs into out_dir; return their paths and the headline numbers."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    scores = data.eval_scores
    # the columns the report reads, in that order; an absent one is all null (an empty input has
    # none); a NaN value is a missing value too
    scores = scores.with_columns(pl.lit(None).alias(c) for c in SCORE_COLUMNS
                                 if c not in scores.columns).select(SCORE_COLUMNS)
    scores = scores.with_columns(pl.col("value").cast(pl.Float64).fill_nan(None))
    dialogues = data.dialogues if data.dialogues is not None else pl.DataFrame()
    data = dataclasses.replace(data, eval_scores=scores, dialogues=dialogues,
                               provenance=data.provenance or {})
    methods = _methods(data, scores)
    judge = judge_rows_100(scores)
    plots: list[Path] = []
    headline = {m: overall_score(scores, m) for m in methods}
    per = dialogue_overall(scores)
    items = per_dialogue_items(judge, dialogues)
    rubrics = {"agent": AGENT_CRITERIA, "collective": COLLECTIVE_CRITERIA}
    champ = asdict(data.champion) if is_dataclass(data.champion) else data.champion
    lines = [f"# {data.title}", "",
             *verdict_section(data.stage1, data.director_comparison, champ),
             "## Overall score by method (0-100)", "",
             "Mean of the per-criterion means of all agent-level and collective judge criteria "
             "(see `mascot_dag/lib/evaluation/champion.py`); CI: bootstrap over dialogues. Last "
             "column: "
             + PAIRED_NOTE, ""]  # fmt: skip
    rows = []
    for m in methods:
        vals = per.filter(pl.col("method") == m)["overall"].to_list()
        delta = "–" if m == "mascot" else diff_cell(paired(items, m))
        rows.append([m, _num(headline[m]), _cell(vals) if vals else "n/a (no judge rows)", delta])
    lines += _table(["method", "overall", "per-dialogue mean ± std [CI] (n)",
                     "Δ mascot − method [95% CI] (n)"], rows)
    lines += [f"`{m}`: {METHOD_LABELS[m]}." for m in methods if m in METHOD_LABELS] + [""]
    lines += paired_section(items, methods, rubrics)
    lines += _criteria_section(scores, judge, methods, out_dir, plots)
    lines += _ablation_section(scores, judge, items)
    lines += condition_section(items, data.contexts, methods, rubrics)
    lines += breakdown_section(items, data.contexts, methods, rubrics)
    published = published_table(data.paper_results) if data.paper_results else None
    lines += paper_section(items, data.contexts, published, out_dir, plots)
    lines += _mbti_section(per, dialogues, methods, out_dir, plots)
    lines += persona_mbti_section(data.turn_scores, dialogues, out_dir, plots)
    lines += _agreement_section(scores)
    lines += _automatic_section(scores, methods)
    lines += _winrate_section(data.win_rates, out_dir, plots)
    lines += human_section(data.human_ratings, data.human_choices, scores, methods)
    lines += director_section(data.director_comparison)
    lines += ["## Provenance", ""]
    lines += (_bullets(data.provenance) or ["n/a (no provenance given)"]) + [""]
    lines += champion_section(champ, _num, _bullets)
    md = out_dir / "report.md"
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return ReportResult(md, plots, headline)
