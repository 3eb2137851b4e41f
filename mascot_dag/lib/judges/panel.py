"""A panel of judges, and the one number training takes from it.

Every judge of a profile's panel scores every item it is asked about, and the tables keep one row
per judge (evaluation reports their agreement). Training needs ONE number per item (preference
pairs rank candidates by it, the director's GRPO reward is it). `training_rule` decides how:

- "mean": each criterion is the mean over the judges whose score for it is ok (a failed score
  is left out, never counted as a default); the criterion is failed only when every judge failed.
  Judge-specific quirks then weigh less, but an item on which one judge failed is ranked by the
  others alone, so a judge that fails often shifts the mix between items.
- a judge's name ("embedded", "llm"): only that judge trains; the others only evaluate. The
  embedded profiles use "embedded", which keeps any added LLM judge independent of training.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import polars as pl

from mascot_dag.lib.judges.base import BlockItem, Judge, ResponseItem
from mascot_dag.lib.types import Score

MEAN = "mean"


def _combine(per_judge: list[list[list[Score]]], names: list[str]) -> list[list[Score]]:
    out = []
    for item_scores in zip(*per_judge, strict=True):
        row = []
        for crit_scores in zip(*item_scores, strict=True):
            crit = crit_scores[0].criterion
            if any(s.criterion != crit for s in crit_scores):
                raise ValueError(f"judges {names} returned criteria in different orders")
            ok = [(n, s) for n, s in zip(names, crit_scores, strict=True)
                  if s.status == "ok" and s.score is not None]
            if ok:
                why = "; ".join(f"{n}: {s.score:g}" for n, s in ok)
                row.append(Score(crit, sum(s.score for _, s in ok) / len(ok), f"mean of {why}"))
            else:
                row.append(Score(crit, None, f"every judge failed ({', '.join(names)})",
                                 status="failed"))
        out.append(row)
    return out


class MeanJudge:
    """The mean over several judges' ok scores per criterion (see the module doc)."""

    def __init__(self, judges: Sequence[Judge]):
        if not judges:
            raise ValueError("MeanJudge needs at least one judge")
        self.judges = list(judges)
        self.name = f"{MEAN}({'+'.join(j.name for j in self.judges)})"

    def score_responses(self, items: list[ResponseItem]) -> list[list[Score]]:
        return _combine([j.score_responses(items) for j in self.judges],
                        [j.name for j in self.judges])

    def score_blocks(self, items: list[BlockItem]) -> list[list[Score]]:
        return _combine([j.score_blocks(items) for j in self.judges],
                        [j.name for j in self.judges])

    def pick_best(self, context_text: str, options: list[list[dict]]) -> int | None:
        """Majority of the judges' picks (ties: the earliest judge's pick); None if all failed."""
        picks = [p for p in (j.pick_best(context_text, options) for j in self.judges)
                 if p is not None]
        if not picks:
            return None
        counts = Counter(picks)
        top = max(counts.values())
        return next(p for p in picks if counts[p] == top)


def check_unique(judges: Sequence[Judge]) -> None:
    names = [j.name for j in judges]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"judge names must be unique within a panel (they key the tables): {dup}")


def training_judge(judges: Sequence[Judge], rule: str = MEAN) -> Judge:
    """The judge whose scores train (see the module doc); a single-judge panel is that judge."""
    check_unique(judges)
    if not judges:
        raise ValueError("the judge panel is empty: a profile must configure at least one judge")
    if rule == MEAN:
        return judges[0] if len(judges) == 1 else MeanJudge(judges)
    for j in judges:
        if j.name == rule:
            return j
    raise ValueError(f"training judge {rule!r} is not in the panel {[j.name for j in judges]}; "
                     f"set training_judge to one of them or to {MEAN!r}")


def training_judgments(judgments, rule: str = MEAN):
    """The `judgments` rows training ranks on (polars):
    every judge's for "mean" (lib.preferences averages each criterion over judges first), else
    only the named judge's."""
    if rule == MEAN:
        return judgments
    return judgments.filter(pl.col("judge") == rule)


# the `group_judgments` rows (score NULL where a judge failed)
BLOCK_JUDGMENT_SCHEMA = {"dialogue_id": pl.String, "block_idx": pl.Int64, "judge": pl.String,
                         "criterion": pl.String, "score": pl.Float64, "rationale": pl.String,
                         "status": pl.String, "raw_output": pl.String}


def judge_dialogue_blocks(judges: Sequence[Judge], records, contexts: dict[str, str],
                          rosters: dict[str, list], block_size: int) -> pl.DataFrame:
    """Collective-rubric scores of every `block_size`-turn block of the dialogue `records`
    (`lib.dialogue.rollout.records_from_frames`), by each judge: one row per judge, block and
    criterion (BLOCK_JUDGMENT_SCHEMA). `contexts`: {context_id: text}; `rosters`: {"support" |
    "workplace": cards}, the roster that spoke in each mode."""
    from mascot_dag.lib.dialogue.engine import blocks
    from mascot_dag.lib.storage.tables import score_rows

    items, keys = [], []
    for rec in records:
        roster = rosters["support" if rec.dialogue["mode"] == "support" else "workplace"]
        for b, block in enumerate(blocks(rec.turns, block_size)):
            items.append(BlockItem(contexts[rec.dialogue["context_id"]], roster,
                                   [{"speaker": t["speaker"], "text": t["text"]} for t in block]))
            keys.append((rec.dialogue["dialogue_id"], b))
    rows = []
    for judge in judges:
        for (did, b), scores in zip(keys, judge.score_blocks(items) if items else [], strict=True):
            rows += score_rows(scores, dialogue_id=did, block_idx=b, judge=judge.name)
    return pl.DataFrame(rows, schema=BLOCK_JUDGMENT_SCHEMA)
