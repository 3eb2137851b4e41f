"""Judge resources: the embedded feature judge and the LLM rubric judge, built once per resource.

Assets ask for a judge resource and call `.judge()` to get a `lib.judges` judge; evaluation can
hold both side by side to report how well they agree.
"""

# No `from __future__ import annotations`: dagster must see ResourceDependency[...] unquoted.
import functools
import threading
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from mascot_dag.lib.judges import EmbeddedJudge, LLMJudge
from mascot_dag.resources.llm import ChatModelResource


class EmbeddedJudgeResource(dg.ConfigurableResource):
    """Deterministic CPU judge (MiniLM embeddings, VADER/NRC lexicons, format checks)."""

    device: str = Field(
        default="cpu", description="Where MiniLM runs; CPU keeps scores deterministic."
    )

    _judge: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def judge(self) -> EmbeddedJudge:
        with self._lock:
            if self._judge is None:
                self._judge = _shared_embedded(self.device)
            return self._judge


@functools.lru_cache(maxsize=2)
def _shared_embedded(device: str) -> EmbeddedJudge:
    """One embedded judge per process (it is deterministic and stateless apart from caches)."""
    return EmbeddedJudge(device=device)


class LLMJudgeResource(dg.ConfigurableResource):
    """Rubric judge through a chat model resource (strict JSON, retried, failures recorded)."""

    chat: dg.ResourceDependency[ChatModelResource]
    name: str = Field(default="llm", description="Judge name stored with every score.")
    max_retries: int = Field(default=1, description="Repair attempts after an invalid reply.")
    max_new_tokens: int = Field(default=320, description="Token budget of one judge reply.")

    _judge: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def judge(self) -> LLMJudge:
        with self._lock:
            if self._judge is None:
                self._judge = LLMJudge(
                    self.chat.generate,
                    name=self.name,
                    max_retries=self.max_retries,
                    max_new_tokens=self.max_new_tokens,
                )
            return self._judge
