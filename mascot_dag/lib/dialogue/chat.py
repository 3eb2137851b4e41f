"""A live conversation with the companion group (`mascot chat`, terminal or web page): you speak,
the director picks which agent answers (and how), the agent answers with its adapter, for
`agents_per_round` agents.

Reuses the dialogue engine's request builders so a chat turn is produced exactly like a
support-mode turn in Stage 2 and evaluation (a set speaks in the mode
`lib.data.personas.set_mode` gives it: the workplace roster in meetings). What a
user reads then passes the chat's reply guards (`lib.dialogue.guards`: scaffolding, prompt
echoes, repeats resampled with a new seed, sentence ends); only here, never in the evaluation.
Also the page-independent parts of the web chat (`mascot_dag.web.chat`): message limits, the
label of the model version that spoke, and a bounded store of conversations.
"""

from __future__ import annotations

import dataclasses
import random
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from mascot_dag.lib.data.personas import PersonaCard
from mascot_dag.lib.dialogue.engine import (
    DialogueState,
    agent_request,
    direct_turns,
)
from mascot_dag.lib.dialogue.guards import directive_valid, guard_reply, resample_seed
from mascot_dag.lib.dialogue.spec import DialogueConfig, DialogueSpec
from mascot_dag.lib.types import ChatRequest, ChatResult, Context

# The first message becomes the dialogue context, which agents see cut to 1200 characters
# (dialogue.CONTEXT_CHARS); 1000 keeps a whole message visible there.
MAX_MESSAGE_CHARS = 1000
MAX_USER_MESSAGES = 100  # per conversation: the history shown to the models is 6 turns anyway
BASE_LABEL = "base + persona prompt"
IDLE_S = 30 * 60  # a web chat conversation untouched this long may make room for a new one
MODEL_NOTE = (
    "With the embedded 135M model (the default profile) replies are short and rough: it keeps "
    "to the topic and to a persona's manner only loosely, may misread what you said and gives no "
    "reliable advice. Machinery it leaks (speaker labels, stage directions, its prompt, a repeat "
    "of an earlier turn, a tail cut at the token limit) is removed or resampled before you see "
    "it; a larger model (the paper profile) writes fluent turns."
)


