"""Trained vs base director on the same dialogue states and seeds (Stage 2's own measurement).

A unit is one (held-out context, seed): the dialogue's opening state, its user profile and every
sampling seed are the same under both arms; only the director differs (`director_adapter` None =
the base model). Each arm runs the unit's dialogue for `n_agent_turns` agent turns with the same
aligned persona adapters (`lib.dialogue.run_dialogues`), so the first decision is made on the
identical state and later ones on the states each director led to (that is the point: a director
is judged by the dialogue it produces). Per unit and arm (`unit_row`):

- valid_first: share of decisions whose FIRST output was a valid directive (status ok);
- retry_rate / fallback_rate: share valid only after the repair retry / never valid (fallback);
- distinct_speakers, speaker_entropy (bits): who the director let speak across the agent turns;
- group_reward: the group judge's collective score of the dialogue's N-turn blocks, mapped to 0-1
  exactly as the director's GRPO reward (`director_reward.block_reward`), mean over blocks.

`summarise` pairs the arms per unit (trained - base) and puts a bootstrap CI on each mean
difference that resamples CONTEXTS (`stats.paired_cluster_bootstrap`: seeds of one context share
it), with n units and n contexts. Directions sit next to the metrics (lm-eval-harness style).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import polars as pl

from mascot_dag.lib.dialogue.engine import blocks, run_dialogues
from mascot_dag.lib.dialogue.spec import DialogueConfig, DialogueRecord, DialogueSpec
from mascot_dag.lib.evaluation.metrics import speaker_entropy
from mascot_dag.lib.evaluation.stats import (
    MIN_CLUSTERS_FOR_SIGNIFICANCE,
    paired_cluster_bootstrap,
    significance_mark,
)
from mascot_dag.lib.judges.base import BlockItem
from mascot_dag.lib.stage2.director_reward import block_reward

# name -> (higher_is_better, what it is)
METRICS: dict[str, tuple[bool, str]] = {
    "valid_first": (True, "valid directive on the first try (share of decisions)"),
    "retry_rate": (False, "valid only after the repair retry (share)"),
    "fallback_rate": (False, "never valid: the fallback rule chose (share)"),
    "distinct_speakers": (True, "distinct agents over the dialogue's agent turns"),
    "speaker_entropy": (True, "entropy of the agent-speaker distribution (bits)"),
    "group_reward": (True, "group judge, collective rubric, 0-1 (the GRPO reward's scale)"),
}
ARMS = ("base", "trained")
ROW_COLUMNS = ["dialogue_id", "context_id", "mode", "seed", "arm", "director", "decisions",
               "ok_first", "retried", "fallback", *METRICS, "blocks", "speakers", "statuses"]
SUMMARY_COLUMNS = ["metric", "higher_is_better", "base", "trained", "delta", "lo", "hi", "mark",
                   "p_two_sided", "n_units", "n_contexts"]
ROW_SCHEMA = {**{c: pl.String for c in ROW_COLUMNS},
              **{c: pl.Int64 for c in ("seed", "decisions", "ok_first", "retried", "fallback",
                                       "blocks")},
              **{m: pl.Float64 for m in METRICS}}
SUMMARY_SCHEMA = dict(zip(SUMMARY_COLUMNS, [pl.String, pl.Boolean, *[pl.Float64] * 5, pl.String,
                                            pl.Float64, pl.Int64, pl.Int64], strict=True))


def unit_row(rec: DialogueRecord, arm: str, director: str, block_scores: list[list[Any]]) -> dict:
    """The `director_comparison` row of one unit under one arm. `block_scores`: the judge's
    scores of each of the dialogue's blocks (NaN reward when the judge failed every block)."""
    if arm not in ARMS:
        raise ValueError(f"{rec.dialogue['dialogue_id']}: arm must be one of {ARMS}, got {arm!r}")
    statuses = [d["status"] for d in sorted(rec.directives, key=lambda d: d["turn_idx"])]
    speakers = [t["speaker"] for t in rec.turns if t["role"] == "agent"]
    n = len(statuses)
    count = Counter(statuses)
    unknown = set(count) - {"ok", "retried", "fallback"}
    if unknown:
        raise ValueError(f"{rec.dialogue['dialogue_id']}: unknown directive status {unknown}")
    rewards = [r for r in (block_reward(s) for s in block_scores) if r is not None]
    return {
        "dialogue_id": rec.dialogue["dialogue_id"], "context_id": rec.dialogue["context_id"],
        "mode": rec.dialogue["mode"], "seed": int(rec.dialogue["seed"]), "arm": arm,
        "director": director, "decisions": n, "ok_first": count["ok"],
        "retried": count["retried"], "fallback": count["fallback"],
        "valid_first": count["ok"] / n if n else math.nan,
        "retry_rate": count["retried"] / n if n else math.nan,
        "fallback_rate": count["fallback"] / n if n else math.nan,
        "distinct_speakers": float(len(set(speakers))),
        "speaker_entropy": speaker_entropy(speakers),
        "group_reward": sum(rewards) / len(rewards) if rewards else math.nan,
        "blocks": len(block_scores),
        "speakers": json.dumps(speakers), "statuses": json.dumps(statuses),
    }


