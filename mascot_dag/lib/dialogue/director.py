"""The director (MASCOT Stage 2 meta-agent): picks who speaks next and how.

At every agent turn the director model writes a directive, a JSON object
`{"speaker": <persona_id>, "action": ..., "tone": ...}`. Small models often write prose, broken JSON
or a name instead of an id, so this module owns the whole contract around that one generation:

- `director_messages`: the prompt (roster, context, the last `HISTORY_TURNS` turns of dialogue).
- `parse_directive`: the first JSON object that has a "speaker" key, found even inside prose or
  code fences; the speaker may be a persona_id or a persona's name in any case ("The Anchor",
  "anchor"); action and tone must be non-empty strings, truncated to `MAX_ACTION_CHARS` and
  `MAX_TONE_CHARS`. Any other input raises `DirectiveError` saying why; nothing else is raised.
- `directive_schema`: the same contract as a JSON schema for structured outputs (speaker an enum
  of the allowed ids); with it the backend can only write a valid directive (see DirectorTurn).
- `DirectorTurn`: one generation, on failure ONE retry with a repair message naming the error, then
  the FALLBACK (`fallback_speaker`): the allowed speaker used least so far, ties broken by roster
  order rotated by the turn index. A valid but repeated speaker while `no_repeat` is on counts as
  invalid. The state machine exposes the messages it needs next, so `lib.dialogue` can batch the
  director requests of many dialogues into one chat call; `choose_directive` runs it for one.

The fallback is deterministic (no rng): least-used-first guarantees that no speaker can be picked
twice before every allowed speaker has had as many turns, so a director that always fails still
rotates through the roster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from mascot_dag.lib.data.personas import PersonaCard
from mascot_dag.lib.llm.structured import compile_schema
from mascot_dag.lib.types import Message

HISTORY_TURNS = 6  # the director sees the last 6 turns: enough for one support round + reply
HISTORY_TURN_CHARS = 300  # per turn; keeps the 135M model's prompt (and CPU time) short
CONTEXT_CHARS = 1200
MAX_ACTION_CHARS = 200
MAX_TONE_CHARS = 40
# Structured outputs (`directive_schema`): the constrained action and tone, shorter than the
# parser's limits. A constrained reply ends with its template, so its token budget is the
# template's length bound (`DirectorTurn.max_new_tokens`), not the unconstrained 48 tokens: a
# 90-char action + tone + scaffolding (~17 SmolLM2 tokens) can exceed 48 and was then cut.
SCHEMA_ACTION_CHARS = 90
SCHEMA_TONE_CHARS = 20
# Bounds that make parsing linear-ish on adversarial input (e.g. a megabyte of "{").
_SCAN_CHARS = 20_000
_MAX_OBJECT_STARTS = 200
_RAW_ECHO_CHARS = 400  # how much of a bad answer the repair message quotes back

Status = Literal["ok", "retried", "fallback"]


class DirectiveError(ValueError):
    """The director's output is not a usable directive; the message says why."""


@dataclass(frozen=True)
class Directive:
    speaker: str  # persona_id on the roster
    action: str
    tone: str


def _label(speaker: str, roster: list[PersonaCard], with_id: bool = True) -> str:
    card = next((c for c in roster if c.persona_id == speaker), None)
    if card is not None:
        return f"{card.name} ({card.persona_id})" if with_id else card.name
    return speaker.capitalize()


def format_history(
    history: list[dict], roster: list[PersonaCard], n: int = HISTORY_TURNS, with_ids: bool = True
) -> str:
    """The last `n` turns as "Name (id): text" lines (ids only for the director, who answers
    with one), each cut to HISTORY_TURN_CHARS."""
    lines = []
    for turn in history[-n:] if n > 0 else []:
        text = " ".join(str(turn.get("text", "")).split())[:HISTORY_TURN_CHARS]
        lines.append(f"{_label(str(turn.get('speaker', '?')), roster, with_ids)}: {text}")
    return "\n".join(lines) if lines else "(nothing yet)"


