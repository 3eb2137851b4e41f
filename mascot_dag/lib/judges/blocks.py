"""Collective (block-level) scores of the embedded judge: the 4 COLLECTIVE_CRITERIA of one dialogue.

It reads texts through an `EmbeddingSpace` (the embedded judge's cached embeddings and persona
centroids; `embedded.EmbeddedJudge` is one) and calibrates on the same scales (`scales`).
Fidelity here is a block-level measurement (`block_fidelity`: each speaker's block text against
its card AND against the other speakers), not the mean of the agent-level per-turn consistency.
Formulas are on [0, 1] and mapped to 1 + 4x; rationales carry the raw numbers.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from mascot_dag.lib.data.personas import PersonaCard
from mascot_dag.lib.judges import features as F
from mascot_dag.lib.judges.base import USER_SPEAKER, BlockItem
from mascot_dag.lib.judges.scales import (
    ECHO_COS,
    GATE_HI,
    GATE_LO,
    GENERIC_ASSISTANT,
    MARGIN_SCALE,
    REL_HI,
    REL_LO,
    clip01,
    ramp,
    to_score,
    unit,
)
from mascot_dag.lib.types import COLLECTIVE_CRITERIA, Score


class EmbeddingSpace(Protocol):
    """What the block scorer reads texts through (`embedded.EmbeddedJudge`)."""

    def vector(self, text: str) -> np.ndarray: ...

    def cos(self, a: str, b: str) -> float: ...

    def novelty(self, text: str, earlier: list[str], ctx: str) -> float: ...

    def persona(self, card: PersonaCard) -> Any: ...  # .centroid: the card's unit vector


def score_block(judge: EmbeddingSpace, item: BlockItem, ctx: str) -> list[Score]:

    raw = [(str(t.get("speaker", "")), str(t.get("text", ""))) for t in item.turns]
    # features on the text without sentences addressed to the evaluator; those mark the turn broken
    turns = [(s, F.strip_judge_directed(t)[0]) for s, t in raw]
    agent_idx = [i for i, (s, _) in enumerate(turns) if s != USER_SPEAKER]
    if not agent_idx:
        return [
            to_score(c, 0.0, "no agent turns: every criterion is 1") for c in COLLECTIVE_CRITERIA
        ]
    cards = {c.persona_id: c for c in item.roster}
    texts = [t for _, t in turns]
    cos = judge.cos

    fids, novs, specs, rels, contrib, echoes, missing = [], [], [], [], [], 0, set()
    broken_idx: set[int] = set()
    ctx_words = F.content_words(ctx)
    for i in agent_idx:
        speaker, text = turns[i]
        earlier = texts[:i]
        if not text.strip():
            fids.append(i)  # an empty turn counts in its speaker's share of valid turns
            novs.append(0.0)
            specs.append(0.0)
            rels.append(0.0)
            contrib.append(False)
            continue
        broken = bool(F.ROLE_BREAK.search(text) or F.strip_judge_directed(raw[i][1])[1])
        others = [c.name for pid, c in cards.items() if pid != speaker] + ["User"]
        broken = broken or F.speaks_for_other(text, others) is not None
        if speaker in cards:
            fids.append(i)
            broken_idx.update({i} if broken else set())
        else:
            missing.add(speaker)
        novs.append(judge.novelty(text, [e for e in earlier if e.strip()], ctx))
        # specificity: shares at least 2 content words with the context (names, objects, events)
        specs.append(min(1.0, len(F.content_words(text) & ctx_words) / 2))
        rels.append(ramp(cos(text, ctx), REL_LO, REL_HI))
        echo = any(cos(text, e) > ECHO_COS for e in earlier if e.strip())
        echoes += echo
        seen = ctx_words.union(*(F.content_words(e) for e in earlier))
        # contributes: not an echo, no format violation, brings >= 2 content words not seen before
        contrib.append(not echo and not broken and len(F.content_words(text) - seen) >= 2)

    n = len(agent_idx)
    out: list[Score] = []

    # fidelity: a BLOCK-level measurement (block_fidelity), not the mean of per-turn consistency
    if fids:
        note = f"; no card for {sorted(missing)}" if missing else ""
        value, why = block_fidelity(judge, turns, fids, broken_idx, cards, item.roster, ctx)
        out.append(to_score("fidelity", value, why + note))
    else:
        out.append(
            Score(
                "fidelity", None, f"no persona card for speakers {sorted(missing)}", status="failed"
            )
        )

    # originality_specificity = 0.4 mean novelty + 0.3 distinct-2 of all agent text
    #   + 0.3 mean specificity
    nov, spec = sum(novs) / n, sum(specs) / n
    d2 = F.distinct_n(" \n ".join(texts[i] for i in agent_idx), 2)
    out.append(
        to_score(
            "originality_specificity",
            0.4 * nov + 0.3 * d2 + 0.3 * spec,
            f"novelty={nov:.3f} distinct2={d2:.3f} specificity={spec:.3f}",
        )
    )

    # relevance_coherence = 0.6 mean relevance of agent turns + 0.4 mean ramp(cos consecutive
    #   turns, 0.05, 0.5); a single turn's coherence is its relevance
    rel = sum(rels) / n
    pairs = [
        (texts[i - 1], texts[i])
        for i in range(1, len(texts))
        if texts[i - 1].strip() and texts[i].strip()
    ]
    coh = sum(ramp(cos(a, b), 0.05, 0.5) for a, b in pairs) / len(pairs) if pairs else rel
    out.append(
        to_score(
            "relevance_coherence", 0.6 * rel + 0.4 * coh, f"relevance={rel:.3f} coherence={coh:.3f}"
        )
    )

    # engagement_contribution = 0.8 fraction of agent turns that contribute + 0.2 speaker coverage
    frac = sum(contrib) / n
    speakers = {turns[i][0] for i in agent_idx}
    coverage = min(1.0, len(speakers) / len(cards)) if cards else 1.0
    out.append(
        to_score(
            "engagement_contribution",
            0.8 * frac + 0.2 * coverage,
            f"contributing={sum(contrib)}/{n} echoes={echoes} coverage={coverage:.2f}",
        )
    )
    return out


DISTINCT_LO, DISTINCT_HI = 0.6, 0.95  # cos of two speakers' block texts: 0.95+ = same voice


def block_fidelity(judge: EmbeddingSpace, turns: list[tuple[str, str]], idx: list[int],
                   broken: set[int], cards: dict, roster: list, ctx: str) -> tuple[float, str]:
    """Collective Fidelity of one block on [0, 1]: does each speaker stay true to its own card
    ACROSS the block, and distinct from the OTHER speakers in it?

    Per speaker s (turns `idx` with a card): v_s = unit mean of its valid turns' vectors (valid:
    non-empty, no role break); card_s = the persona margin of v_s over the roster's other cards
    (as in `_fidelity`: 0.5 + margin / (2 MARGIN_SCALE), relevance-gated, copy-penalised) x the
    share of s's turns that are valid.
    Per pair (s, t): sep = 0.5 + swap / (2 MARGIN_SCALE), swap = mean of (cos(v_s, c_s) -
    cos(v_s, c_t)) and (cos(v_t, c_t) - cos(v_t, c_s)): would swapping the two speakers' names fit
    the cards worse? dist = 1 - ramp(cos(v_s, v_t), DISTINCT_LO, DISTINCT_HI): do they sound
    alike? pair = sep x dist. Two speakers who say the same thing get pair ~0 even when each
    turn, read alone, fits its card.
    value = mean card_s with one speaker; else 0.5 mean card_s + 0.5 mean pair.
    """
    by_speaker: dict[str, list[int]] = {}
    for i in idx:
        by_speaker.setdefault(turns[i][0], []).append(i)
    vecs, card_parts = {}, []
    ctx_v = judge.vector(ctx)
    for s, ii in by_speaker.items():
        valid = [turns[i][1] for i in ii if turns[i][1].strip() and i not in broken]
        if not valid:
            card_parts.append(0.0)
            continue
        v = unit(np.mean([judge.vector(t) for t in valid], axis=0))
        vecs[s] = v
        p = judge.persona(cards[s])
        others = [c for c in roster if c.persona_id != s]
        other = (max(float(v @ judge.persona(c).centroid) for c in others) if others
                 else max(float(v @ judge.vector(g)) for g in GENERIC_ASSISTANT))
        fid = clip01(0.5 + (float(v @ p.centroid) - other) / (2 * MARGIN_SCALE))
        gate = ramp(float(v @ ctx_v), GATE_LO, GATE_HI)
        copy = min(0.6, 0.15 * sum(F.copied_grams(t, p.grams) for t in valid) / len(valid))
        card_parts.append(clip01(fid * (0.1 + 0.9 * gate) - copy) * len(valid) / len(ii))
    card = sum(card_parts) / len(card_parts)
    speakers = sorted(vecs)
    pairs, seps, sims = [], [], []
    for a in range(len(speakers)):
        for b in range(a + 1, len(speakers)):
            s, t = speakers[a], speakers[b]
            cs, ct = judge.persona(cards[s]).centroid, judge.persona(cards[t]).centroid
            swap = (float(vecs[s] @ cs - vecs[s] @ ct) + float(vecs[t] @ ct - vecs[t] @ cs)) / 2
            sep = clip01(0.5 + swap / (2 * MARGIN_SCALE))
            sim = float(vecs[s] @ vecs[t])
            pairs.append(sep * (1.0 - ramp(sim, DISTINCT_LO, DISTINCT_HI)))
            seps.append(sep)
            sims.append(sim)
    if not pairs:
        return card, f"speaker_card={card:.3f} over {len(by_speaker)} speaker(s); no pair"
    pair = sum(pairs) / len(pairs)
    return 0.5 * card + 0.5 * pair, (
        f"speaker_card={card:.3f} over {len(by_speaker)} speakers; pairwise={pair:.3f} over "
        f"{len(pairs)} pairs (separability={sum(seps) / len(seps):.3f}, "
        f"max_cos_between_speakers={max(sims):.3f})")
