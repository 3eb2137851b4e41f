"""Report sections of the paper's evaluation layout: in-domain vs out-of-domain, and the agent
persona x simulated-user (MBTI) table.

- Condition: a context's split says it (lib/split.py): `eval` = in-domain (its valence/domain was
  trained on), `ood` = out-of-domain (held out by settings `ood_valences` / `ood_domains`). Per
  condition, per level, the same table as the valence/domain breakdown: means, n dialogues and the
  paired Δ to MASCOT with its cluster-bootstrap CI (report_sections.paired).
- Persona x MBTI: agent-level scores per agent TURN (`eval_turn_scores`), mean over judges per
  turn, then the mean per (speaking persona, user's MBTI type) for one method, with n turns per
  cell. A dialogue mixes personas, so dialogue means (eval_scores) cannot give this table.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from mascot_dag.lib.report_sections import (
    OVERALL,
    PAIRED_NOTE,
    REF,
    _items,
    _mean,
    diff_cell,
    item,
    md_table,
    paired,
    save_png,
)
from mascot_dag.lib.split import IN_DOMAIN, OUT_OF_DOMAIN, condition_of_split
from mascot_dag.lib.types import AGENT_CRITERIA, to_100

CONDITION_TITLES = {IN_DOMAIN: "In-domain", OUT_OF_DOMAIN: "Out-of-domain (held out)"}


def context_conditions(per: pd.DataFrame, contexts: pd.DataFrame | None) -> pd.Series:
    """Condition per row of `per` (by its context's split); NaN when the split is unknown."""
    if contexts is None or contexts.empty or not {"context_id", "split"} <= set(contexts.columns):
        return pd.Series(np.nan, index=per.index, dtype=object)
    cond = {c: condition_of_split(s) for c, s in zip(contexts["context_id"], contexts["split"],
                                                     strict=True)}
    return per["context_id"].map(cond)


def condition_section(per: pd.DataFrame, contexts: pd.DataFrame | None, methods: list[str],
                      rubrics: dict[str, Iterable[str]]) -> list[str]:
    """Agent-level and collective tables per condition, paired Δ to MASCOT with CI and n."""
    lines = ["## In-domain vs out-of-domain", ""]
    if per.empty:
        return lines + ["n/a (no judge scores)", ""]
    cond = context_conditions(per, contexts)
    if not (cond == OUT_OF_DOMAIN).any():
        return lines + ["n/a (no out-of-domain dialogues: the OOD condition is off, settings "
                        "`ood_valences` / `ood_domains` are empty; every eval context is "
                        "in-domain)", ""]
    held = ""
    if contexts is not None and "split" in contexts.columns:
        ood = contexts[contexts["split"] == "ood"]
        vals = sorted(ood.loc[ood["source"] == "empatheticdialogues", "valence"].dropna().unique())
        doms = sorted(ood.loc[ood["source"] == "qmsum", "domain"].dropna().unique())
        held = f" Held out: ED valences {vals or 'none'}, QMSum domains {doms or 'none'}."
    lines += ["Out-of-domain contexts were never trained on (split `ood`)." + held
              + " Cells: mean over dialogues (0-100). Last column: " + PAIRED_NOTE, ""]
    for c in (IN_DOMAIN, OUT_OF_DOMAIN):
        sub = per[cond == c]
        if sub.empty:
            lines += [f"### {CONDITION_TITLES[c]}", "", "n/a (no scored dialogues)", ""]
            continue
        for level, rubric in rubrics.items():
            crits = _items(sub, level, rubric)
            if not crits:
                continue
            cols = [item(level, x) for x in crits] + [item(level, OVERALL)]
            rows = []
            for m in methods:
                mine = sub[sub["method"] == m]
                if mine.empty:
                    continue
                delta = "–" if m == REF else diff_cell(paired(sub, m, item(level, OVERALL)))
                rows.append([m, len(mine)] + [_mean(mine[x]) for x in cols] + [delta])
            lines += [f"### {CONDITION_TITLES[c]}: {level}-level", ""]
            lines += md_table(["method", "dialogues"] + crits + [OVERALL, f"Δ {level} overall"],
                              rows)
    return lines


def persona_mbti_table(turn_scores: pd.DataFrame, dialogues: pd.DataFrame, method: str = REF,
                       criterion: str = "consistency") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(mean 0-100, n turns) per (persona, user MBTI type) for `method`.

    `criterion` = an agent-level criterion, or "overall" = the mean of the agent criteria of a
    turn. Turns of dialogues without a user profile (meeting mode) are left out; failed
    judgments (NULL) are left out of the means and of n.
    """
    empty = pd.DataFrame()
    need = {"method", "dialogue_id", "turn_idx", "speaker", "judge", "criterion", "value"}
    if turn_scores is None or turn_scores.empty or not need <= set(turn_scores.columns):
        return empty, empty
    if dialogues is None or "user_profile" not in dialogues.columns:
        return empty, empty
    ts = turn_scores[turn_scores["method"] == method].dropna(subset=["value"])
    if criterion == OVERALL:
        ts = ts[ts["criterion"].isin(AGENT_CRITERIA)]
    else:
        ts = ts[ts["criterion"] == criterion]
    if ts.empty:
        return empty, empty
    keys = ["dialogue_id", "turn_idx", "speaker"]
    # per turn: mean over judges per criterion, then (overall) over criteria
    per_turn = ts.groupby([*keys, "criterion"])["value"].mean().groupby(keys).mean()
    per_turn = per_turn.map(to_100).rename("value").reset_index()
    per_turn = per_turn.merge(dialogues[["dialogue_id", "user_profile"]], on="dialogue_id")
    per_turn = per_turn.dropna(subset=["user_profile"])
    if per_turn.empty:
        return empty, empty
    means = per_turn.pivot_table(index="speaker", columns="user_profile", values="value",
                                 aggfunc="mean")
    counts = per_turn.pivot_table(index="speaker", columns="user_profile", values="value",
                                  aggfunc="count").reindex_like(means).fillna(0).astype(int)
    return means, counts


def persona_mbti_section(turn_scores: pd.DataFrame | None, dialogues: pd.DataFrame,
                         out_dir: Path, plots: list[Path], method: str = REF) -> list[str]:
    """The paper's heatmap: mean consistency per (agent persona, simulated-user MBTI type)."""
    lines = [f"## Persona x simulated user (MBTI): {method}, agent-level (0-100)", ""]
    cons, n = persona_mbti_table(turn_scores, dialogues, method, "consistency")
    if cons.empty:
        return lines + [f"n/a (no per-turn agent scores of {method} in support-mode dialogues: "
                        "eval_turn_scores empty or no user_profile)", ""]
    overall, n_all = persona_mbti_table(turn_scores, dialogues, method, OVERALL)
    lines += ["Per agent turn: mean over judges; cells: mean over that persona's turns with "
              "users of that type (n turns). n/a: no such turn.", ""]
    for title, means, counts in (("Consistency", cons, n), ("Agent-level overall", overall, n_all)):
        cols = [str(c) for c in means.columns]
        rows = [[p] + [f"{means.loc[p, c]:.1f} ({counts.loc[p, c]})"
                       if not np.isnan(means.loc[p, c]) else "n/a" for c in means.columns]
                for p in means.index]
        lines += [f"### {title}", ""] + md_table(["persona"] + cols, rows)
    from matplotlib.figure import Figure

    grid = cons.to_numpy(dtype=float)
    fig = Figure(figsize=(max(6, 0.7 * grid.shape[1] + 2), max(2.5, 0.5 * grid.shape[0] + 1.5)))
    ax = fig.add_subplot()
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(grid.shape[1]), [str(c) for c in cons.columns], rotation=45, ha="right")
    ax.set_yticks(range(grid.shape[0]), list(cons.index))
    for (i, j), v in np.ndenumerate(grid):
        if not np.isnan(v):
            ax.text(j, i, f"{v:.0f}\nn={n.iloc[i, j]}", ha="center", va="center", fontsize=6)
    ax.set_title(f"{method}: consistency by persona and user MBTI type", fontsize=9)
    fig.colorbar(im, ax=ax, label="consistency (0-100)")
    save_png(fig, out_dir / "persona_mbti_heatmap.png", plots)
    return lines + ["![persona x mbti](persona_mbti_heatmap.png)", ""]
