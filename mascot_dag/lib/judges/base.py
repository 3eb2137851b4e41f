"""The judge interface: what every judge (embedded features, LLM rubric) is given and returns.

A judge scores single agent responses on the 5 AGENT_CRITERIA and whole dialogue blocks on the
4 COLLECTIVE_CRITERIA (both in lib/types.py, in that order), and picks the best of several
dialogues for three-way comparisons. Scores are 1-5 or explicitly failed (`Score.status`), never
a silent default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from mascot_dag.lib.data.personas import PersonaCard
from mascot_dag.lib.types import Score

USER_SPEAKER = "user"


@dataclass
class ResponseItem:
    """One agent response to judge: what it answered, who said it, in which group, after what."""

    context_text: str
    persona: PersonaCard
    roster: list[PersonaCard]
    response: str
    history: list[str] = field(default_factory=list)  # earlier turns' texts, oldest first


@dataclass
class BlockItem:
    """One N-turn dialogue block: turns are {"speaker": persona_id | "user", "text": str}."""

    context_text: str
    roster: list[PersonaCard]
    turns: list[dict]


@runtime_checkable
class Judge(Protocol):
    name: str

    def score_responses(self, items: list[ResponseItem]) -> list[list[Score]]:
        """Per item, one Score per AGENT_CRITERIA entry, in that order."""
        ...

    def score_blocks(self, items: list[BlockItem]) -> list[list[Score]]:
        """Per item, one Score per COLLECTIVE_CRITERIA entry, in that order."""
        ...

    def pick_best(self, context_text: str, options: list[list[dict]]) -> int | None:
        """Index of the best dialogue among `options` (as shown, in order); None if it failed."""
        ...


def mean_score(scores: list[Score]) -> float | None:
    """Mean of the ok scores (failed ones are left out, not counted as zero); None if none ok."""
    ok = [s.score for s in scores if s.status == "ok" and s.score is not None]
    return sum(ok) / len(ok) if ok else None
