"""Plain data types shared by every stage (no dagster, no torch).

These are the contracts between loaders, backends, judges, the director and the assets: keep them
small and serialisable (dicts/JSON), because most of them end up as DuckDB rows.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Literal

Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": str}


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one generation; part of the generation cache key."""

    max_new_tokens: int = 48
    temperature: float = 0.8
    top_p: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion to run. `adapter` names a loaded LoRA adapter (None = base model)."""

    messages: tuple[Message, ...]
    sampling: SamplingParams = SamplingParams()
    adapter: str | None = None
    # A JSON schema (as JSON text, so the request stays hashable) the reply must match: structured
    # outputs, enforced by the backend (lib/llm/structured.py lists the supported subset).
    json_schema: str | None = None

    def cache_key(self, model: str, adapter_version: str | None) -> str:
        """Stable key: model, adapter version, messages, sampling parameters and seed, and the
        schema when there is one (requests without a schema keep the keys they always had)."""
        payload = {
            "model": model,
            "adapter": self.adapter,
            "adapter_version": adapter_version,
            "messages": list(self.messages),
            "sampling": asdict(self.sampling),
        }
        if self.json_schema is not None:
            payload["json_schema"] = self.json_schema
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass
class ChatResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool = False


@dataclass
class Context:
    """One human-grounded context: an ED conversation or a QMSum (meeting, topic)."""

    context_id: str
    source: Literal["empatheticdialogues", "qmsum"]
    domain: str  # "emotional_support" for ED; "academic" | "committee" | "product" for QMSum
    situation: str  # ED: the situation (prompt); QMSum: the topic
    text: str  # what agents see: ED situation + opening turn; QMSum: speaker-tagged excerpt
    emotion: str | None = None
    valence: str | None = None  # "positive" | "negative" | "neutral" (ED only)
    meeting_id: str | None = None
    topic: str | None = None
    turns: list[dict[str, str]] = field(default_factory=list)  # {"speaker": ..., "text": ...}
    queries: list[dict[str, str]] = field(default_factory=list)  # {"query": ..., "answer": ...}
    source_file: str = ""
    source_ref: str = ""  # line numbers in source_file
    split: str = ""  # filled by lib.split.assign_split


@dataclass
class Score:
    """One judge's score of one criterion. score is None exactly when status == "failed"."""

    criterion: str
    score: float | None
    rationale: str
    status: Literal["ok", "failed"] = "ok"
    raw_output: str = ""

    def __post_init__(self) -> None:
        if self.status == "ok" and (self.score is None or not 1.0 <= self.score <= 5.0):
            raise ValueError(f"{self.criterion}: an ok score must lie in [1, 5], got {self.score}")
        if self.status == "failed" and self.score is not None:
            raise ValueError(f"{self.criterion}: a failed judgment carries no score")


AGENT_CRITERIA: tuple[str, ...] = (
    "emotional_expressiveness",
    "empathetic_support_quality",
    "consistency",
    "response_relevance",
    "social_contribution",
)
COLLECTIVE_CRITERIA: tuple[str, ...] = (
    "fidelity",
    "originality_specificity",
    "relevance_coherence",
    "engagement_contribution",
)


def to_100(score_1_5: float) -> float:
    """Reports show judge scores on 0-100: 1 -> 0, 5 -> 100."""
    return (score_1_5 - 1.0) * 25.0
