"""The director's GRPO rewards (Stage 2): the group judge's score of the block a directive leads to.

Each training prompt is one dialogue state from the rollouts (the director's view just before an
agent turn). For every sampled directive the chosen agent's next turn is generated for real (with
its aligned adapter), appended to the last N-1 turns, and the block is scored by the group judge
on the collective rubric: reward = mean ok score mapped from 1-5 to 0-1. A directive that does not
parse, names no roster member, or repeats the last speaker when repeats are forbidden gets 0, so
the director learns valid, varied directives before anything else. A separate format reward (1/0)
makes validity visible as its own curve.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mascot_dag.lib.dialogue import (
    DialogueConfig,
    DialogueRecord,
    DialogueSpec,
    _agent_request,
    _State,
    clean_agent_text,
)
from mascot_dag.lib.director import DirectiveError, director_messages, parse_directive
from mascot_dag.lib.judges.base import BlockItem
from mascot_dag.lib.rewards import completion_text
from mascot_dag.lib.types import Message


def prompt_key(messages: Sequence[Any]) -> str:
    """Identify a state by its last user message (it holds the context and the dialogue so far)."""
    if isinstance(messages, str):
        text = messages
    else:
        text = next((m["content"] for m in reversed(list(messages)) if m.get("role") == "user"), "")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class DirectorState:
    spec: DialogueSpec
    turns: list[dict]  # turn rows before the decision
    last_agent: str | None
    messages: list[Message]


def director_states(
    records: list[DialogueRecord], specs: dict[str, DialogueSpec], no_repeat: bool = True
) -> list[DirectorState]:
    """Every agent-turn decision point of the rollouts, as director prompts."""
    states = []
    for rec in records:
        spec = specs[rec.dialogue["dialogue_id"]]
        for i, turn in enumerate(rec.turns):
            if turn["role"] != "agent":
                continue
            before = rec.turns[:i]
            last = next((t["speaker"] for t in reversed(before) if t["role"] == "agent"), None)
            history = [{"speaker": t["speaker"], "text": t["text"]} for t in before]
            msgs = director_messages(spec.context.text, spec.roster, history, spec.mode,
                                     avoid_speaker=last if no_repeat else None)
            states.append(DirectorState(spec, before, last, msgs))
    return states


class _Base:
    def __init__(self, states: list[DirectorState], no_repeat: bool = True) -> None:
        self.states = {prompt_key(s.messages): s for s in states}
        self.no_repeat = no_repeat

    def _directive(self, prompt: Any, completion: Any):
        state = self.states.get(prompt_key(prompt))
        if state is None:
            raise KeyError("director reward got a prompt that is not one of its dialogue states")
        try:
            d = parse_directive(completion_text(completion), state.spec.roster)
        except DirectiveError:
            return state, None
        if self.no_repeat and d.speaker == state.last_agent:
            return state, None
        return state, d


class DirectiveFormatReward(_Base):
    """1.0 for a valid directive (parses, on the roster, not a forbidden repeat), else 0.0."""

    __name__ = "directive_format"

    def __call__(self, completions: Sequence[Any], prompts: Sequence[Any], **kwargs: Any):
        return [0.0 if self._directive(p, c)[1] is None else 1.0
                for p, c in zip(prompts, completions, strict=True)]


class GroupBlockReward(_Base):
    """Group-judge score (0-1) of the block that ends with the agent turn the directive produced."""

    __name__ = "group_block"

    def __init__(self, states, generate, judge, config: DialogueConfig, block_size: int) -> None:
        super().__init__(states, config.no_repeat)
        self.generate, self.judge, self.config, self.block_size = generate, judge, config, block_size

    def __call__(self, completions: Sequence[Any], prompts: Sequence[Any], **kwargs: Any):
        jobs, rewards = [], [0.0] * len(completions)
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            state, d = self._directive(p, c)
            if d is not None:
                jobs.append((i, state, d))
        if not jobs:
            return rewards
        reqs, cards = [], []
        for _, state, d in jobs:
            st = _State(state.spec, turns=list(state.turns))
            card = next(x for x in state.spec.roster if x.persona_id == d.speaker)
            directive = {"speaker": d.speaker, "action": d.action, "tone": d.tone}
            reqs.append(_agent_request(st, card, directive, self.config, len(state.turns)))
            cards.append(card)
        results = self.generate(reqs)
        items = []
        for (_, state, d), res in zip(jobs, results, strict=True):
            new = {"speaker": d.speaker, "text": clean_agent_text(res.text, state.spec.roster)}
            prev = [{"speaker": t["speaker"], "text": t["text"]} for t in state.turns]
            block = prev[-(self.block_size - 1):] + [new] if self.block_size > 1 else [new]
            items.append(BlockItem(state.spec.context.text, state.spec.roster, block))
        for (i, _, _), scores in zip(jobs, self.judge.score_blocks(items), strict=True):
            ok = [s.score for s in scores if s.status == "ok" and s.score is not None]
            rewards[i] = (sum(ok) / len(ok) - 1.0) / 4.0 if ok else 0.0
        return rewards
