"""Collective (block-level) scores of the embedded judge: the 4 COLLECTIVE_CRITERIA of one dialogue.

Separate from embedded.py only to keep files short; it uses the judge's cached embeddings and its
per-turn fidelity. Formulas are on [0, 1] and mapped to 1 + 4x; rationales carry the raw numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mascot_dag.lib.judges import features as F
from mascot_dag.lib.judges.base import USER_SPEAKER, BlockItem
from mascot_dag.lib.types import COLLECTIVE_CRITERIA, Score

if TYPE_CHECKING:
    from mascot_dag.lib.judges.embedded import EmbeddedJudge


def score_block(judge: EmbeddedJudge, item: BlockItem, ctx: str) -> list[Score]:
    from mascot_dag.lib.judges.embedded import ECHO_COS, REL_HI, REL_LO, _ramp, _to_score

    raw = [(str(t.get("speaker", "")), str(t.get("text", ""))) for t in item.turns]
    # features on the text without sentences addressed to the evaluator; those mark the turn broken
    turns = [(s, F.strip_judge_directed(t)[0]) for s, t in raw]
    agent_idx = [i for i, (s, _) in enumerate(turns) if s != USER_SPEAKER]
    if not agent_idx:
        return [
            _to_score(c, 0.0, "no agent turns: every criterion is 1") for c in COLLECTIVE_CRITERIA
        ]
    cards = {c.persona_id: c for c in item.roster}
    texts = [t for _, t in turns]
    cos = judge._cos

    fids, novs, specs, rels, contrib, echoes, missing = [], [], [], [], [], 0, set()
    ctx_words = F.content_words(ctx)
    for i in agent_idx:
        speaker, text = turns[i]
        earlier = texts[:i]
        if not text.strip():
            fids.append(0.0)
            novs.append(0.0)
            specs.append(0.0)
            rels.append(0.0)
            contrib.append(False)
            continue
        broken = bool(F.ROLE_BREAK.search(text) or F.strip_judge_directed(raw[i][1])[1])
        others = [c.name for pid, c in cards.items() if pid != speaker] + ["User"]
        broken = broken or F.speaks_for_other(text, others) is not None
        if speaker in cards:
            # per-turn fidelity: margin over the roster, relevance-gated, copy-penalised
            fid = judge._fidelity(text, cards[speaker], item.roster, ctx)["value"]
            fids.append(0.0 if broken else fid)
        else:
            missing.add(speaker)
        novs.append(judge._novelty(text, [e for e in earlier if e.strip()], ctx))
        # specificity: shares at least 2 content words with the context (names, objects, events)
        specs.append(min(1.0, len(F.content_words(text) & ctx_words) / 2))
        rels.append(_ramp(cos(text, ctx), REL_LO, REL_HI))
        echo = any(cos(text, e) > ECHO_COS for e in earlier if e.strip())
        echoes += echo
        seen = ctx_words.union(*(F.content_words(e) for e in earlier))
        # contributes: not an echo, no format violation, brings >= 2 content words not seen before
        contrib.append(not echo and not broken and len(F.content_words(text) - seen) >= 2)

    n = len(agent_idx)
    out: list[Score] = []

    # fidelity = mean per-turn fidelity of agent turns whose speaker has a card
    if fids:
        note = f"; no card for {sorted(missing)}" if missing else ""
        out.append(
            _to_score(
                "fidelity",
                sum(fids) / len(fids),
                f"mean_turn_fidelity={sum(fids) / len(fids):.3f} over {len(fids)} turns{note}",
            )
        )
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
        _to_score(
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
    coh = sum(_ramp(cos(a, b), 0.05, 0.5) for a, b in pairs) / len(pairs) if pairs else rel
    out.append(
        _to_score(
            "relevance_coherence", 0.6 * rel + 0.4 * coh, f"relevance={rel:.3f} coherence={coh:.3f}"
        )
    )

    # engagement_contribution = 0.8 fraction of agent turns that contribute + 0.2 speaker coverage
    frac = sum(contrib) / n
    speakers = {turns[i][0] for i in agent_idx}
    coverage = min(1.0, len(speakers) / len(cards)) if cards else 1.0
    out.append(
        _to_score(
            "engagement_contribution",
            0.8 * frac + 0.2 * coverage,
            f"contributing={sum(contrib)}/{n} echoes={echoes} coverage={coverage:.2f}",
        )
    )
    return out
