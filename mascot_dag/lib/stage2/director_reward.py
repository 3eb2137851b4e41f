"""The director's GRPO rewards (Stage 2): the group judge's score of the block a directive leads to.

Each training prompt is one dialogue state from the rollouts (the director's view just before an
agent turn). For every sampled directive the chosen agent's turn is generated for real (with its
aligned adapter) and the dialogue is rolled forward to `horizon` new turns (`roll_blocks`); the
block (the new turns, preceded by the last turns of the state when horizon < N) is scored by the
group judge on the collective rubric: reward = mean ok score mapped from 1-5 to 0-1
(`block_reward`). horizon = 1 is the cheap form (one new turn after N-1 old ones); horizon = N
judges a real N-turn block that starts with the directive's turn.

The turns after the directive's own are FIXED, not sampled from a director: the next speaker is the
engine's fallback rule (least-used allowed persona, `lib.director.fallback_speaker`) with a card
behaviour as the action, and every turn's sampling seed depends only on the dialogue and position.
So the completions of one GRPO group share their continuation policy and seeds, and the reward
differences inside a group come from the directive and what it sets in motion, not from a second
director's sampling noise; it also costs no director generations. (The policy being trained is not
reachable from a reward function: TRL holds its weights.)

A directive that does not parse, names no roster member, or repeats the last speaker when repeats
are forbidden gets 0, so the director learns valid, varied directives before anything else. A
separate format reward (1/0) makes validity visible as its own curve.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mascot_dag.lib.dialogue.director import (
    Directive,
    DirectiveError,
    director_messages,
    fallback_directive,
    fallback_speaker,
    parse_directive,
)
from mascot_dag.lib.dialogue.engine import (
    DialogueState,
    agent_request,
    clean_agent_text,
    user_request,
)
from mascot_dag.lib.dialogue.spec import DialogueConfig, DialogueRecord, DialogueSpec
from mascot_dag.lib.judges.base import BlockItem
from mascot_dag.lib.stage1.rewards import completion_text
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


def block_reward(scores) -> float | None:
    """Mean of a block's ok collective scores mapped from 1-5 to 0-1; None when none is ok."""
    ok = [s.score for s in scores if s.status == "ok" and s.score is not None]
    return (sum(ok) / len(ok) - 1.0) / 4.0 if ok else None


def roll_blocks(
    jobs: list[tuple[DirectorState, Directive]], generate, config: DialogueConfig, horizon: int
) -> list[list[dict]]:
    """Per (state, directive): the `horizon` turns that follow, starting with the directive's
    agent turn. Later agent turns take the fallback rule's speaker and a card behaviour (see the
    module docstring); in support mode the simulated user replies after every
    `config.agents_per_round` agent turns, as in `lib.dialogue.run_dialogues`. Lockstep: one
    chat call for the agent turns and one for the user turns of all jobs per step."""
    if horizon < 1:
        raise ValueError(f"director reward horizon must be >= 1, got {horizon}")
    sts = [DialogueState(s.spec, turns=[dict(t) for t in s.turns],
                  n_agent=sum(t["role"] == "agent" for t in s.turns)) for s, _ in jobs]
    starts = [len(st.turns) for st in sts]
    agent_next = [True] * len(jobs)

    def new(k: int) -> int:
        return len(sts[k].turns) - starts[k]

    while active := [k for k in range(len(jobs)) if new(k) < horizon]:
        agents = [k for k in active if agent_next[k]]
        users = [k for k in active if not agent_next[k]]
        reqs, picked = [], []
        for k in agents:
            st = sts[k]
            if new(k) == 0:
                d = jobs[k][1]
            else:
                pid = fallback_speaker(st.spec.roster, st.history(), len(st.turns),
                                       st.last_agent, config.no_repeat)
                card = next(c for c in st.spec.roster if c.persona_id == pid)
                d = fallback_directive(card, st.spec.mode, len(st.turns))
            card = next(c for c in st.spec.roster if c.persona_id == d.speaker)
            directive = {"speaker": d.speaker, "action": d.action, "tone": d.tone}
            reqs.append(agent_request(st, card, directive, config, len(st.turns)))
            picked.append(card)
        for k, card, res in zip(agents, picked, generate(reqs) if reqs else [], strict=True):
            st = sts[k]
            st.add("agent", card.persona_id, clean_agent_text(res.text, st.spec.roster), "reward")
            st.n_agent += 1
            agent_next[k] = not (st.spec.mode == "support"
                                 and st.n_agent % config.agents_per_round == 0)
        ureqs = [user_request(sts[k], config, len(sts[k].turns)) for k in users]
        for k, res in zip(users, generate(ureqs) if ureqs else [], strict=True):
            st = sts[k]
            st.add("user", "user", clean_agent_text(res.text, st.spec.roster), "reward")
            agent_next[k] = True
    return [[{"speaker": t["speaker"], "text": t["text"]} for t in st.turns[start:]]
            for st, start in zip(sts, starts, strict=True)]


class GroupBlockReward(_Base):
    """Group-judge score (0-1) of the block that starts with the agent turn the directive produced
    and runs `horizon` turns forward (see the module docstring); horizon 1 = one new turn after
    the state's last N-1. `last_blocks` keeps the blocks of the latest call (for inspection)."""

    __name__ = "group_block"

    def __init__(self, states, generate, judge, config: DialogueConfig, block_size: int,
                 horizon: int = 1) -> None:
        super().__init__(states, config.no_repeat)
        if block_size < 1 or horizon < 1:
            raise ValueError(f"block_size and director_reward_horizon must be >= 1, got "
                             f"{block_size} and {horizon}")
        self.generate, self.judge, self.config = generate, judge, config
        self.block_size, self.horizon = block_size, horizon
        self.last_blocks: list[list[dict]] = []

    def __call__(self, completions: Sequence[Any], prompts: Sequence[Any], **kwargs: Any):
        jobs, rewards = [], [0.0] * len(completions)
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            state, d = self._directive(p, c)
            if d is not None:
                jobs.append((i, state, d))
        self.last_blocks = []
        if not jobs:
            return rewards
        rolled = roll_blocks([(s, d) for _, s, d in jobs], self.generate, self.config,
                             self.horizon)
        items = []
        for (_, state, _), new in zip(jobs, rolled, strict=True):
            prev = [{"speaker": t["speaker"], "text": t["text"]} for t in state.turns]
            keep = self.block_size - len(new)  # old turns that pad a short horizon to N
            block = (prev[-keep:] if keep > 0 else []) + new
            items.append(BlockItem(state.spec.context.text, state.spec.roster, block))
            self.last_blocks.append(block)
        for (i, _, _), scores in zip(jobs, self.judge.score_blocks(items), strict=True):
            r = block_reward(scores)
            rewards[i] = r if r is not None else 0.0
        return rewards
