"""Judges: score agent responses (5 agent criteria) and dialogue blocks (4 collective criteria).

`EmbeddedJudge` is deterministic and CPU-only (MiniLM embeddings, lexicons, format checks);
`LLMJudge` asks a chat model for strict JSON rubric scores. Both follow `Judge` in base.py.
"""

from mascot_dag.lib.judges.base import BlockItem, Judge, ResponseItem, mean_score
from mascot_dag.lib.judges.embedded import EmbeddedJudge
from mascot_dag.lib.judges.llm_judge import LLMJudge, extract_json, parse_scores

__all__ = [
    "BlockItem",
    "EmbeddedJudge",
    "Judge",
    "LLMJudge",
    "ResponseItem",
    "extract_json",
    "mean_score",
    "parse_scores",
]
