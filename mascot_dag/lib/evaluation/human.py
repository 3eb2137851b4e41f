"""Blind human evaluation in the paper's three-way protocol: items, per-rater order, validation.

One *item* is one eval context with three dialogues: MASCOT and two other methods, the same trios
the `three_way_comparisons` asset shows the judge (read from the `comparisons` table; when that
table is empty, the asset's own selection rule is applied to the eval dialogues). A rater sees the
three dialogues as A, B and C in an order shuffled by `random.Random(f"{rater}\\0{item_id}")`:
the same rater always sees an item the same way (a reload or a re-submission keeps the letters),
different raters see different orders, and the form never carries dialogue ids (they name the
method). Each dialogue gets a 1-5 score on every agent-level and collective criterion, and the
rater picks the best of the three. A submission replaces that rater's earlier answer for the item
in one transaction (`submission_rows` + `db.replace_many`).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import polars as pl

from mascot_dag.lib.evaluation.methods import METHODS
from mascot_dag.lib.judges.llm_judge import AGENT_RUBRIC, COLLECTIVE_RUBRIC
from mascot_dag.lib.types import AGENT_CRITERIA, COLLECTIVE_CRITERIA

SLOTS = ("A", "B", "C")
SCALE = (1, 2, 3, 4, 5)
# Human-readable titles; the definitions are the LLM judge's rubric, so humans and judge rate the
# same thing (agent-level ones are written per reply: the rater judges the companions' replies).
TITLES = {
    "emotional_expressiveness": "Emotional expressiveness",
    "empathetic_support_quality": "Empathetic support quality",
    "consistency": "Consistency (persona fidelity)",
    "response_relevance": "Response relevance",
    "social_contribution": "Social contribution",
    "fidelity": "Fidelity",
    "originality_specificity": "Originality & specificity",
    "relevance_coherence": "Relevance & coherence",
    "engagement_contribution": "Engagement & contribution",
}
CRITERIA: tuple[tuple[str, str, str], ...] = tuple(
    [("agent", c, AGENT_RUBRIC[c]) for c in AGENT_CRITERIA]
    + [("collective", c, COLLECTIVE_RUBRIC[c]) for c in COLLECTIVE_CRITERIA]
)
LEVEL_OF = {c: level for level, c, _ in CRITERIA}
RATER_RE = re.compile(r"^[\w .@+-]{1,64}$")
MAX_COMMENT = 2000  # characters; a free-text note per item, optional
RATING_COLUMNS = ["item_id", "rater", "dialogue_id", "method", "context_id", "level", "criterion",
                  "score", "shown_position"]
CHOICE_COLUMNS = ["item_id", "rater", "context_id", "shown_order", "best_dialogue_id",
                  "best_method", "comment"]
RATING_SCHEMA = {**dict.fromkeys(RATING_COLUMNS, pl.String), "score": pl.Int64,
                 "shown_position": pl.Int64}
CHOICE_SCHEMA = dict.fromkeys(CHOICE_COLUMNS, pl.String)


class RatingError(ValueError):
    """A submission that cannot be stored; `problems` names every bad field."""

    def __init__(self, problems: list[str], status: int = 422):
        self.problems = problems
        self.status = status
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class Item:
    item_id: str  # <context_id>:<k>, the comparison id without its judge
    context_id: str
    methods: tuple[str, str, str]  # canonical order: mascot, then the other two a-z
    dialogue_ids: tuple[str, str, str]  # same order as methods


def three_way_trios(context_methods: dict[str, set[str]]) -> list[tuple[str, int, list[str]]]:
    """Which trios are compared, per context (sorted by id): [mascot, two others] walking the
    pool of other methods present, len(pool)//2 trios per context, as (context_id, k, trio).
    The one rule of the `three_way_comparisons` asset and of the human rating items."""
    others = [m for m in METHODS if m != "mascot"]
    out = []
    for i, cid in enumerate(sorted(context_methods)):
        present = context_methods[cid]
        pool = [m for m in others if m in present]
        if "mascot" not in present or len(pool) < 2:
            continue
        for k in range(max(1, len(pool) // 2)):
            out.append((cid, k, ["mascot", pool[(2 * (i + k)) % len(pool)],
                                 pool[(2 * (i + k) + 1) % len(pool)]]))
    return out


def build_items(dialogues: pl.DataFrame, comparisons: pl.DataFrame | None = None) -> list[Item]:
    """Rating items from the eval `dialogues` rows and the judge's `comparisons` rows.

    A comparison whose methods lack an eval dialogue (the method was re-run without it) is skipped.
    """
    ev = dialogues.filter(pl.col("stage") == "eval") if "stage" in dialogues.columns else dialogues
    by_key = {(m, c): d for m, c, d in ev.sort("dialogue_id")
              .select("method", "context_id", "dialogue_id").iter_rows()}
    trios: dict[str, tuple[str, list[str]]] = {}
    if comparisons is not None and len(comparisons):
        rows = comparisons.sort("comparison_id").iter_rows(named=True)
        for r in (SimpleNamespace(**row) for row in rows):
            suffix = f":{r.judge}"
            cid = r.comparison_id
            iid = cid[: -len(suffix)] if cid.endswith(suffix) else cid
            shown = r.shown_order
            shown = json.loads(shown) if isinstance(shown, str) else list(shown)
            if "mascot" in shown and len(shown) == 3:
                trios.setdefault(iid, (r.context_id, shown))
    else:
        cm: dict[str, set[str]] = {}
        for m, cid in by_key:
            cm.setdefault(cid, set()).add(m)
        trios = {f"{cid}:{k}": (cid, ms) for cid, k, ms in three_way_trios(cm)}
    items = []
    for iid, (cid, shown) in sorted(trios.items()):
        # canonical order (mascot, then a-z): a rater's shuffle must not depend on the order the
        # judge happened to see, nor on which of the two sources named the trio
        ms = ["mascot", *sorted(m for m in shown if m != "mascot")]
        ids = [by_key.get((m, cid)) for m in ms]
        if all(ids):
            items.append(Item(iid, cid, tuple(ms), tuple(ids)))  # type: ignore[arg-type]
    return items


def shown_order(rater: str, item: Item) -> list[int]:
    """Indices into item.methods in the order the rater sees them (slots A, B, C).

    Seeded by rater and item only (a NUL separates them, so ("a:b", "c") != ("a", "b:c")).
    """
    order = [0, 1, 2]
    random.Random(f"{rater}\0{item.item_id}").shuffle(order)
    return order


def check_rater(rater: str | None) -> str:
    rater = (rater or "").strip()
    if not RATER_RE.match(rater):
        raise RatingError([f"rater: give a name or token of 1-64 letters, digits, spaces or "
                           f". _ @ + - (got {rater[:80]!r}{'...' if len(rater) > 80 else ''})"])
    return rater


def field_name(slot: str, criterion: str) -> str:
    return f"s.{slot}.{criterion}"


def parse_submission(item: Item, form: dict[str, list[str]]) -> dict[str, Any]:
    """Validate a submitted form (field -> values, as `urllib.parse.parse_qs` gives) for `item`.

    Fields: rater, item, s.<A|B|C>.<criterion> (integer 1-5, every one required), best (A|B|C),
    comment (optional, <= MAX_COMMENT characters). Raises RatingError naming every bad field;
    returns {"rater", "scores": {(slot, criterion): int}, "best": slot, "comment"}.
    """
    problems = []
    expected = {"rater", "item", "best", "comment"} | {
        field_name(s, c) for s in SLOTS for _, c, _ in CRITERIA}
    for name, values in sorted(form.items()):
        if name not in expected:
            problems.append(f"unknown field {name[:60]!r}")
        elif len(values) > 1:
            problems.append(f"field {name} given {len(values)} times")
    rater = ""
    try:
        rater = check_rater(form.get("rater", [""])[0])
    except RatingError as e:
        problems += e.problems
    scores = {}
    for slot in SLOTS:
        for _, c, _ in CRITERIA:
            name = field_name(slot, c)
            raw = form.get(name, [""])[0].strip()
            if not raw:
                problems.append(f"missing score for dialogue {slot}, criterion {c} (field {name})")
            elif not raw.isdigit() or int(raw) not in SCALE:
                problems.append(f"score for dialogue {slot}, criterion {c} must be an integer "
                                f"1-5 (field {name}, got {raw[:20]!r})")
            else:
                scores[(slot, c)] = int(raw)
    best = form.get("best", [""])[0].strip()
    if best not in SLOTS:
        problems.append(f"best: pick which dialogue is best, A, B or C (got {best[:20]!r})"
                        if best else "best: missing; pick which dialogue is best (A, B or C)")
    comment = form.get("comment", [""])[0]
    if len(comment) > MAX_COMMENT:
        problems.append(f"comment: at most {MAX_COMMENT} characters (got {len(comment)})")
    if problems:
        raise RatingError(problems)
    return {"rater": rater, "scores": scores, "best": best, "comment": comment.strip()}


def submission_rows(item: Item, sub: dict[str, Any]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The `human_ratings` rows (one per dialogue x criterion) and the `human_choices` row."""
    order = shown_order(sub["rater"], item)
    slot_of = dict(zip(SLOTS, order, strict=True))
    rows = []
    for (slot, c), score in sorted(sub["scores"].items()):
        i = slot_of[slot]
        rows.append([item.item_id, sub["rater"], item.dialogue_ids[i], item.methods[i],
                     item.context_id, LEVEL_OF[c], c, score, SLOTS.index(slot)])
    best = slot_of[sub["best"]]
    choice = [[item.item_id, sub["rater"], item.context_id,
               json.dumps([item.methods[i] for i in order]), item.dialogue_ids[best],
               item.methods[best], sub["comment"] or None]]
    return (pl.DataFrame(rows, schema=RATING_SCHEMA, orient="row"),
            pl.DataFrame(choice, schema=CHOICE_SCHEMA, orient="row"))


def replace_changes(item: Item, rater: str, ratings: pl.DataFrame, choice: pl.DataFrame) -> list:
    """`db.replace_many` changes: the rater's earlier answer for the item goes, the new comes."""
    where = "item_id = ? AND rater = ?"
    return [("human_ratings", ratings, where, [item.item_id, rater]),
            ("human_choices", choice, where, [item.item_id, rater])]


def export_table(ratings: pl.DataFrame, choices: pl.DataFrame) -> pl.DataFrame:
    """Long export: one row per rating, with the rater's best pick and comment for the item."""
    keys = ["item_id", "rater"]
    ch = choices.select(*keys, "best_method", "comment", "submitted_at")
    out = ratings.drop("submitted_at", strict=False).join(ch, on=keys, how="left")
    # a rating without its choice row (none stored) is not the chosen one
    out = out.with_columns(chosen_best=(pl.col("method") == pl.col("best_method"))
                           .fill_null(False))
    return out.sort(*keys, "shown_position", "level", "criterion")