def _ask(
    context_text: str, roster: list[PersonaCard], history: list[dict], avoid: str | None
) -> str:
    rule = f'\nDo not choose "{avoid}": they spoke last.' if avoid else ""
    return (
        f"Context:\n{' '.join(context_text.split())[:CONTEXT_CHARS]}\n\n"
        f"Dialogue so far:\n{format_history(history, roster)}\n\n"
        f"Who speaks next? Speaker must be one of: {', '.join(c.persona_id for c in roster)}."
        f"{rule}\nJSON:"
    )


def director_messages(
    context_text: str,
    roster: list[PersonaCard],
    history: list[dict],
    mode: str,
    avoid_speaker: str | None = None,
) -> list[Message]:
    """Chat messages asking the director for ONLY a JSON directive.

    `history` items are {"speaker": persona_id|"user"|"moderator", "text": ...}; only the last
    HISTORY_TURNS are shown. `avoid_speaker` (the last speaker when repeats are forbidden) is named
    in the prompt so the model knows the rule it will be held to.

    One worked exchange (a made-up context and its JSON answer) precedes the real question: with
    the format only described, SmolLM2-135M wrote a valid directive 0/16 times; with the exchange,
    12/16. The 135M model mostly copies the example's speaker (with a fixed example it named the
    same persona in 12 of 16 structured answers), so the example's speaker is the fallback rule's
    choice for this history: the least-used allowed speaker, never `avoid_speaker`. An untrained
    director then rotates through the roster like the fallback, with its own action and tone; a
    trained one deviates where its reward says so.
    """
    goal = "support a person who is struggling" if mode == "support" else "hold a useful meeting"
    members = "\n".join(f'- "{c.persona_id}": {c.name}, {c.role}' for c in roster)
    system = "\n".join(
        [
            f"You are the director of a group of companions who {goal}.",
            "At each turn you choose which companion speaks next, what they should do and in "
            "which tone, so that every companion adds something new in their own role.",
            "Companions (id: name, role):",
            members,
            'Answer with ONLY a JSON object {"speaker": ..., "action": ..., "tone": ...}.',
        ]
    )
    messages: list[Message] = [{"role": "system", "content": system}]
    if roster:
        pid = fallback_speaker(roster, history, len(history), avoid_speaker,
                               avoid_speaker is not None)
        ex = next(c for c in roster if c.persona_id == pid)
        first = "user" if mode == "support" else "moderator"
        ex_history = [{"speaker": first, "text": "It has been a hard week and I feel stuck."}]
        answer = {
            "speaker": ex.persona_id,
            "action": ex.behaviours[0],
            "tone": "warm" if mode == "support" else "constructive",
        }
        messages += [
            {"role": "user", "content": _ask("A hard week.", roster, ex_history, None)},
            {"role": "assistant", "content": json.dumps(answer)},
        ]
    messages.append({"role": "user", "content": _ask(context_text, roster, history, avoid_speaker)})
    return messages


def directive_schema(roster: list[PersonaCard], avoid_speaker: str | None = None) -> dict:
    """The JSON schema of a directive for structured outputs: the speaker is an enum of the
    roster's ids without `avoid_speaker`, so every constrained answer names an allowed speaker;
    action and tone are bounded strings. `parse_directive` still checks the reply (a server may
    ignore the schema, and an empty action is possible)."""
    allowed = [c.persona_id for c in roster if c.persona_id != avoid_speaker]
    return {
        "type": "object",
        "properties": {
            "speaker": {"type": "string", "enum": allowed or [c.persona_id for c in roster]},
            "action": {"type": "string", "maxLength": SCHEMA_ACTION_CHARS},
            "tone": {"type": "string", "maxLength": SCHEMA_TONE_CHARS},
        },
        "required": ["speaker", "action", "tone"],
        "additionalProperties": False,
    }


def directive_pattern(cards: list[PersonaCard]) -> str:
    """A regex of every structured directive naming any of `cards` (both rosters: one director
    serves them all), for samplers that take a regex (TRL's vLLM structured outputs)."""
    return compile_schema(directive_schema(cards)).pattern().pattern


