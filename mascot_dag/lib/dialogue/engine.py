"""Hierarchical group dialogue (MASCOT Stage 2): director -> chosen agent -> simulated user.

Many dialogues are generated in LOCKSTEP so that every chat call is a batch (HF batched generation
is ~5x faster than one prompt at a time on CPU). One step of all unfinished dialogues is:

1. director requests of every dialogue in ONE chat call (`config.director_adapter`); the repair
   retries of those that failed in one more call (see `lib.director.DirectorTurn`);
2. the chosen agents' turns in ONE chat call, each with `persona_adapters.get(speaker)`: a persona
   without an adapter speaks through the base model with its persona prompt (model_used
   "base+prompt"; "base+generic" when persona grounding is ablated);
3. support mode: after every `agents_per_round` agent turns, the simulated users in ONE call.

Openings: support mode starts with the user's turn taken from the context (its first utterance,
else the situation); meeting mode starts with a "moderator" turn holding the context's first query
(else the topic). Both are data, not generated (model_used "context", role "user").

Agent prompt: the persona system prompt (or a generic assistant one for MASCOT-P) followed by the
directive ("Your director asks you to: <action>, in a <tone> tone."), and ONE user message holding
the context and the last `HISTORY_TURNS` turns as "Name: text" lines. A single transcript
message, rather than alternating user/assistant messages, because in a group the other agents'
turns are not this model's own: as "assistant" messages the model would take them as its voice.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from mascot_dag.lib.data.personas import PersonaCard, system_prompt
from mascot_dag.lib.data.users import user_system_prompt
from mascot_dag.lib.dialogue.director import HISTORY_TURNS, DirectorTurn, format_history
from mascot_dag.lib.dialogue.spec import (
    ChatFn,
    DialogueConfig,
    DialogueRecord,
    DialogueSpec,
)
from mascot_dag.lib.types import ChatRequest, Context, Message, SamplingParams

CONTEXT_CHARS = 1200
GENERIC_SYSTEM = (
    "You are a helpful assistant taking part in a group conversation. "
    "Reply with one short turn (2-3 sentences)."
)


def _seed(base: int, turn_idx: int, kind: int) -> int:
    """Per-request seed from the dialogue seed, the turn and the request kind (reproducible)."""
    return (base * 1_000_003 + turn_idx * 7_919 + kind) % 2**31


# "<name>:" or "<name> (<id>):", optionally in markdown bold or quotes.
_LABEL = re.compile(
    r"^[\s*_\"'>-]*([A-Za-z][A-Za-z0-9' ._-]{0,40}?)\s*(?:\(([a-z0-9_ ]{1,40})\))?[\s*_\"']*:\s*"
)


def clean_agent_text(text: str, roster: list[PersonaCard]) -> str:
    """Strip the speaker label the model writes for itself; cut where it starts another speaker.

    A label is "<name>:" at the start of a line where name is a roster name or id (with or without
    "The"), user, moderator, assistant or companion. The first line's label is removed (models
    prefix their own name); any LATER line opening with a label ends the turn, because from there
    on the model is writing the next speaker's part. If that leaves nothing, the first non-empty
    line with its label removed is kept: a turn is never silently empty when the model said a thing.
    """
    names = {"user", "moderator", "assistant", "companion", "you"}
    for c in roster:
        for n in (c.persona_id, c.name):
            low = n.lower()
            names |= {low, low.removeprefix("the "), low.replace("_", " ")}

    def label(line: str) -> re.Match | None:
        m = _LABEL.match(line)
        return m if m and m.group(1).strip().lower() in names else None

    lines = text.strip().splitlines()
    kept: list[str] = []
    for i, line in enumerate(lines):
        m = label(line)
        if m and i > 0:
            break
        kept.append(line[m.end() :] if m else line)
    out = "\n".join(kept).strip()
    if not out:  # e.g. "The Anchor:" alone, then another speaker: keep the first words said
        stripped = (ln[m.end() :] if (m := _LABEL.match(ln)) else ln for ln in lines)
        out = next((x.strip() for x in stripped if x.strip()), "")
    return out


@dataclass
class DialogueState:
    spec: DialogueSpec
    turns: list[dict] = field(default_factory=list)
    directives: list[dict] = field(default_factory=list)
    n_agent: int = 0
    rng: random.Random = field(default_factory=random.Random)

    @property
    def done(self) -> bool:
        return self.n_agent >= self.spec.n_agent_turns

    @property
    def last_agent(self) -> str | None:
        return next((t["speaker"] for t in reversed(self.turns) if t["role"] == "agent"), None)

    def history(self) -> list[dict]:
        return [{"speaker": t["speaker"], "text": t["text"]} for t in self.turns]

    def add(self, role: str, speaker: str, text: str, model_used: str) -> int:
        idx = len(self.turns)
        self.turns.append(
            {
                "dialogue_id": self.spec.dialogue_id,
                "turn_idx": idx,
                "role": role,
                "speaker": speaker,
                "text": text,
                "model_used": model_used,
            }
        )
        return idx


def _opening_of(ctx: Context, mode: str) -> tuple[str, str]:
    if mode == "support":
        first = ctx.turns[0]["text"] if ctx.turns and ctx.turns[0].get("text") else ctx.situation
        return "user", " ".join(first.split())
    query = ctx.queries[0].get("query") if ctx.queries else None
    return "moderator", " ".join((query or ctx.topic or ctx.situation).split())


def _opening(spec: DialogueSpec) -> tuple[str, str]:
    return _opening_of(spec.context, spec.mode)


def agent_messages(
    card: PersonaCard,
    context: Context,
    history: list[dict],
    roster: list[PersonaCard],
    prompt_style: str,
    directive: dict | None = None,
    persona_grounding: bool = True,
) -> tuple[Message, ...]:
    """The messages an agent answers in a group dialogue (system: persona + directive; user:
    context, transcript, ask). Public because Stage 1 trains the persona adapters on exactly this
    form (`opening_agent_messages`): an adapter serves inside this request, so it learns there."""
    if persona_grounding:
        system = system_prompt(card, prompt_style, roster)
        ask = f"Write your next turn as {card.name}."
    else:
        system, ask = GENERIC_SYSTEM, "Write your next turn."
    if directive is not None:
        # In the system prompt, not after the transcript: the 135M model parrots an instruction
        # that closes the user message ("I'll respond to ... in a warm tone").
        system += (
            f"\nYour director asks you to: {directive['action']}, in a {directive['tone']} tone."
        )
    transcript = format_history(history, roster, HISTORY_TURNS, with_ids=False)
    user = (
        f"Context:\n{' '.join(context.text.split())[:CONTEXT_CHARS]}\n\n"
        f"Conversation so far:\n{transcript}\n\n{ask}"
    )
    return ({"role": "system", "content": system}, {"role": "user", "content": user})


def context_mode(context: Context) -> Literal["support", "meeting"]:
    """The mode a context is spoken in: its source says (as `lib.dialogue.rollout.build_specs`
    and a user's contexts file decide it): EmpatheticDialogues support, QMSum meeting."""
    return "support" if context.source == "empatheticdialogues" else "meeting"


def opening_history(context: Context, mode: Literal["support", "meeting"]) -> list[dict]:
    """The transcript before the first agent turn: the context's opening (see `_opening`)."""
    speaker, text = _opening_of(context, mode)
    return [{"speaker": speaker, "text": text}]


def opening_agent_messages(
    card: PersonaCard,
    context: Context,
    roster: list[PersonaCard],
    prompt_style: str,
    mode: Literal["support", "meeting"] | None = None,
) -> list[Message]:
    """The first agent request of a dialogue on `context`, without a directive: the prompt Stage 1
    samples candidates on, trains the adapters on and probes them on (`mode` None: the
    context's own, `context_mode`, so a workplace persona trains on the meeting's opening)."""
    history = opening_history(context, mode or context_mode(context))
    return list(agent_messages(card, context, history, roster, prompt_style))


def agent_request(
    st: DialogueState, card: PersonaCard, directive: dict | None, config: DialogueConfig, idx: int
) -> ChatRequest:
    messages = agent_messages(
        card, st.spec.context, st.history(), st.spec.roster, config.prompt_style, directive,
        config.persona_grounding,
    )
    sampling = SamplingParams(
        max_new_tokens=config.max_new_tokens_agent,
        temperature=config.temperature,
        seed=_seed(st.spec.seed, idx, 1),
    )
    return ChatRequest(messages, sampling, config.persona_adapters.get(card.persona_id))


def user_request(st: DialogueState, config: DialogueConfig, idx: int) -> ChatRequest:
    spec = st.spec
    situation = spec.context.situation or spec.context.text[:300]
    if spec.user_profile is not None:
        system = user_system_prompt(spec.user_profile, situation)
    else:
        system = (
            "You are role-playing a real person talking to a group of supportive companions.\n"
            f"Your situation: {' '.join(situation.split())}\n"
            "Reply to what the companions just said with 1-2 sentences, as yourself."
        )
    recent = format_history(st.history(), spec.roster, config.agents_per_round)
    user = f"The companions just said:\n{recent}\n\nYour reply:"
    sampling = SamplingParams(
        max_new_tokens=config.max_new_tokens_user,
        temperature=config.temperature,
        seed=_seed(spec.seed, idx, 2),
    )
    return ChatRequest(
        ({"role": "system", "content": system}, {"role": "user", "content": user}), sampling
    )


def _pick_without_director(st: DialogueState, config: DialogueConfig) -> str:
    ids = [c.persona_id for c in st.spec.roster]
    if config.speaker_policy == "round_robin":
        return ids[st.n_agent % len(ids)]
    last = st.last_agent
    allowed = [p for p in ids if not (config.no_repeat and p == last)] or ids
    return st.rng.choice(allowed)


def direct_turns(
    states: list[DialogueState], generate: ChatFn, config: DialogueConfig
) -> list[dict]:
    """Director decisions for all states: one chat call per attempt round (first, then retries)."""
    turns = [
        DirectorTurn(
            st.spec.context.text,
            st.spec.roster,
            st.history(),
            st.spec.mode,
            len(st.turns),
            st.last_agent,
            config.no_repeat,
            config.structured_director,
        )
        for st in states
    ]
    temperature = (
        config.temperature if config.director_temperature is None else config.director_temperature
    )
    attempt = 0
    while todo := [(st, t) for st, t in zip(states, turns, strict=True) if t.pending()]:
        reqs = [
            ChatRequest(
                tuple(t.pending() or ()),
                SamplingParams(
                    t.max_new_tokens(config.max_new_tokens_director),
                    temperature,
                    seed=_seed(st.spec.seed, len(st.turns), 10 + attempt),
                ),
                config.director_adapter,
                t.json_schema(),
            )
            for st, t in todo
        ]
        for (_, t), res in zip(todo, generate(reqs), strict=True):
            t.feed(res.text)
        attempt += 1
    return [t.record() for t in turns]


def run_dialogues(
    specs: list[DialogueSpec],
    chat: ChatFn | Any,
    config: DialogueConfig,
    stage: str = "rollout",
    method: str = "mascot",
) -> list[DialogueRecord]:
    """Generate every spec's dialogue in lockstep; `chat` is a chat function or has `.generate`."""
    generate: ChatFn = chat.generate if hasattr(chat, "generate") else chat
    ids = [s.dialogue_id for s in specs]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"run_dialogues: duplicate dialogue_id in specs: {dupes}")
    states = [DialogueState(s, rng=random.Random(s.seed)) for s in specs]
    for st in states:
        speaker, text = _opening(st.spec)
        st.add("user", speaker, text, "context")

    while active := [st for st in states if not st.done]:
        if config.speaker_policy == "director":
            chosen = direct_turns(active, generate, config)
        else:
            chosen = [None] * len(active)
        jobs = []
        for st, d in zip(active, chosen, strict=True):
            pid = d["speaker"] if d else _pick_without_director(st, config)
            card = next(c for c in st.spec.roster if c.persona_id == pid)
            jobs.append((st, card, d, len(st.turns)))
        results = generate([agent_request(st, c, d, config, i) for st, c, d, i in jobs])
        for (st, card, d, idx), res in zip(jobs, results, strict=True):
            adapter = config.persona_adapters.get(card.persona_id)
            used = adapter or ("base+prompt" if config.persona_grounding else "base+generic")
            st.add("agent", card.persona_id, clean_agent_text(res.text, st.spec.roster), used)
            st.n_agent += 1
            if d is not None:
                st.directives.append({"dialogue_id": st.spec.dialogue_id, "turn_idx": idx, **d})

        users = [
            st
            for st in active
            if st.spec.mode == "support"
            and not st.done
            and st.n_agent % config.agents_per_round == 0
        ]
        if users:
            reqs = [user_request(st, config, len(st.turns)) for st in users]
            for st, res in zip(users, generate(reqs), strict=True):
                st.add("user", "user", clean_agent_text(res.text, st.spec.roster), "base+user")
    return [_record(st, config, stage, method) for st in states]


