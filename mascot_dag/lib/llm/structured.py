"""Structured outputs: a JSON-schema subset compiled to a template, enforced by masking logits.

Follows what vLLM and OpenAI call structured outputs (`response_format={"type": "json_schema",
...}`): the server, not the prompt, guarantees that the reply parses and matches the schema. The
subset is the one rubric judges need, small enough that a schema is a FIXED sequence of segments
(no optional keys, no arrays), so a flat template replaces a grammar engine:

- `object` with `properties`, emitted in the given order; every property `required`;
  `additionalProperties` false or absent. Objects nest.
- `integer` with `enum`, or with `minimum` and `maximum` (at most MAX_CHOICES values).
- `string` with `maxLength` (default DEFAULT_MAX_LENGTH); no quote, backslash or control
  character inside, so no escapes are ever needed. `enum` of strings. `boolean`.
- Annotations (`title`, `description`, ...) are ignored; any other keyword is a ValueError naming
  its schema path.

Output style: `json.dumps` defaults, `{"scores": {"consistency": {"score": 4, "rationale": "."}}}`.

`SchemaProcessor` is a Hugging Face logits processor: per row it tracks the text generated so far
and sets every token that cannot continue the template to -inf. Token texts are decoded once per
tokenizer (cached); per step a row costs a few dict look-ups (literals, choices) or one vectorised
comparison over the vocabulary (free text), never a Python loop over 49k tokens.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_LENGTH = 200
MAX_CHOICES = 100  # integer ranges beyond this are free numbers, which this subset does not do
_ANNOTATIONS = {"title", "description", "$schema", "$id", "$comment", "default", "examples"}
_KEYWORDS = {
    "object": {"type", "properties", "required", "additionalProperties"},
    "integer": {"type", "enum", "minimum", "maximum"},
    "string": {"type", "enum", "maxLength"},
    "boolean": {"type"},
}
_UNSAFE = re.compile(r'["\\\x00-\x1f\x7f\ufffd]')  # never inside a generated string


@dataclass(frozen=True)
class Literal:
    text: str


@dataclass(frozen=True)
class Choice:
    options: tuple[str, ...]  # exact JSON texts, e.g. ("1", "2") or ('"low"', '"high"')


@dataclass(frozen=True)
class Text:
    max_length: int  # characters between the quotes (the quotes are the Literals around it)


Segment = Literal | Choice | Text


@dataclass(frozen=True)
class Template:
    segments: tuple[Segment, ...]

    def pattern(self) -> re.Pattern:
        """A regex that matches exactly the texts this template can produce."""
        parts = []
        for seg in self.segments:
            if isinstance(seg, Literal):
                parts.append(re.escape(seg.text))
            elif isinstance(seg, Choice):
                parts.append("(?:" + "|".join(map(re.escape, seg.options)) + ")")
            else:
                parts.append(f'[^"\\\\\\x00-\\x1f\\x7f]{{0,{seg.max_length}}}')
        return re.compile("".join(parts), re.DOTALL)

    def max_chars(self) -> int:
        """An upper bound on the output's length, hence on its tokens (a token has >= 1 char)."""
        return sum(
            len(s.text) if isinstance(s, Literal)
            else max(map(len, s.options)) if isinstance(s, Choice)
            else s.max_length
            for s in self.segments
        )  # fmt: skip


def _fail(path: str, msg: str) -> ValueError:
    return ValueError(f"json schema at {path}: {msg}")


def _compile(schema: Any, path: str, out: list[Segment]) -> None:
    if not isinstance(schema, dict):
        raise _fail(path, f"a schema must be an object, got {json.dumps(schema)[:60]}")
    kind = schema.get("type")
    if kind is None and "properties" in schema:
        kind = "object"
    if kind is None and "enum" in schema:
        values = schema["enum"]
        is_int = isinstance(values, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in values
        )
        kind = "integer" if is_int else "string"
    if not isinstance(kind, str) or kind not in _KEYWORDS:
        raise _fail(
            path, f"unsupported 'type' {json.dumps(kind)}; supported: {', '.join(_KEYWORDS)}"
        )
    for key in schema:
        if key not in _KEYWORDS[kind] and key not in _ANNOTATIONS:
            raise _fail(path, f"unsupported keyword '{key}' for type {kind}")
    if kind == "object":
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise _fail(path, "'properties' must be an object")
        if schema.get("additionalProperties", False) is not False:
            raise _fail(path, "'additionalProperties' must be false or absent")
        required = schema.get("required", [])
        if not isinstance(required, list) or set(required) != set(props):
            raise _fail(
                path, f"every property must be 'required' (fixed key order), "
                f"required={json.dumps(required)}, properties={sorted(props)}",
            )  # fmt: skip
        out.append(Literal("{"))
        for k, (name, sub) in enumerate(props.items()):
            out.append(Literal((", " if k else "") + json.dumps(name) + ": "))
            _compile(sub, f"{path}.properties.{name}", out)
        out.append(Literal("}"))
    elif kind == "boolean":
        out.append(Choice(("true", "false")))
    elif kind == "integer":
        if "enum" in schema:
            values = schema["enum"]
            if "minimum" in schema or "maximum" in schema:
                raise _fail(path, "give 'enum' or 'minimum'/'maximum', not both")
            if (
                not isinstance(values, list)
                or not values
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in values)
            ):
                raise _fail(path, "'enum' of an integer must be a non-empty list of integers")
        else:
            lo, hi = schema.get("minimum"), schema.get("maximum")
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)):
                raise _fail(path, "an integer needs 'enum' or integer 'minimum' and 'maximum'")
            if not 0 < hi - lo + 1 <= MAX_CHOICES:
                raise _fail(path, f"minimum..maximum must span 1 to {MAX_CHOICES} values")
            values = list(range(lo, hi + 1))
        if len(values) > MAX_CHOICES:
            raise _fail(path, f"'enum' has {len(values)} values, at most {MAX_CHOICES}")
        out.append(Choice(tuple(dict.fromkeys(str(v) for v in values))))
    elif "enum" in schema:  # string enum
        values = schema["enum"]
        if "maxLength" in schema:
            raise _fail(path, "give 'enum' or 'maxLength', not both")
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, str) for v in values)
        ):
            raise _fail(path, "'enum' must be a non-empty list of strings")
        out.append(Choice(tuple(dict.fromkeys(json.dumps(v) for v in values))))
    else:  # free string
        n = schema.get("maxLength", DEFAULT_MAX_LENGTH)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise _fail(path, f"'maxLength' must be an integer >= 0, got {json.dumps(n)}")
        out += [Literal('"'), Text(n), Literal('"')]