def _objects(text: str):
    """Yield JSON objects (dicts) that start at successive '{' in text, left to right."""
    decoder = json.JSONDecoder()
    text = text[:_SCAN_CHARS]
    start = text.find("{")
    tries = 0
    while start != -1 and tries < _MAX_OBJECT_STARTS:
        tries += 1
        try:
            obj, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            yield obj
        start = text.find("{", start + 1)


def _norm(name: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    return s[4:] if s.startswith("the_") else s


def resolve_speaker(value: object, roster: list[PersonaCard]) -> str:
    """persona_id for a persona_id or a persona name (any case, with or without "The")."""
    if not isinstance(value, str) or not value.strip():
        raise DirectiveError(f"speaker must be a non-empty string, got {value!r:.60}")
    wanted = _norm(value[:200])
    hits = [
        c.persona_id
        for c in roster
        if wanted in {_norm(c.persona_id), _norm(c.name)} or value.strip() == c.persona_id
    ]
    if len(set(hits)) != 1:
        known = ", ".join(c.persona_id for c in roster)
        why = "is ambiguous" if hits else "is not on the roster"
        raise DirectiveError(f"speaker {value[:60]!r} {why}; choose one of: {known}")
    return hits[0]


def _text_field(obj: dict, key: str, limit: int) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DirectiveError(f'"{key}" must be a non-empty string, got {value!r:.60}')
    return " ".join(value.split())[:limit]


def parse_directive(text: str, roster: list[PersonaCard]) -> Directive:
    """The directive in a director output; raises DirectiveError (only) when there is none."""
    if not isinstance(text, str):
        raise DirectiveError(f"director output must be a string, got {type(text).__name__}")
    for obj in _objects(text):
        keyed = {str(k).strip().lower(): v for k, v in obj.items()}
        if "speaker" not in keyed:
            continue
        return Directive(
            speaker=resolve_speaker(keyed["speaker"], roster),
            action=_text_field(keyed, "action", MAX_ACTION_CHARS),
            tone=_text_field(keyed, "tone", MAX_TONE_CHARS),
        )
    raise DirectiveError('no JSON object with a "speaker" key in the output')


def fallback_speaker(
    roster: list[PersonaCard],
    history: list[dict],
    turn_idx: int,
    last_speaker: str | None,
    no_repeat: bool,
) -> str:
    """The least-used allowed speaker; ties go to the first in roster order rotated by turn_idx."""
    if not roster:
        raise DirectiveError("empty roster: nobody can speak")
    ids = [c.persona_id for c in roster]
    allowed = [p for p in ids if not (no_repeat and p == last_speaker)] or ids
    counts = {p: 0 for p in ids}
    for turn in history:
        if turn.get("speaker") in counts:
            counts[turn["speaker"]] += 1
    k = turn_idx % len(ids)
    rotated = [p for p in ids[k:] + ids[:k] if p in allowed]
    return min(rotated, key=lambda p: counts[p])  # min keeps the first of equals


def fallback_directive(card: PersonaCard, mode: str, turn_idx: int = 0) -> Directive:
    """The fallback's action is one of the persona's own card behaviours (rotated by turn), so a
    fallback turn is still in role and says something concrete for the agent to do."""
    action = card.behaviours[turn_idx % len(card.behaviours)]
    tone = "warm" if mode == "support" else "constructive"
    return Directive(card.persona_id, action[:MAX_ACTION_CHARS], tone)


@dataclass
class DirectorTurn:
    """One directive decision: generation, at most one repair retry, then the fallback.

    Drive it with `pending()` (messages to generate, or None when decided) and `feed(raw)`.
    """

    context_text: str
    roster: list[PersonaCard]
    history: list[dict]
    mode: str
    turn_idx: int
    last_speaker: str | None = None
    no_repeat: bool = True
    structured: bool = False  # ask for structured outputs (`json_schema`) with every attempt
    raw_outputs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    directive: Directive | None = None
    status: Status | None = None

    def __post_init__(self) -> None:
        self._avoid = self.last_speaker if self.no_repeat and len(self.roster) > 1 else None
        self._messages = director_messages(
            self.context_text, self.roster, self.history, self.mode, self._avoid
        )

    def pending(self) -> list[Message] | None:
        return None if self.status is not None else list(self._messages)

    def json_schema(self) -> str | None:
        """The directive schema as JSON text for `ChatRequest.json_schema` (None: unconstrained)."""
        if not self.structured:
            return None
        return json.dumps(directive_schema(self.roster, self._avoid))

    def max_new_tokens(self, budget: int) -> int:
        """Token budget of this turn's requests: `budget` unconstrained; with the schema at least
        the template's length bound (a token has >= 1 char), so no allowed reply is cut - the
        template, not the budget, ends it."""
        schema = self.json_schema()
        if schema is None:
            return budget
        return max(budget, compile_schema(schema).max_chars())

    def _check(self, raw: str) -> Directive:
        directive = parse_directive(raw, self.roster)
        if self._avoid is not None and directive.speaker == self._avoid:
            raise DirectiveError(f'speaker "{directive.speaker}" spoke last; choose someone else')
        return directive

    def feed(self, raw: str) -> None:
        if self.status is not None:
            raise RuntimeError("DirectorTurn.feed called after the directive was decided")
        raw = raw if isinstance(raw, str) else str(raw)
        self.raw_outputs.append(raw)
        try:
            self.directive = self._check(raw)
            self.status = "ok" if len(self.raw_outputs) == 1 else "retried"
            return
        except DirectiveError as exc:
            self.errors.append(str(exc))
        if len(self.raw_outputs) == 1:
            ids = ", ".join(c.persona_id for c in self.roster)
            self._messages = self._messages + [
                {"role": "assistant", "content": raw[:_RAW_ECHO_CHARS]},
                {
                    "role": "user",
                    "content": f"That answer is invalid: {self.errors[-1]}. Reply with ONLY a "
                    f'JSON object {{"speaker": ..., "action": ..., "tone": ...}} where speaker '
                    f"is one of: {ids}.",
                },
            ]
            return
        pid = fallback_speaker(
            self.roster, self.history, self.turn_idx, self.last_speaker, self.no_repeat
        )
        card = next(c for c in self.roster if c.persona_id == pid)
        self.directive = fallback_directive(card, self.mode, self.turn_idx)
        self.status = "fallback"

    def record(self) -> dict:
        """The `directives` row fields (raw_output holds every attempt and every error as JSON)."""
        if self.directive is None:
            raise RuntimeError("DirectorTurn.record called before the directive was decided")
        raw = json.dumps({"attempts": self.raw_outputs, "errors": self.errors}, ensure_ascii=False)
        return {
            "speaker": self.directive.speaker,
            "action": self.directive.action,
            "tone": self.directive.tone,
            "status": self.status,
            "raw_output": raw,
        }


@dataclass
class DirectorChoice:
    directive: Directive
    status: Status
    raw_outputs: list[str]
    errors: list[str]


def choose_directive(
    generate_fn: Callable[[list[Message]], str],
    context_text: str,
    roster: list[PersonaCard],
    history: list[dict],
    mode: str,
    *,
    turn_idx: int,
    last_speaker: str | None = None,
    no_repeat: bool = True,
) -> DirectorChoice:
    """One directive for one dialogue: `generate_fn(messages) -> text` is called once or twice
    (unconstrained: the batched engine, `lib.dialogue.direct_turns`, sends the schema)."""
    turn = DirectorTurn(context_text, roster, history, mode, turn_idx, last_speaker, no_repeat)
    while (messages := turn.pending()) is not None:
        turn.feed(generate_fn(messages))
    assert turn.directive is not None and turn.status is not None
    return DirectorChoice(turn.directive, turn.status, turn.raw_outputs, turn.errors)
