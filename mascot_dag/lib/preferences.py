"""Stage 1 RLAIF data: candidate prompts, mean judge scores, and preference pairs.

A pair is (chosen, rejected) from the SAME context and persona whose mean agent-level score (over
the five criteria and every judge's ok scores, 1-5 scale) differs by at least delta. Every such
pair of the K candidates is kept (not just best-vs-worst): with K=4 that is up to 6 pairs per
context, which the reward model needs at small data sizes. Failed judgments never count.
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


def candidate_messages(system_prompt: str, context: Context) -> list[Message]:
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": seeker_opening(context)},
    ]


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


def mean_scores(judgments: pd.DataFrame) -> pd.DataFrame:
    """judgments (target_id, judge, criterion, score, status) -> target_id, mean_score, n_scores."""
    ok = judgments[(judgments.status == "ok") & judgments.score.notna()]
    out = ok.groupby("target_id").score.agg(mean_score="mean", n_scores="count").reset_index()
    return out


def make_pairs(candidates: pd.DataFrame, scores: pd.DataFrame, delta: float) -> pd.DataFrame:
    """candidates (candidate_id, context_id, persona_id) + mean scores -> preference_pairs rows."""
    if delta <= 0:
        raise ValueError(f"preference delta must be > 0 (the method uses 0.5), got {delta}")
    merged = candidates.merge(scores, left_on="candidate_id", right_on="target_id", how="inner")
    rows = []
    for (ctx, persona), group in merged.groupby(["context_id", "persona_id"], sort=True):
        items = group.sort_values("candidate_id")[["candidate_id", "mean_score"]].values.tolist()
        for (a, sa), (b, sb) in combinations(items, 2):
            if abs(sa - sb) < delta:
                continue
            (c, sc), (r, sr) = ((a, sa), (b, sb)) if sa > sb else ((b, sb), (a, sa))
            pid = hashlib.sha1(f"{c}>{r}".encode()).hexdigest()[:16]
            rows.append(
                {"pair_id": pid, "context_id": ctx, "persona_id": persona, "chosen_id": c,
                 "rejected_id": r, "chosen_score": sc, "rejected_score": sr, "margin": sc - sr}
            )
    cols = ["pair_id", "context_id", "persona_id", "chosen_id", "rejected_id",
            "chosen_score", "rejected_score", "margin"]
    return pd.DataFrame(rows, columns=cols)
