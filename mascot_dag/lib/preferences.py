"""Stage 1 RLAIF data: candidate prompts, persona-weighted judge scores, preference pairs.

A pair for persona p is (chosen, rejected) from the SAME context whose persona-weighted score AS p
differs by at least delta. The score (`weighted_scores`) puts `persona_weight` on the judge's
consistency (persona fidelity) and shares the rest over the other four criteria: an unweighted
mean of five criteria correlates 0.89 with relevance alone, so pairs ranked on it teach relevance,
not persona. With `cross_persona`, the pool of a context holds the candidates of EVERY persona's
prompt, each judged as p: another persona's voice for the same situation is a natural rejected
side, and a reward model that must rank it lower has to read the persona tag. The largest-margin
pairs are kept, `max_per_context` per (context, persona). Failed judgments never count.
"""

from __future__ import annotations

import hashlib
from itertools import combinations

import pandas as pd

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


def mean_scores(judgments: pd.DataFrame, persona_weight: float = 0.2) -> pd.DataFrame:
    """judgments (target_id, persona_id, judge, criterion, score, status) -> one row per
    (target_id, persona_id) with `mean_score`: persona_weight x consistency + (1 - persona_weight)
    x the mean of the other criteria, each criterion first averaged over judges; `n_scores` counts
    the ok scores. 0.2 is the plain mean of the five criteria."""
    if not 0 <= persona_weight <= 1:
        raise ValueError(f"persona_weight must be in [0, 1], got {persona_weight}")
    ok = judgments[(judgments.status == "ok") & judgments.score.notna()]
    if "persona_id" not in ok.columns:
        ok = ok.assign(persona_id=None)
    key = ["target_id", "persona_id"]
    per = ok.groupby([*key, "criterion"], dropna=False).score.mean().unstack("criterion")
    n = ok.groupby(key, dropna=False).score.count()
    others = [c for c in per.columns if c != PERSONA_CRITERION]
    if PERSONA_CRITERION in per.columns and others:
        score = (persona_weight * per[PERSONA_CRITERION]
                 + (1 - persona_weight) * per[others].mean(axis=1))
    else:  # a rubric without the persona criterion (or only it): the plain mean
        score = per.mean(axis=1)
    out = pd.DataFrame({"mean_score": score, "n_scores": n}).dropna(subset=["mean_score"])
    return out.reset_index()


def make_pairs(
    candidates: pd.DataFrame,
    scores: pd.DataFrame,
    delta: float,
    persona: str | None = None,
    max_per_context: int = 0,
) -> pd.DataFrame:
    """candidates (candidate_id, context_id, persona_id) + scores (target_id[, persona_id],
    mean_score) -> preference_pairs rows for `persona`.

    persona=None: the classic form, pairs inside each (context, candidate persona) with the
    candidate's own score. persona="p": every candidate of the context (any prompt) scored AS p
    (`scores` rows with persona_id = p) is in one pool. max_per_context > 0 keeps that many
    pairs per context, largest margins first (ties: ids)."""
    if delta <= 0:
        raise ValueError(f"preference delta must be > 0 (the method uses 0.5), got {delta}")
    if persona is not None:
        scores = scores[scores.persona_id == persona]
    scores = scores[["target_id", "mean_score"]]
    merged = candidates.merge(scores, left_on="candidate_id", right_on="target_id", how="inner")
    if persona is not None:
        merged = merged.assign(pool=persona)
    else:
        merged = merged.assign(pool=merged.persona_id)
    rows = []
    for (ctx, pool), group in merged.groupby(["context_id", "pool"], sort=True):
        items = group.sort_values("candidate_id")[["candidate_id", "mean_score"]].values.tolist()
        found = []
        for (a, sa), (b, sb) in combinations(items, 2):
            if abs(sa - sb) < delta:
                continue
            (c, sc), (r, sr) = ((a, sa), (b, sb)) if sa > sb else ((b, sb), (a, sa))
            pid = hashlib.sha1(f"{pool}:{c}>{r}".encode()).hexdigest()[:16]
            found.append(
                {"pair_id": pid, "context_id": ctx, "persona_id": pool, "chosen_id": c,
                 "rejected_id": r, "chosen_score": sc, "rejected_score": sr, "margin": sc - sr}
            )
        found.sort(key=lambda p: (-p["margin"], p["chosen_id"], p["rejected_id"]))
        rows += found[:max_per_context] if max_per_context > 0 else found
    cols = ["pair_id", "context_id", "persona_id", "chosen_id", "rejected_id",
            "chosen_score", "rejected_score", "margin"]
    return pd.DataFrame(rows, columns=cols)


def best_per_context(candidates: pd.DataFrame, scores: pd.DataFrame, persona: str) -> pd.DataFrame:
    """The highest-scoring candidate AS `persona` of each context (any prompt's candidate): the
    persona warm start's SFT targets. Columns: candidate_id, context_id, mean_score."""
    s = scores[scores.persona_id == persona][["target_id", "mean_score"]]
    merged = candidates.merge(s, left_on="candidate_id", right_on="target_id", how="inner")
    merged = merged.sort_values(["context_id", "mean_score", "candidate_id"],
                                ascending=[True, False, True])
    return merged.groupby("context_id", sort=True).head(1)[
        ["candidate_id", "context_id", "mean_score"]].reset_index(drop=True)


def candidate_seed(seed: int, persona_index: int, sample_idx: int) -> int:
    """Seeds differ per persona: with `seed*1000+k` shared by every persona, two personas'
    candidates for a context came from the same random stream and nearly coincided."""
    return (seed * 1_000_003 + persona_index * 10_007 + sample_idx) % 2**31
