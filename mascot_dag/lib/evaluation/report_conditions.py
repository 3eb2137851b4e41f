"""Report sections of the paper's evaluation layout: in-domain vs out-of-domain, and the agent
persona x simulated-user (MBTI) table.

- Condition: a context's split says it (lib/data/split.py): `eval` = in-domain (its valence/domain
was
  trained on), `ood` = out-of-domain (held out by settings `ood_valences` / `ood_domains`). Per
  condition, per level, the same table as the valence/domain breakdown: means, n dialogues and the
  paired Δ to MASCOT with its cluster-bootstrap CI (report_sections.paired).
- Persona x MBTI: agent-level scores per agent TURN (`eval_turn_scores`), mean over judges per
  turn, then the mean per (speaking persona, user's MBTI type) for one method, with n turns per
  cell. A dialogue mixes personas, so dialogue means (eval_scores) cannot give this table.

Frames are polars; missing values are nulls.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import polars as pl

from mascot_dag.lib.data.split import IN_DOMAIN, OUT_OF_DOMAIN, condition_of_split
from mascot_dag.lib.evaluation.report_sections import (
    OVERALL,
    PAIRED_NOTE,
    REF,
    diff_cell,
    item,
    md_table,
    mean_cell,
    paired,
    rubric_columns,
    save_png,
)
from mascot_dag.lib.types import AGENT_CRITERIA, to_100

CONDITION_TITLES = {IN_DOMAIN: "In-domain", OUT_OF_DOMAIN: "Out-of-domain (held out)"}


def context_conditions(per: pl.DataFrame, contexts: pl.DataFrame | None) -> pl.Series:
    """Condition per row of `per` (by its context's split); null when the split is unknown."""
    cond: dict[str, str | None] = {}
    if contexts is not None and {"context_id", "split"} <= set(contexts.columns):
        cond = {c: condition_of_split(s) for c, s in zip(
            contexts["context_id"].to_list(), contexts["split"].to_list(), strict=True)}
    return pl.Series("condition", [cond.get(c) for c in per["context_id"].to_list()],
                     dtype=pl.String)


def condition_section(per: pl.DataFrame, contexts: pl.DataFrame | None, methods: list[str],
                      rubrics: dict[str, Iterable[str]]) -> list[str]:
    """Agent-level and collective tables per condition, paired Δ to MASCOT with CI and n."""
    lines = ["## In-domain vs out-of-domain", ""]
    if per.is_empty():
        return lines + ["n/a (no judge scores)", ""]
    cond = context_conditions(per, contexts)
    if not (cond == OUT_OF_DOMAIN).any():
        return lines + ["n/a (no out-of-domain dialogues: the OOD condition is off, settings "
                        "`ood_valences` / `ood_domains` are empty; every eval context is "
                        "in-domain)", ""]
    held = ""
    if contexts is not None and "split" in contexts.columns:
        ood = contexts.filter(pl.col("split") == "ood")

        def held_out(source: str, column: str) -> list[str]:
            return sorted(ood.filter(pl.col("source") == source)[column].drop_nulls()
                          .unique().to_list())

        vals, doms = held_out("empatheticdialogues", "valence"), held_out("qmsum", "domain")
        held = f" Held out: ED valences {vals or 'none'}, QMSum domains {doms or 'none'}."
    lines += ["Out-of-domain contexts were never trained on (split `ood`)." + held
              + " Cells: mean over dialogues (0-100). Last column: " + PAIRED_NOTE, ""]
    for c in (IN_DOMAIN, OUT_OF_DOMAIN):
        sub = per.filter(cond == c)
        if sub.is_empty():
            lines += [f"### {CONDITION_TITLES[c]}", "", "n/a (no scored dialogues)", ""]
            continue
        for level, rubric in rubrics.items():
            crits = rubric_columns(sub, level, rubric)
            if not crits:
                continue
            cols = [item(level, x) for x in crits] + [item(level, OVERALL)]
            rows = []
            for m in methods:
                mine = sub.filter(pl.col("method") == m)
                if mine.is_empty():
                    continue
                delta = "–" if m == REF else diff_cell(paired(sub, m, item(level, OVERALL)))
                rows.append([m, mine.height] + [mean_cell(mine[x]) for x in cols] + [delta])
            lines += [f"### {CONDITION_TITLES[c]}: {level}-level", ""]
            lines += md_table(["method", "dialogues"] + crits + [OVERALL, f"Δ {level} overall"],
                              rows)
    return lines


def persona_mbti_table(turn_scores: pl.DataFrame | None, dialogues: pl.DataFrame | None,
                       method: str = REF, criterion: str = "consistency"
                       ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(mean 0-100, n turns) per (persona, user MBTI type) for `method`: two frames with a
    `speaker` column (personas a-z) and one column per MBTI type (a-z); a pair without turns is
    null in the means and 0 in the counts. Both are empty (no columns) when nothing qualifies.

    `criterion` = an agent-level criterion, or "overall" = the mean of the agent criteria of a
    turn. Turns of dialogues without a user profile (meeting mode) are left out; failed
    judgments (NULL) are left out of the means and of n.
    """
    empty = pl.DataFrame()
    need = {"method", "dialogue_id", "turn_idx", "speaker", "judge", "criterion", "value"}
    if turn_scores is None or dialogues is None:
        return empty, empty
    if turn_scores.is_empty() or not need <= set(turn_scores.columns):
        return empty, empty
    if "user_profile" not in dialogues.columns:
        return empty, empty
    ts = (turn_scores.filter(pl.col("method") == method)
          .with_columns(pl.col("value").cast(pl.Float64).fill_nan(None)).drop_nulls("value"))
    if criterion == OVERALL:
        ts = ts.filter(pl.col("criterion").is_in(AGENT_CRITERIA))
    else:
        ts = ts.filter(pl.col("criterion") == criterion)
    if ts.is_empty():
        return empty, empty
    keys = ["dialogue_id", "turn_idx", "speaker"]
    # per turn: mean over judges per criterion, then (overall) over criteria
    per_turn = (ts.group_by(*keys, "criterion").agg(pl.col("value").mean())
                .group_by(keys).agg(to_100(pl.col("value").mean())))
    profiles = dialogues.select(pl.col("dialogue_id").cast(pl.String),
                                pl.col("user_profile").cast(pl.String))
    per_turn = (per_turn.with_columns(pl.col("dialogue_id").cast(pl.String))
                .join(profiles, on="dialogue_id").drop_nulls("user_profile"))
    if per_turn.is_empty():
        return empty, empty
    cells = per_turn.group_by("speaker", "user_profile").agg(
        mean=pl.col("value").mean(), n=pl.len())
    types = sorted(cells["user_profile"].unique().to_list())

    def wide(value: str) -> pl.DataFrame:
        grid = cells.pivot(on="user_profile", index="speaker", values=value,
                           aggregate_function="first")
        return grid.select("speaker", *types).sort("speaker")

    counts = wide("n").with_columns(pl.col(types).fill_null(0).cast(pl.Int64))
    return wide("mean"), counts


def persona_mbti_section(turn_scores: pl.DataFrame | None, dialogues: pl.DataFrame,
                         out_dir: Path, plots: list[Path], method: str = REF) -> list[str]:
    """The paper's heatmap: mean consistency per (agent persona, simulated-user MBTI type)."""
    lines = [f"## Persona x simulated user (MBTI): {method}, agent-level (0-100)", ""]
    cons, n = persona_mbti_table(turn_scores, dialogues, method, "consistency")
    if cons.is_empty():
        return lines + [f"n/a (no per-turn agent scores of {method} in support-mode dialogues: "
                        "eval_turn_scores empty or no user_profile)", ""]
    overall, n_all = persona_mbti_table(turn_scores, dialogues, method, OVERALL)
    lines += ["Per agent turn: mean over judges; cells: mean over that persona's turns with "
              "users of that type (n turns). n/a: no such turn.", ""]
    for title, means, counts in (("Consistency", cons, n), ("Agent-level overall", overall, n_all)):
        cols = means.columns[1:]  # after `speaker`
        rows = [[p] + [f"{v:.1f} ({k})" if v is not None else "n/a" for v, k in zip(
                    vals, n_row, strict=True)]
                for p, vals, n_row in zip(means["speaker"].to_list(), means.select(cols).rows(),
                                          counts.select(cols).rows(), strict=True)]
        lines += [f"### {title}", ""] + md_table(["persona"] + cols, rows)
    from matplotlib.figure import Figure

    types = cons.columns[1:]
    grid = cons.select(types).to_numpy().astype(float)  # null -> NaN
    fig = Figure(figsize=(max(6, 0.7 * grid.shape[1] + 2), max(2.5, 0.5 * grid.shape[0] + 1.5)))
    ax = fig.add_subplot()
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(grid.shape[1]), types, rotation=45, ha="right")
    ax.set_yticks(range(grid.shape[0]), cons["speaker"].to_list())
    counts = n.select(types).to_numpy()
    for (i, j), v in np.ndenumerate(grid):
        if not np.isnan(v):
            ax.text(j, i, f"{v:.0f}\nn={counts[i, j]}", ha="center", va="center", fontsize=6)
    ax.set_title(f"{method}: consistency by persona and user MBTI type", fontsize=9)
    fig.colorbar(im, ax=ax, label="consistency (0-100)")
    save_png(fig, out_dir / "persona_mbti_heatmap.png", plots)
    return lines + ["![persona x mbti](persona_mbti_heatmap.png)", ""]
