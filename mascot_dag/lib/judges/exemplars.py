"""What the embedded judge's persona centroids average (`persona_exemplars`).

"card": the card's description, behaviours and examples. "references": the card's examples and
the persona's REWARD share of its set's reference utterances (`readers.split_references` with
`reward_reference_share`), so the reward learns how each persona talks and never a text that
the probe's readers learn from. "exemplars": the card's examples and utterances written for the
reward alone (`personas/exemplars/<set>.yaml`, the probe file's format), so the readers keep
every reference: splitting 40 references per persona cost the readers their validity (issue
34). An exemplar that is also one of the set's reference utterances is an error naming both
files. A set (or persona) without references or exemplars falls back to the card, with a warning
and a note, never silently.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from mascot_dag.lib.data.personas import PersonaCard

EXEMPLARS = ("card", "references", "exemplars")


class PersonaExemplars:
    def __init__(self, kind: str = "card", reward_reference_share: float = 0.0):
        if kind not in EXEMPLARS:
            raise ValueError(f"persona_exemplars {kind!r}: one of {EXEMPLARS}")
        if kind == "references" and not 0.0 < reward_reference_share < 1.0:
            raise ValueError(
                f"persona_exemplars='references' needs 0 < reward_reference_share < 1 (got "
                f"{reward_reference_share}): the reward share is what the centroids average")
        self.kind = kind
        self.share = reward_reference_share
        self._references: dict[str, dict[str, list[str]]] = {}  # set -> reward share per persona
        self.notes: dict[str, str] = {}  # set (or set/persona) -> why it fell back to the card

    def reward_share(self, card: PersonaCard) -> list[str]:
        """The persona's reward share of its set's references (empty with "card", or when there
        are none for it: then the card alone, with a warning and a note)."""
        if self.kind == "card":
            return []
        pset = card.persona_set
        if pset not in self._references:
            from mascot_dag.lib.stage1.readers import NoReferenceUtterances

            try:
                self._references[pset] = self._load(pset)
            except NoReferenceUtterances as e:
                self._references[pset] = {}
                self._fall_back(pset, f"persona_exemplars={self.kind!r}: {e}; the embedded "
                                      f"judge's {pset} centroids fall back to the card")
        refs = self._references[pset].get(card.persona_id, [])
        if not refs and self._references[pset]:
            self._fall_back(f"{pset}/{card.persona_id}",
                            f"persona_exemplars={self.kind!r}: no utterances for "
                            f"{card.persona_id} of {pset}; its centroid falls back to the card")
        return refs

    def _load(self, pset: str) -> dict[str, list[str]]:
        """The set's texts for the reward: the reward share of its references, or its written
        exemplars, none of which may be a text the probe's readers learn from."""
        from mascot_dag.lib.stage1.readers import (
            NoReferenceUtterances,
            load_reference_utterances,
            reader_references,
            reference_dir,
            reward_references,
        )

        if self.kind == "references":
            return reward_references(pset, self.share)
        folder = reference_dir(pset, "exemplars")
        written = load_reference_utterances(pset, folder)
        try:
            readers = {t for ts in reader_references(pset, self.share).values() for t in ts}
        except NoReferenceUtterances:
            readers = set()
        shared = [(pid, t) for pid, texts in written.items() for t in texts if t in readers]
        if shared:
            pid, t = shared[0]
            raise ValueError(
                f"{folder / f'{pset}.yaml'}: utterances.{pid} has {t[:60]!r}..., one of the "
                f"reference utterances the probe's readers learn from "
                f"({reference_dir(pset) / f'{pset}.yaml'}): the reward and the readers must "
                "never share a text")
        return written

    def _fall_back(self, key: str, note: str) -> None:
        if key not in self.notes:  # once per set (or persona)
            self.notes[key] = note
            warnings.warn(note, stacklevel=4)

    def rationale(self, card: PersonaCard) -> str:
        """What the consistency rationale says of the exemplars (nothing with "card")."""
        if self.kind == "card":
            return ""
        refs = self.reward_share(card)
        return (f" exemplars={self.kind}({len(refs)})" if refs
                else " exemplars=card (no " + ("reference utterances" if self.kind == "references"
                                               else "written exemplars") + ": fallback)")


def consistency_table(judge, roster: Sequence[PersonaCard], texts: Sequence[str]) -> np.ndarray:
    """(len(texts), len(roster)) consistency (1-5) of each text judged as each persona, with the
    text as its own context (on topic: relevance gate 1, so the score is the persona margin less
    the card-copy penalty): how well a judge's centroids tell the personas apart."""
    from mascot_dag.lib.judges.base import ResponseItem

    items = [ResponseItem(context_text=t, persona=c, roster=list(roster), response=t, history=[])
             for t in texts for c in roster]
    cons = [next(s.score for s in row if s.criterion == "consistency")
            for row in judge.score_responses(items)]
    return np.asarray(cons, dtype=float).reshape(len(texts), len(roster))


def persona_accuracies(table: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per text of a `consistency_table`, given its true persona's column: the pairwise accuracy
    (share of the other personas scored below the true one, a tie half) and the top-1 hit (ties
    to the lower column)."""
    rows = np.arange(len(truth))
    own = table[rows, truth][:, None]
    others = np.ones_like(table, dtype=bool)
    others[rows, truth] = False
    wins = ((own > table) + 0.5 * (own == table)) * others
    return wins.sum(axis=1) / others.sum(axis=1), (table.argmax(axis=1) == truth).astype(float)
