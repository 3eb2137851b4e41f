"""The report's first section: did training work? In plain words, each claim with its figure, CI
and n, and a line that says when n is too small to conclude anything.

- Stage 1: the probe panel's verdict (lib/stage1/panel.py: a persona effect counts when every
  valid reader sees it), the reward model's held-out accuracy, and each adapter's GRPO reward
  from its first to its last logged step;
- Stage 2: the trained director against the base director (director_comparison, group reward);
- the champion decision (lib/evaluation/champion.py).

Everything missing reads "not measured" with what to run; nothing here decides anything, it
restates what the gates decided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from mascot_dag.lib.evaluation.stats import MIN_CLUSTERS_FOR_SIGNIFICANCE
from mascot_dag.lib.training.common import SMOKE_TEST_STEPS


@dataclass
class Stage1Figures:
    """What Stage 1 measured, gathered by the report asset (None: not measured)."""

    probe: Any = None  # panel.PanelVerdict of the adapters the evaluation used
    probe_error: str = ""  # why there is no probe verdict
    reward_model: dict[str, float] = field(default_factory=dict)  # heldout_accuracy, _lo, _hi
    rewards: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # persona ->
    # (first, last, steps) of the GRPO reward curve


def _pts(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 100:+.1f}"


def stage1_lines(s1: Stage1Figures | None) -> list[str]:
    if s1 is None:
        return ["- **Stage 1 (persona alignment)**: not measured in this report."]
    lines = []
    v = s1.probe
    if v is None:
        lines.append(f"- **Stage 1, persona probe**: no verdict ({s1.probe_error or 'no probe'}).")
    else:
        established = ", ".join(v.established) or "none"
        said = "the adapters made the roster more recognisable" if v.passed else (
            "no persona effect is established")
        lines.append(
            f"- **Stage 1, persona probe**: {said}. Most conservative valid reader "
            f"({v.reader or 'none'}): {_pts(v.gain)} points [{_pts(v.lo)}, {_pts(v.hi)}], "
            f"n = {v.n_units} paired units on {v.n_contexts} held-out contexts; established "
            f"under every valid reader: {established}"
            + (f"; significantly worse: {', '.join(v.worse)}" if v.worse else "")
            + (f"; readers that do not count (below the accuracy bar): {', '.join(v.invalid)}"
               if v.invalid else "") + ".")
    rm = s1.reward_model
    if rm.get("heldout_accuracy") is not None and not math.isnan(rm["heldout_accuracy"]):
        lines.append(
            f"- **Stage 1, reward model**: held-out pair accuracy {rm['heldout_accuracy']:.2f} "
            f"[{rm.get('heldout_accuracy_lo', math.nan):.2f}, "
            f"{rm.get('heldout_accuracy_hi', math.nan):.2f}] (chance 0.50).")
    else:
        lines.append("- **Stage 1, reward model**: held-out accuracy not measured.")
    if s1.rewards:
        steps = max(n for _, _, n in s1.rewards.values())
        per = "; ".join(f"{p} {a:.2f} -> {b:.2f}" for p, (a, b, _) in sorted(s1.rewards.items()))
        smoke = (f" Only {steps} logged steps: a smoke test, not training; the curve's ends are "
                 "noise." if steps < SMOKE_TEST_STEPS else "")
        lines.append(f"- **Stage 1, GRPO reward** (first -> last step): {per}.{smoke}")
    return lines


def stage2_lines(director_rows: pl.DataFrame | None) -> list[str]:
    from mascot_dag.lib.stage2.director_eval import summarise

    if director_rows is None or director_rows.is_empty():
        return ["- **Stage 2 (director)**: not measured (materialise director_comparison)."]
    row = summarise(director_rows).filter(pl.col("metric") == "group_reward").row(0, named=True)
    if not row["n_units"]:
        return ["- **Stage 2 (director)**: no paired units of the trained and base director."]
    if row["lo"] > 0 and row["n_contexts"] >= MIN_CLUSTERS_FOR_SIGNIFICANCE:
        said = "the trained director raised the group reward"
    elif row["hi"] < 0 and row["n_contexts"] >= MIN_CLUSTERS_FOR_SIGNIFICANCE:
        said = "the trained director LOWERED the group reward"
    else:
        said = "no difference established between the trained and the base director"
    return [f"- **Stage 2 (director)**: {said}: group reward {row['base']:.3f} -> "
            f"{row['trained']:.3f}, Δ {row['delta']:+.3f} [{row['lo']:+.3f}, {row['hi']:+.3f}], "
            f"n = {row['n_units']} units on {row['n_contexts']} contexts."]


def champion_lines(champ: dict[str, Any] | None) -> list[str]:
    if not champ:
        return ["- **Champion**: no decision given."]
    if champ.get("promote"):
        said = "promoted: chat and serve now use these versions"
    elif champ.get("rule") == "first_run_vs_zero_shot":
        said = "no champion yet (nothing promoted): chat falls back to the latest or base"
    else:
        said = "the current champion stays"
    return [f"- **Champion**: {said}. {champ.get('reason', '')}".rstrip()]


def small_n_line(champ: dict[str, Any] | None, s1: Stage1Figures | None) -> list[str]:
    """One line when the sizes cannot support a conclusion, naming them."""
    sizes = []
    if champ and champ.get("n_contexts", 0) < max(champ.get("min_contexts", 0),
                                                   MIN_CLUSTERS_FOR_SIGNIFICANCE):
        sizes.append(f"{champ.get('n_contexts', 0)} paired evaluation contexts")
    probe = s1.probe if s1 else None
    if probe is not None and probe.n_contexts < MIN_CLUSTERS_FOR_SIGNIFICANCE:
        sizes.append(f"{probe.n_contexts} probe contexts")
    if not sizes:
        return []
    return [f"- **Too small to conclude anything**: {' and '.join(sizes)} (at least "
            f"{MIN_CLUSTERS_FOR_SIGNIFICANCE} are needed for a CI to mean something). This run "
            "shows that the lineage works, not whether MASCOT does: run the study profile "
            "(`mascot demo --profile study`) for an answer."]


def verdict_section(s1: Stage1Figures | None, director_rows: pl.DataFrame | None,
                    champ: dict[str, Any] | None) -> list[str]:
    """'## Verdict: did training work?' (module doc)."""
    return (["## Verdict: did training work?", ""] + small_n_line(champ, s1) + stage1_lines(s1)
            + stage2_lines(director_rows) + champion_lines(champ) + [""])


def champion_section(champ: dict[str, Any] | None, num, bullets) -> list[str]:
    """'## Champion decision': the gate's rule, figures and every field of its decision
    (`num`, `bullets`: the report's number and bullet formats)."""
    lines = ["## Champion decision", ""]
    if not champ:
        return lines + ["n/a (no champion decision given)"]
    verdict = "promote" if champ.get("promote") else (
        "keep current champion" if champ.get("rule") == "vs_champion" else "no champion yet")
    lines += [f"**Decision:** {verdict}", "", f"{champ.get('reason', 'n/a (no reason)')}", ""]
    if champ.get("comparator"):
        lines += [f"**Gate:** mascot − {champ['comparator']} = {num(champ.get('diff'), 2)} "
                  f"[95% CI {num(champ.get('ci_lo'), 2)}, {num(champ.get('ci_hi'), 2)}], "
                  f"n = {champ.get('n_contexts', 0)} paired contexts, promote only if the CI "
                  f"lies above {champ.get('margin', 0):g}", ""]
    return lines + bullets({k: v for k, v in champ.items() if k not in ("promote", "reason")})
