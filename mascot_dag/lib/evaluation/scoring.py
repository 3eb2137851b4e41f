"""Scores of evaluation dialogues: every judge on both rubrics, plus the automatic metrics.

Agent-level: every agent turn is judged with its speaker's card against the roster it spoke in
(the single-voice methods' "assistant" is judged against the roster plus itself), with
the earlier turns as history; a dialogue's value per criterion is the mean over its agent turns.
Collective: every N-turn block is judged; a dialogue's value is the mean over its blocks.
Values stay on the judges' 1-5 scale (reports convert to 0-100); failed judgments are left out
of the means, and a dialogue whose every judgment failed gets NULL.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import polars as pl

from mascot_dag.lib.dialogue.engine import blocks
from mascot_dag.lib.evaluation.metrics import compute_metrics, metric_rows
from mascot_dag.lib.judges.base import BlockItem, ResponseItem

COLUMNS = ["method", "dialogue_id", "level", "judge", "criterion", "value", "higher_is_better"]
TURN_COLUMNS = ["method", "dialogue_id", "turn_idx", "speaker", "judge", "criterion", "value"]
SCHEMA = dict(zip(COLUMNS, [pl.String] * 5 + [pl.Float64, pl.Boolean], strict=True))
TURN_SCHEMA = dict(zip(TURN_COLUMNS, [pl.String, pl.String, pl.Int64] + [pl.String] * 3
                       + [pl.Float64], strict=True))


def _mean_rows(method, did, level, judge_name, per_criterion: dict[str, list]) -> list[dict]:
    rows = []
    for crit, vals in per_criterion.items():
        ok = [v for v in vals if v is not None]
        rows.append({"method": method, "dialogue_id": did, "level": level, "judge": judge_name,
                     "criterion": crit, "value": sum(ok) / len(ok) if ok else None,
                     "higher_is_better": True})
    return rows


def score_dialogues(dialogues, turns, context_text, cards, rosters, judges, block_size,
                    embed=None, identifier=None, turn_rows: list | None = None) -> pl.DataFrame:
    """Per-dialogue rows (COLUMNS). `turn_rows`, when a list, receives one dict per (agent turn,
    judge, criterion) of the agent-level rubric (TURN_COLUMNS): the per-persona breakdowns
    (persona x simulated-user MBTI) need scores by speaker, which dialogue means lose."""
    dialogues = [SimpleNamespace(**d) for d in dialogues.iter_rows(named=True)]
    by_dialogue = {k: g.sort("turn_idx")
                   for (k,), g in turns.group_by("dialogue_id")}
    resp_items, resp_keys, block_items, block_keys = [], [], [], []
    for d in dialogues:
        g = by_dialogue.get(d.dialogue_id)
        if g is None:
            continue
        roster = list(rosters["support" if d.mode == "support" else "workplace"])
        history: list[str] = []
        text = context_text[d.context_id]
        for t in (SimpleNamespace(**r) for r in g.iter_rows(named=True)):
            if t.role == "agent":
                card = cards[t.speaker]
                r = roster if card in roster else roster + [card]
                resp_items.append(ResponseItem(text, card, r, t.text, list(history)))
                resp_keys.append((d.method, d.dialogue_id, t.turn_idx, t.speaker))
            history.append(t.text)
        for block in blocks(g.select("speaker", "text").to_dicts(), block_size):
            speakers = {x["speaker"] for x in block}
            extra = [cards[s] for s in speakers if s in cards and cards[s] not in roster]
            block_items.append(BlockItem(text, roster + extra, block))
            block_keys.append((d.method, d.dialogue_id, None, None))
    rows = []
    for judge in judges:
        for level, items, keys, fn in (("agent", resp_items, resp_keys, judge.score_responses),
                                       ("collective", block_items, block_keys, judge.score_blocks)):
            acc: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
            for key, scores in zip(keys, fn(items) if items else [], strict=True):
                for s in scores:
                    value = s.score if s.status == "ok" else None
                    acc[key[:2]][s.criterion].append(value)
                    if turn_rows is not None and level == "agent":
                        turn_rows.append(dict(zip(TURN_COLUMNS, (*key, judge.name, s.criterion,
                                                                 value), strict=True)))
            for (method, did), per in acc.items():
                rows += _mean_rows(method, did, level, judge.name, per)
    for d in dialogues:
        g = by_dialogue.get(d.dialogue_id)
        if g is None:
            continue
        values = compute_metrics(g.select("speaker", "role", "text").to_dicts(), embed=embed,
                                 identifier=identifier)
        rows += metric_rows(d.method, d.dialogue_id, values)
    # a metric that is undefined may come back NaN: stored as NULL like a failed judgment
    return pl.DataFrame(rows, schema=SCHEMA).with_columns(pl.col("value").fill_nan(None))
