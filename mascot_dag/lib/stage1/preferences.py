"""Stage 1 RLAIF data: candidate prompts, persona-weighted judge scores, preference pairs.

A pair for persona p is (chosen, rejected) from the SAME context whose persona-weighted score AS p
differs by at least delta. The score (`weighted_scores`) puts `persona_weight` on the judge's
consistency (persona fidelity) and shares the rest over the other four criteria: an unweighted
mean of five criteria correlates 0.89 with relevance alone, so pairs ranked on it teach relevance,
not persona. With `cross_persona`, the pool of a context holds the candidates of EVERY persona's
prompt, each judged as p: another persona's voice for the same situation is a natural rejected
side, and a reward model that must rank it lower has to read the persona tag. The largest-margin
pairs are kept, `max_per_context` per (context, persona). Failed judgments never count.

Frames are polars.
"""

from __future__ import annotations

import hashlib
from itertools import combinations

import polars as pl

from mascot_dag.lib.types import Context, Message


def seeker_opening(context: Context) -> str:
    """What the person seeking support says first: their situation and, if any, first words."""
    first = next((t["text"] for t in context.turns if t.get("speaker") == "speaker"), "")
    if first and first.strip() and first.strip() != context.situation.strip():
        return f"{context.situation.strip()}\n{first.strip()}"
    return context.situation.strip()


def reward_messages(persona_tag: str, context: Context) -> list[Message]:
    """What the reward model reads before a response: a one-line persona tag and the seeker's
    opening, instead of the policy's full persona prompt.

    The RM is trained across all personas, so it must see WHICH persona a response is for; the tag
    ("The Anchor, an emotional validator") says that in ~10 tokens where the few-shot prompt takes
    ~270. On CPU a forward pass costs time in proportion to its tokens, and the RM runs on every
    pair in training, on every held-out pair, and on every GRPO completion.
    """
    return [
        {"role": "system", "content": f"Persona: {persona_tag}."},
        {"role": "user", "content": seeker_opening(context)},
    ]


def persona_tag(card) -> str:
    """`The Anchor, an emotional validator` (a card's name and role; see `reward_messages`)."""
    return f"{card.name}, {card.role}"


def candidate_id(context_id: str, persona_id: str, sample_idx: int) -> str:
    return f"{context_id}|{persona_id}|{sample_idx}"


PERSONA_CRITERION = "consistency"


def mean_scores(judgments, persona_weight: float = 0.2):
    """judgments (target_id, persona_id, judge, criterion, score, status) -> one row per
    (target_id, persona_id) with `mean_score`: persona_weight x consistency + (1 - persona_weight)
    x the mean of the other criteria, each criterion first averaged over judges; `n_scores` counts
    the ok scores. 0.2 is the plain mean of the five criteria. Sorted by (target_id, persona_id)."""
    if not 0 <= persona_weight <= 1:
        raise ValueError(f"persona_weight must be in [0, 1], got {persona_weight}")
    j = judgments
    if "persona_id" not in j.columns:
        j = j.with_columns(persona_id=pl.lit(None, dtype=pl.String))
    score = pl.col("score").cast(pl.Float64)
    ok = j.filter((pl.col("status") == "ok") & score.is_not_null() & score.is_not_nan())
    key = ["target_id", "persona_id"]
    per = ok.group_by([*key, "criterion"]).agg(m=score.mean(), n=pl.len())
    crits = set(per["criterion"].to_list())
    is_persona = pl.col("criterion") == PERSONA_CRITERION
    if PERSONA_CRITERION in crits and len(crits) > 1:
        # A key missing either side gets null and is dropped, as a criterion the judges failed.
        mean = (persona_weight * pl.col("m").filter(is_persona).mean()
                + (1 - persona_weight) * pl.col("m").filter(~is_persona).mean())
    else:  # a rubric without the persona criterion (or only it): the plain mean
        mean = pl.col("m").mean()
    out = (per.group_by(key).agg(mean_score=mean, n_scores=pl.col("n").sum())
           .drop_nulls("mean_score").sort(key, nulls_last=True))
    return out


PAIR_SCHEMA = {"pair_id": pl.String, "context_id": pl.String, "persona_id": pl.String,
               "chosen_id": pl.String, "rejected_id": pl.String, "chosen_score": pl.Float64,
               "rejected_score": pl.Float64, "margin": pl.Float64}


def make_pairs(
    candidates,
    scores,
    delta: float,
    persona: str | None = None,
    max_per_context: int = 0,
):
    """candidates (candidate_id, context_id, persona_id) + scores (target_id[, persona_id],
    mean_score) -> preference_pairs rows for `persona`.

    persona=None: the classic form, pairs inside each (context, candidate persona) with the
    candidate's own score. persona="p": every candidate of the context (any prompt) scored AS p
    (`scores` rows with persona_id = p) is in one pool. max_per_context > 0 keeps that many
    pairs per context, largest margins first (ties: ids)."""
    if delta <= 0:
        raise ValueError(f"preference delta must be > 0 (the method uses 0.5), got {delta}")
    cands, sc = candidates, scores
    if persona is not None:
        sc = sc.filter(pl.col("persona_id") == persona)
    merged = cands.join(sc.select("target_id", "mean_score"), left_on="candidate_id",
                        right_on="target_id", how="inner")
    pool = pl.lit(persona, dtype=pl.String) if persona is not None else pl.col("persona_id")
    merged = merged.with_columns(pool=pool).sort("context_id", "pool", "candidate_id")
    rows = []
    for (ctx, pool), group in merged.group_by(["context_id", "pool"], maintain_order=True):
        items = group.select("candidate_id", "mean_score").rows()
        found = []
        for (a, sa), (b, sb) in combinations(items, 2):
            if abs(sa - sb) < delta:
                continue
            (c, sc_), (r, sr) = ((a, sa), (b, sb)) if sa > sb else ((b, sb), (a, sa))
            pid = hashlib.sha1(f"{pool}:{c}>{r}".encode()).hexdigest()[:16]
            found.append(
                {"pair_id": pid, "context_id": ctx, "persona_id": pool, "chosen_id": c,
                 "rejected_id": r, "chosen_score": sc_, "rejected_score": sr, "margin": sc_ - sr}
            )
        found.sort(key=lambda p: (-p["margin"], p["chosen_id"], p["rejected_id"]))
        rows += found[:max_per_context] if max_per_context > 0 else found
    return pl.DataFrame(rows, schema=PAIR_SCHEMA)


def best_per_context(candidates, scores, persona: str):
    """The highest-scoring candidate AS `persona` of each context (any prompt's candidate): the
    persona warm start's SFT targets. Columns: candidate_id, context_id, mean_score."""
    sc = scores.filter(pl.col("persona_id") == persona)
    merged = candidates.join(sc.select("target_id", "mean_score"),
                             left_on="candidate_id", right_on="target_id", how="inner")
    best = (merged.sort(["context_id", "mean_score", "candidate_id"],
                        descending=[False, True, False])
            .group_by("context_id", maintain_order=True).head(1)
            .select("candidate_id", "context_id", "mean_score"))
    return best


def candidate_seed(seed: int, persona_index: int, sample_idx: int) -> int:
    """Seeds differ per persona: with `seed*1000+k` shared by every persona, two personas'
    candidates for a context came from the same random stream and nearly coincided."""
    return (seed * 1_000_003 + persona_index * 10_007 + sample_idx) % 2**31