def compile_schema(schema: dict | str) -> Template:
    """The template of a schema (a dict, or its JSON text); ValueError names what is unsupported."""
    if isinstance(schema, str):
        return _compile_text(schema)
    raw: list[Segment] = []
    _compile(schema, "$", raw)
    merged: list[Segment] = []
    for seg in raw:  # adjacent literals become one: fewer, longer literal segments
        if merged and isinstance(seg, Literal) and isinstance(merged[-1], Literal):
            merged[-1] = Literal(merged[-1].text + seg.text)
        else:
            merged.append(seg)
    return Template(tuple(merged))


@functools.lru_cache(maxsize=256)
def _compile_text(text: str) -> Template:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"json schema is not valid JSON: {exc}") from exc
    return compile_schema(schema)


# ---- token tables ----------------------------------------------------------------------------
class TokenTable:
    """Each token's text (None for special/added tokens and partial UTF-8 pieces), indexed."""

    def __init__(self, texts: list[str | None]) -> None:
        self.texts = texts
        self.by_text: dict[str, list[int]] = {}
        for i, t in enumerate(texts):
            if t:
                self.by_text.setdefault(t, []).append(i)
        # chars of tokens allowed inside a string; -1 = never (has a quote, escape, control char)
        self.safe_len = [len(t) if t and not _UNSAFE.search(t) else -1 for t in texts]

    def ids_of_prefixes(self, s: str) -> list[int]:
        """Tokens whose text is a non-empty prefix of s (s is short: a literal or an option)."""
        return [i for k in range(1, len(s) + 1) for i in self.by_text.get(s[:k], ())]


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


def token_table(tokenizer: Any) -> TokenTable:
    """Decoded once per tokenizer. Assumes a token decodes alone to the text it adds in context
    (true of byte-level BPE: GPT-2, SmolLM, Llama 3, Qwen); partial UTF-8 bytes are excluded."""
    with _TABLES_LOCK:
        table = _TABLES.get(tokenizer)
        if table is None:
            n = len(tokenizer)
            texts: list[str | None] = list(tokenizer.batch_decode(
                [[i] for i in range(n)], clean_up_tokenization_spaces=False
            ))  # fmt: skip
            for i in set(getattr(tokenizer, "added_tokens_decoder", {})) | set(
                tokenizer.all_special_ids
            ):
                if 0 <= i < n:
                    texts[i] = None
            texts = [None if t is None or "\ufffd" in t else t for t in texts]
            table = _TABLES[tokenizer] = TokenTable(texts)
        return table