def _record(st: DialogueState, config: DialogueConfig, stage: str, method: str) -> DialogueRecord:
    spec = st.spec
    models = {
        "personas": {
            c.persona_id: config.persona_adapters.get(c.persona_id) or "base" for c in spec.roster
        },
        "director": (config.director_adapter or "base")
        if config.speaker_policy == "director"
        else None,
        "speaker_policy": config.speaker_policy,
        "persona_grounding": config.persona_grounding,
        "prompt_style": config.prompt_style,
    }
    row = {
        "dialogue_id": spec.dialogue_id,
        "stage": stage,
        "method": method,
        "context_id": spec.context.context_id,
        "mode": spec.mode,
        "user_profile": spec.user_profile.type if spec.user_profile else None,
        "seed": spec.seed,
        "n_turns": len(st.turns),
        "models": json.dumps(models, sort_keys=True),
    }
    return DialogueRecord(row, st.turns, st.directives)


def blocks(turns: list[dict], n: int) -> list[list[dict]]:
    """Consecutive n-turn blocks (agent and user turns) for the group judge.

    A trailing block shorter than n is dropped (the judge scores whole blocks), except that a
    dialogue shorter than n is returned as one block so that no dialogue goes unjudged.
    """
    if n < 1:
        raise ValueError(f"block size must be >= 1, got {n}")
    if not turns:
        return []
    if len(turns) < n:
        return [list(turns)]
    return [list(turns[i : i + n]) for i in range(0, len(turns) - n + 1, n)]
