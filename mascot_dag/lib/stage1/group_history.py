"""Stage 1 prompts that show the group: earlier turns of the OTHER agents before this persona's.

Stage 1 trained every adapter on the first agent request of a dialogue (the opening only), with a
reward that scores a reply against its persona and the context. In a group the adapters then say
the same on-topic thing one after another (docs/experiments/2026-12-04-evaluation-3.md:
embedding redundancy
+0.10 against the un-adapted group, collective engagement -20 points). With `group_history_turns`
> 0 a share of the GRPO prompts carries 1..N earlier agent turns, taken from the other personas'
Stage 1 candidates for the same context (what pi_SFT says there), in exactly the request form
the dialogue engine serves (`lib.dialogue.agent_messages`), and `lib.rewards.NoveltyReward`
rewards what the reply adds to them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import Literal

from mascot_dag.lib.data.personas import PersonaCard
from mascot_dag.lib.dialogue.engine import (
    agent_messages,
    clean_agent_text,
    context_mode,
    opening_history,
)
from mascot_dag.lib.types import Context, Message


def earlier_turns(
    context_id: str,
    persona_id: str,
    n_turns: int,
    pool: Mapping[str, Sequence[str]],
    seed: int,
) -> list[tuple[str, str]]:
    """`n_turns` (speaker id, text) turns by OTHER personas for one context, in speaking order:
    distinct speakers drawn without replacement, each with one of its non-empty candidates.
    `pool` maps persona id -> its candidate texts for this context. Deterministic in (seed,
    context, persona); fewer turns when fewer other personas have a candidate."""
    rng = random.Random(f"{seed}:{context_id}:{persona_id}")
    others = sorted(p for p, texts in pool.items()
                    if p != persona_id and any(t.strip() for t in texts))
    rng.shuffle(others)
    turns = []
    for speaker in others[:n_turns]:
        texts = [t for t in pool[speaker] if t.strip()]
        turns.append((speaker, texts[rng.randrange(len(texts))]))
    return turns


def history_sizes(n_contexts: int, max_turns: int) -> list[int]:
    """Earlier agent turns per prompt: 0, 1, .., max_turns in turn, so a share of the prompts
    stays the opening request (the adapter still serves the first turn of every dialogue)."""
    if max_turns < 0:
        raise ValueError(f"group_history_turns must be >= 0, got {max_turns}")
    return [i % (max_turns + 1) for i in range(n_contexts)]


def group_agent_messages(
    card: PersonaCard,
    context: Context,
    roster: list[PersonaCard],
    prompt_style: str,
    earlier: Sequence[tuple[str, str]],
    mode: Literal["support", "meeting"] | None = None,
) -> list[Message]:
    """The agent request after the opening and `earlier` agent turns (no directive): the
    opening request (`opening_agent_messages`) when `earlier` is empty. The earlier texts are
    cleaned as the dialogue engine cleans a turn (their own speaker label removed). `mode`
    None: the context's own (`context_mode`: a meeting's opening for QMSum contexts)."""
    history = opening_history(context, mode or context_mode(context)) + [
        {"speaker": speaker, "text": clean_agent_text(text, roster)} for speaker, text in earlier
    ]
    return list(agent_messages(card, context, history, roster, prompt_style))


def earlier_column(earlier: Sequence[tuple[str, str]], roster: list[PersonaCard]) -> str:
    """The `earlier_turns` dataset column NoveltyReward reads: a JSON list of the cleaned texts."""
    return json.dumps([clean_agent_text(text, roster) for _, text in earlier])


def candidate_pools(rows) -> dict[str, dict[str, list[str]]]:
    """context id -> persona id -> candidate texts, from (context_id, persona_id, text) rows."""
    pools: dict[str, dict[str, list[str]]] = {}
    for cid, pid, text in rows:
        pools.setdefault(cid, {}).setdefault(pid, []).append(text)
    return pools


def group_prompts(
    card: PersonaCard,
    roster: list[PersonaCard],
    contexts: Sequence[Context],
    prompt_style: str,
    max_turns: int,
    seed: int,
    pools: Mapping[str, Mapping[str, Sequence[str]]],
) -> tuple[list[list[Message]], list[str]]:
    """One persona's GRPO prompts and, per prompt, the JSON list of earlier agent turns it shows
    (the `earlier_turns` column NoveltyReward reads): 0..max_turns turns of the other personas'
    candidates in turn (`history_sizes`). ValueError names the contexts without candidates."""
    sizes = history_sizes(len(contexts), max_turns)
    missing = [c.context_id for c, n in zip(contexts, sizes, strict=True)
               if n and c.context_id not in pools]
    if missing:
        raise ValueError(f"group_history_turns={max_turns} needs the other personas' candidates; "
                         f"none for train contexts {missing[:5]}: materialise "
                         "candidate_responses for every persona")
    prompts, earlier = [], []
    for c, n in zip(contexts, sizes, strict=True):
        turns = earlier_turns(c.context_id, card.persona_id, n, pools.get(c.context_id, {}),
                              seed) if n else []
        prompts.append(group_agent_messages(card, c, roster, prompt_style, turns))
        earlier.append(earlier_column(turns, roster))
    return prompts, earlier