def judge_records(records: list[DialogueRecord], specs: dict[str, DialogueSpec], judge,
                  block_size: int) -> list[list[list[Any]]]:
    """Per record, the judge's collective scores of each of its N-turn blocks (one judge call)."""
    items, owner = [], []
    for r, rec in enumerate(records):
        spec = specs[rec.dialogue["dialogue_id"]]
        for block in blocks(rec.turns, block_size):
            turns = [{"speaker": t["speaker"], "text": t["text"]} for t in block]
            items.append(BlockItem(spec.context.text, spec.roster, turns))
            owner.append(r)
    out: list[list[list[Any]]] = [[] for _ in records]
    for r, scores in zip(owner, judge.score_blocks(items) if items else [], strict=True):
        out[r].append(scores)
    return out


def run_comparison(specs: list[DialogueSpec], generate, config: DialogueConfig,
                   trained_adapter: str, judge, block_size: int) -> pl.DataFrame:
    """Both arms on the same specs (same ids, seeds, users, persona adapters): the rows."""
    if not trained_adapter:
        raise ValueError("director comparison needs a trained director adapter name")
    rows = []
    by_id = {s.dialogue_id: s for s in specs}
    for arm, adapter in (("base", None), ("trained", trained_adapter)):
        arm_config = replace(config, speaker_policy="director", director_adapter=adapter)
        records = run_dialogues(specs, generate, arm_config, stage="director_comparison",
                                method=f"director_{arm}")
        scored = judge_records(records, by_id, judge, block_size)
        rows += [unit_row(rec, arm, adapter or "base", sc)
                 for rec, sc in zip(records, scored, strict=True)]
    # an undefined metric (NaN) is stored as NULL
    return pl.DataFrame(rows, schema=ROW_SCHEMA).with_columns(
        pl.col(m).fill_nan(None) for m in METRICS)


def summarise(rows: pl.DataFrame, n_boot: int = 2000, seed: int = 0) -> pl.DataFrame:
    """Per metric: arm means over the paired units, trained - base with a context-clustered
    bootstrap CI, '*' when it excludes 0, n units and n contexts."""
    keys = ["dialogue_id", "context_id"]
    rows = rows.with_columns(pl.col(m).cast(pl.Float64).fill_nan(None) for m in METRICS)

    def arm(name: str, suffix: str) -> pl.DataFrame:
        return rows.filter(pl.col("arm") == name).select(
            *keys, *(pl.col(m).alias(m + suffix) for m in METRICS))

    both = arm("base", "_b").join(arm("trained", "_t"), on=keys, how="inner",
                                  maintain_order="left")
    out = []
    for metric, (higher, _) in METRICS.items():
        pair = both.select(f"{metric}_b", f"{metric}_t", "context_id").drop_nulls()
        diff = (pair[f"{metric}_t"] - pair[f"{metric}_b"]).to_list()
        r = paired_cluster_bootstrap(pair["context_id"].to_list(), diff, n=n_boot, seed=seed)
        out.append([metric, higher,
                    float(pair[f"{metric}_b"].mean()) if len(pair) else math.nan,
                    float(pair[f"{metric}_t"].mean()) if len(pair) else math.nan,
                    r["mean"], r["lo"], r["hi"],
                    significance_mark(r["lo"], r["hi"], r["n_clusters"]),
                    r["p_two_sided"], int(r["n_units"]), int(r["n_clusters"])])
    return pl.DataFrame(out, schema=SUMMARY_SCHEMA, orient="row")


def regressions(summary: pl.DataFrame) -> list[str]:
    """Metrics on which the trained director is significantly WORSE than the base one (the
    paired CI lies wholly on the wrong side of 0 and rests on at least
    MIN_CLUSTERS_FOR_SIGNIFICANCE contexts), as readable lines; empty when none."""
    out = []
    for r in summary.iter_rows(named=True):
        lo, hi = r["lo"], r["hi"]
        if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
            continue
        if r["n_contexts"] < MIN_CLUSTERS_FOR_SIGNIFICANCE:
            continue
        worse = hi < 0 if r["higher_is_better"] else lo > 0
        if worse:
            out.append(f"{r['metric']}: trained - base = {r['delta']:+.3f} "
                       f"[{lo:+.3f}, {hi:+.3f}], n = {r['n_units']} units / "
                       f"{r['n_contexts']} contexts")
    return out


def _fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def report_section(rows: pl.DataFrame | None, provenance: dict[str, Any] | None = None
                   ) -> list[str]:
    """'## Director: trained vs base' for the evaluation report (rows: `director_comparison`)."""
    lines = ["## Director: trained vs base (same states and seeds)", ""]
    if rows is None or len(rows) == 0:
        return lines + ["n/a (no director_comparison rows: materialise director_comparison)", ""]
    s = summarise(rows)
    lines += ["Units: held-out context x seed, both arms from the same opening with the same "
              "seeds, users and persona adapters. Δ = trained − base, [95% bootstrap CI "
              "resampling contexts], * the CI excludes 0 with >= 6 contexts; "
              "n = units / contexts.", ""]
    lines += ["| metric | better | base | trained | Δ trained − base [95% CI] | n |",
              "|---|---|---|---|---|---|"]
    for r in (SimpleNamespace(**row) for row in s.iter_rows(named=True)):
        if r.n_contexts >= 2:
            cell = f"{r.delta:+.3f} [{r.lo:+.3f}, {r.hi:+.3f}]{r.mark}"
        elif r.n_units:
            cell = f"{r.delta:+.3f} (1 context, no CI)"
        else:
            cell = "n/a (no paired units)"
        lines.append(f"| {r.metric} | {'↑' if r.higher_is_better else '↓'} | {_fmt(r.base)} | "
                     f"{_fmt(r.trained)} | {cell} | {r.n_units} / {r.n_contexts} |")
    lines.append("")
    for k, v in (provenance or {}).items():
        lines.append(f"- **{k}**: {v}")
    return lines + [""]
