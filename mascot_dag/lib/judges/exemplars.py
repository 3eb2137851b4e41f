"""What the embedded judge's persona centroids average (`persona_exemplars`).

"card": the card's description, behaviours and examples. "references": the card's examples and
the persona's REWARD share of its set's reference utterances (`readers.split_references` with
`reward_reference_share`), so the reward learns how each persona talks and never a text that
the probe's readers learn from. A set (or persona) without references falls back to the card,
with a warning and a note, never silently.
"""

from __future__ import annotations

import warnings

from mascot_dag.lib.data.personas import PersonaCard

EXEMPLARS = ("card", "references")


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
            from mascot_dag.lib.stage1.readers import NoReferenceUtterances, reward_references

            try:
                self._references[pset] = reward_references(pset, self.share)
            except NoReferenceUtterances as e:
                self._references[pset] = {}
                self._fall_back(pset, f"persona_exemplars='references': {e}; the embedded "
                                      f"judge's {pset} centroids fall back to the card")
        refs = self._references[pset].get(card.persona_id, [])
        if not refs and self._references[pset]:
            self._fall_back(f"{pset}/{card.persona_id}",
                            f"persona_exemplars='references': no reference utterances for "
                            f"{card.persona_id} of {pset}; its centroid falls back to the card")
        return refs

    def _fall_back(self, key: str, note: str) -> None:
        if key not in self.notes:  # once per set (or persona)
            self.notes[key] = note
            warnings.warn(note, stacklevel=4)

    def rationale(self, card: PersonaCard) -> str:
        """What the consistency rationale says of the exemplars (nothing with "card")."""
        if self.kind == "card":
            return ""
        refs = self.reward_share(card)
        return (f" exemplars=references({len(refs)})" if refs
                else " exemplars=card (no reference utterances: fallback)")