class ChatInputError(ValueError):
    """A message or request the chat refuses; `status` is the HTTP status the page answers."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def check_message(text: object) -> str:
    """The message with its whitespace collapsed; ChatInputError when empty or too long."""
    if not isinstance(text, str):
        raise ChatInputError(f"message must be text, got {type(text).__name__}")
    clean = " ".join(text.split())
    if not clean:
        raise ChatInputError("empty message: write something before sending")
    if len(clean) > MAX_MESSAGE_CHARS:
        raise ChatInputError(
            f"message is {len(clean)} characters; the limit is {MAX_MESSAGE_CHARS}", status=413
        )
    return clean


def version_label(model_name: str, version: str | None, alias: str | None) -> str:
    """How a turn names the model that spoke: `mascot-persona-anchor/3 (champion)`, or
    BASE_LABEL when the persona has no registered version (base model + persona prompt)."""
    if version is None:
        return BASE_LABEL
    return f"{model_name}/{version}" + (f" ({alias})" if alias else "")


@dataclass(frozen=True)
class ChatTurn:
    """One line of the transcript as a page shows it."""

    role: Literal["user", "agent"]
    speaker: str  # "user" or a persona_id
    name: str  # display name
    text: str
    action: str | None = None
    tone: str | None = None
    director_status: str | None = None  # ok | retried | fallback (lib.director)
    model: str | None = None  # version_label of the model that spoke
    directive_valid: bool = True  # shown only when valid (lib.dialogue.guards.directive_valid)
    resamples: int = 0  # samples drawn after the first (the reply repeated a turn or was empty)
    guards: tuple[str, ...] = ()  # guards that changed the reply (labels, scaffolding, ...)


class ChatSession:
    def __init__(
        self,
        roster: list[PersonaCard],
        generate: Callable[[list[ChatRequest]], list[ChatResult]],
        config: DialogueConfig,
        seed: int = 0,
        mode: Literal["support", "meeting"] = "support",
        labels: dict[str, str] | None = None,
    ) -> None:
        """`labels`: persona_id -> version_label of its adapter (missing = BASE_LABEL)."""
        self.roster, self.generate, self.config = roster, generate, config
        self.state: DialogueState | None = None
        self.seed, self.mode = seed, mode
        self.labels = labels or {}
        self.log: list[ChatTurn] = []

    def _start(self, text: str) -> DialogueState:
        if self.mode == "support":
            ctx = Context(
                "chat",
                "empatheticdialogues",
                "emotional_support",
                text,
                text,
                turns=[{"speaker": "speaker", "text": text}],
            )
        else:
            ctx = Context(
                "chat",
                "qmsum",
                "chat",
                text,
                text,
                topic=text,
                queries=[{"query": text, "answer": ""}],
            )
        spec = DialogueSpec("chat", ctx, self.mode, self.roster, None, self.seed, 10**6)
        return DialogueState(spec, rng=random.Random(self.seed))

    def say(self, text: str) -> list[tuple[PersonaCard, str, dict]]:
        """Add the user's turn; return [(card, reply, directive)] for this round. When the model
        fails, the conversation is left as it was before the message (then the error is raised)."""
        text = " ".join(text.split())
        if not text:
            raise ValueError("empty message")
        state, n_log = self.state, len(self.log)
        n_turns, n_agent = (len(state.turns), state.n_agent) if state else (0, 0)
        try:
            return self._round(text)
        except BaseException:
            self.state, self.log[n_log:] = state, []
            if state is not None:
                del state.turns[n_turns:]
                state.n_agent = n_agent
            raise

    def _round(self, text: str) -> list[tuple[PersonaCard, str, dict]]:
        if self.state is None:
            self.state = self._start(text)
        st = self.state
        st.add("user", "user", text, "human")
        self.log.append(ChatTurn("user", "user", "You", text))
        replies = []
        for _ in range(self.config.agents_per_round):
            d = direct_turns([st], self.generate, self.config)[0]
            card = next(c for c in self.roster if c.persona_id == d["speaker"])
            idx = len(st.turns)
            reply, d = self._reply(st, card, d, idx)
            used = self.config.persona_adapters.get(card.persona_id) or "base+prompt"
            st.add("agent", card.persona_id, reply, used)
            st.n_agent += 1
            self.log.append(
                ChatTurn(
                    "agent",
                    card.persona_id,
                    card.name,
                    reply,
                    d["action"],
                    d["tone"],
                    d["status"],
                    self.labels.get(card.persona_id, BASE_LABEL),
                    d["valid"],
                    d["resamples"],
                    tuple(d["guards"]),
                )
            )
            replies.append((card, reply, d))
        return replies

    def _reply(self, st: DialogueState, card: PersonaCard, d: dict, idx: int) -> tuple[str, dict]:
        """The agent's reply through the chat guards (`lib.dialogue.guards`): scaffolding and
        prompt echoes removed, a sentence end, a resample (new seed) when it repeats an earlier
        turn or is empty. `d` comes back with `valid`, `resamples` and `guards`."""
        req = agent_request(st, card, d, self.config, idx)

        def sample(k: int) -> str:
            r = req if k == 0 else dataclasses.replace(req, sampling=dataclasses.replace(
                req.sampling, seed=resample_seed(req.sampling.seed, k)))
            return self.generate([r])[0].text

        names = [n for c in self.roster for n in (c.persona_id, c.name)]
        prompt = "\n".join(m["content"] for m in req.messages)
        g = guard_reply(sample, names, prompt, [t["text"] for t in st.turns], self.mode)
        return g.text, {**d, "valid": directive_valid(d), "resamples": g.resamples,
                        "guards": g.changed + (["fallback"] if g.fallback else [])}

    @property
    def user_messages(self) -> int:
        return sum(t.role == "user" for t in self.log)


class UnknownSession(KeyError):
    """No conversation with this id (never created, evicted, or the server restarted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown chat session"


@dataclass
class Conversation:
    session: ChatSession
    roster_set: str


class IdleSessions:
    """Conversations by random id, at most `max_sessions`. A new one makes room only by dropping
    conversations idle longer than `idle_s` (the longest idle first), never an active one: with
    least-recently-used eviction any client could push every open conversation out by opening
    new ones. Full with none idle, `create` refuses (503) until one goes idle."""

    def __init__(
        self,
        factory: Callable[[str, int], ChatSession],
        max_sessions: int = 64,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`factory(roster_set, seed)` builds a new ChatSession (a ChatInputError for a roster it
        does not serve: `check_roster`); `clock` gives seconds."""
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.factory, self.max_sessions, self.idle_s, self.clock = (
            factory, max_sessions, idle_s, clock)
        self._items: OrderedDict[str, tuple[Conversation, float]] = OrderedDict()  # oldest first
        self._lock = threading.Lock()

    def create(self, roster_set: str) -> tuple[str, Conversation]:
        sid = secrets.token_urlsafe(16)
        conv = Conversation(self.factory(roster_set, secrets.randbelow(2**31)), roster_set)
        with self._lock:
            now = self.clock()
            while len(self._items) >= self.max_sessions:
                oldest, (_, used) = next(iter(self._items.items()))
                if now - used <= self.idle_s:
                    raise ChatInputError(
                        f"the page holds {self.max_sessions} open conversations and none has been "
                        f"idle for {self.idle_s / 60:g} minutes: try again later", 503)
                del self._items[oldest]
            self._items[sid] = (conv, now)
        return sid, conv

    def get(self, sid: str | None) -> Conversation:
        with self._lock:
            found = self._items.get(sid) if sid else None
            if found is None:
                raise UnknownSession(
                    f"unknown chat session {str(sid)[:40]!r}: it expired or the server restarted; "
                    "start a new conversation"
                )
            self._items[sid] = (found[0], self.clock())
            self._items.move_to_end(sid)
            return found[0]

    def __len__(self) -> int:
        return len(self._items)


def check_roster(roster_set: str, sets: Iterable[str]) -> None:
    """A ChatInputError naming `sets` (the persona sets the chat serves) unless `roster_set` is
    one of them."""
    sets = list(sets)
    if roster_set not in sets:
        raise ChatInputError(
            f"unknown roster {roster_set!r:.40}; choose one of: {', '.join(sets)}"
        )