# ---- the state machine -----------------------------------------------------------------------
class TemplateState:
    """Where one row stands in a template: segment index and the text of it emitted so far."""

    def __init__(self, template: Template) -> None:
        self.segs = template.segments
        self.i, self.part = 0, ""
        self._settle()

    @property
    def done(self) -> bool:
        return self.i >= len(self.segs)

    def _settle(self) -> None:
        # Leave a segment as soon as it cannot grow: a full literal, a choice no option extends.
        while not self.done:
            seg = self.segs[self.i]
            full = (
                self.part == seg.text if isinstance(seg, Literal)
                else isinstance(seg, Choice) and self.part in seg.options
                and not any(o != self.part and o.startswith(self.part) for o in seg.options)
            )  # fmt: skip
            if not full:
                return
            self.i, self.part = self.i + 1, ""

    def feed(self, text: str) -> None:
        """Advance by a generated token's text; ValueError if the template does not allow it."""
        while text:
            if self.done:
                raise ValueError(f"text {text!r} after the end of the template")
            seg = self.segs[self.i]
            if isinstance(seg, Literal):
                rest = seg.text[len(self.part) :]
                k = min(len(rest), len(text))
                if text[:k] != rest[:k]:
                    raise ValueError(f"expected {rest!r}, got {text!r}")
                self.part, text = self.part + text[:k], text[k:]
            elif isinstance(seg, Choice):
                cand = self.part + text
                if any(o.startswith(cand) for o in seg.options):
                    self.part, text = cand, ""
                else:  # the option ended: the rest belongs to the next segment
                    ends = [o for o in seg.options
                            if cand.startswith(o) and len(o) >= len(self.part)]  # fmt: skip
                    if not ends:
                        raise ValueError(f"{cand!r} is none of {list(seg.options)}")
                    o = max(ends, key=len)
                    text = cand[len(o) :]
                    self.i, self.part = self.i + 1, ""
                    continue
            else:
                m = re.match(r'[^"\\\x00-\x1f\x7f]*', text)
                take = m.group(0) if m else ""
                if len(self.part) + len(take) > seg.max_length:
                    raise ValueError(f"string longer than maxLength {seg.max_length}")
                self.part, text = self.part + take, text[len(take) :]
                if text:  # a quote or an escape: the string ends, the closing literal follows
                    self.i, self.part = self.i + 1, ""
                    continue
            self._settle()
        self._settle()


class SchemaProcessor:
    """HF logits processor: row b may only continue `templates[b]` (None = unconstrained).
    Put it BEFORE any sampler, so that greedy and sampling both pick among allowed tokens."""

    def __init__(
        self, tokenizer: Any, templates: list[Template | None], stop_ids: set[int]
    ) -> None:
        self.table = token_table(tokenizer)
        self.stop_ids = sorted(stop_ids)
        self.states = [None if t is None else TemplateState(t) for t in templates]
        self.prompt_len: int | None = None
        self._ids: dict[tuple, list[int]] = {}  # (id(segments), i, part) -> allowed ids (no Text)
        self._safe: Any = None
        for t in templates:
            for seg in t.segments if t else ():
                chars = seg.text if isinstance(seg, Literal) else "".join(
                    seg.options) if isinstance(seg, Choice) else ""  # fmt: skip
                missing = [c for c in set(chars) if c not in self.table.by_text]
                if missing:
                    raise ValueError(f"the tokenizer has no single token for {missing}: "
                                     "this template cannot be spelled")  # fmt: skip

    def _allowed_ids(self, segs: tuple, i: int, part: str) -> list[int]:
        """Allowed token ids of a Literal/Choice/end state (cached: these states repeat)."""
        key = (id(segs), i, part)
        if key not in self._ids:
            if i >= len(segs):
                ids = list(self.stop_ids)
            elif isinstance(segs[i], Literal):
                # the text is fixed, so only the longest token that spells on is allowed: one
                # decoding step per BPE piece instead of up to one per character (the JSON's keys
                # are most of a judge reply)
                ids = self.table.ids_of_prefixes(segs[i].text[len(part) :])
                longest = max(len(self.table.texts[t]) for t in ids)
                ids = [t for t in ids if len(self.table.texts[t]) == longest]
            else:
                seg, ids = segs[i], []
                for o in seg.options:
                    if o.startswith(part) and len(o) > len(part):
                        ids += self.table.ids_of_prefixes(o[len(part) :])
                if part in seg.options:  # may also end here: the next segment's first tokens
                    ids += self._allowed_ids(segs, i + 1, "")
                ids = sorted(set(ids))
            self._ids[key] = ids
        return self._ids[key]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.prompt_len is None:
            self.prompt_len = input_ids.shape[1]
        elif input_ids.shape[1] > self.prompt_len:
            last = input_ids[:, -1].tolist()
            for st, tok in zip(self.states, last, strict=True):
                if st is not None and not st.done:
                    text = self.table.texts[tok] if tok < len(self.table.texts) else None
                    if text is None:
                        raise ValueError(f"token {tok} is outside the template (a special token)")
                    st.feed(text)
        vocab = scores.shape[-1]
        if self._safe is None or self._safe.device != scores.device:
            safe = torch.full((vocab,), -1, dtype=torch.int32)
            n = min(vocab, len(self.table.safe_len))
            safe[:n] = torch.tensor(self.table.safe_len[:n], dtype=torch.int32)
            self._safe = safe.to(scores.device)
        keep = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
        for b, st in enumerate(self.states):
            if st is None:
                keep[b] = True
                continue
            segs, i = st.segs, st.i
            if not st.done and isinstance(segs[i], Text):
                room = segs[i].max_length - len(st.part)
                keep[b] = (self._safe >= 1) & (self._safe <= room)
                ids = self._allowed_ids(segs, i + 1, "")  # the closing quote
            else:
                ids = self._allowed_ids(segs, i, st.part)
            ids = [t for t in ids if t < vocab]
            keep[b, torch.tensor(ids, dtype=torch.long, device=scores.device)] = True
        return scores.masked_fill(~keep, float("-inf"))
