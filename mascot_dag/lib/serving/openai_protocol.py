"""The OpenAI chat-completions request format: parsing, validation and OpenAI-style errors.

Pure functions (no web framework) used by `mascot serve` (server.py). Validation follows OpenAI's
and vLLM's servers: a wrong type or missing field is a 400 naming the field in `param`. Every
check that the engine would otherwise fail on deep inside (NaN or infinite numbers, seeds beyond
64 bits, lone UTF-16 surrogates, JSON nested past Python's recursion limit) is made here, so a
client's mistake is a 400 and never a 500 or a dead engine.
"""

from __future__ import annotations

import json
import math
from typing import Any

from mascot_dag.lib.types import ChatRequest, SamplingParams

_DEFAULTS = SamplingParams()
MAX_BODY_BYTES = 1 << 20  # 1 MiB: far above any chat this project sends, small enough to reject
MAX_TOKENS_LIMIT = 4096  # a 135M-8B model on this project's hardware; raise with --max-tokens-limit
MAX_TEMPERATURE = 2.0  # OpenAI's range, and vLLM refuses more
# vLLM sends a request's seed to its engine process as MessagePack, which holds 64-bit integers.
SEED_RANGE = (-(2**63), 2**63 - 1)
# The roles the chat template of the served models knows; OpenAI also answers 400 to others.
ROLES = ("system", "user", "assistant")


class RequestError(ValueError):
    """A request the server refuses; becomes an OpenAI-style error body with `status`."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.kind, self.code = (
            message, param, status, kind, code
        )  # fmt: skip




def parse_json(raw: bytes) -> Any:
    """The body's JSON; a RequestError for anything Python's json refuses, including numbers of
    over 4300 digits (a ValueError) and nesting deeper than the recursion limit."""
    try:
        body = json.loads(raw or b"null")
    # JSONDecodeError and UnicodeDecodeError are ValueErrors.
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise RequestError(f"invalid JSON body: {reason}") from exc
    try:
        # Python's json turns "\ud800" into a lone surrogate, which no tokenizer and no UTF-8
        # response can hold: refuse it here rather than fail in the engine.
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(
            "the body holds a lone UTF-16 surrogate (such as \\ud800), which is not text"
        ) from exc
    except (ValueError, RecursionError) as exc:
        raise RequestError(f"invalid JSON body: {exc}") from exc
    return body


def _number(body: dict, key: str, default: float, kind: type) -> Any:
    value = body.get(key)
    if value is None:
        return default
    # bool is an int in Python but never a valid token count or temperature.
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        want = "a number" if kind is float else "an integer"
        raise RequestError(f"'{key}' must be {want}, got {json.dumps(value)[:50]}", key)
    if kind is int:
        return value
    try:
        number = float(value)  # an integer past 1e308 overflows
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):  # Python's json reads NaN, Infinity and -Infinity
        raise RequestError(f"'{key}' must be a finite number, got {json.dumps(value)[:50]}", key)
    return number


def _content(m: Any, j: int) -> str:
    param = f"messages[{j}]"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
        raise RequestError(f"{param} must be an object with 'role' and string 'content'", param)
    if m["role"] not in ROLES:
        raise RequestError(
            f"{param}.role must be one of {', '.join(ROLES)}, got {json.dumps(m['role'])[:40]}",
            f"{param}.role",
        )
    content = m["content"]
    if isinstance(content, str):
        return content
    # OpenAI's content parts: only text parts mean anything to a text model.
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise RequestError(
        f"{param}.content must be a string or a list of text parts, got {json.dumps(content)[:60]}",
        f"{param}.content",
    )


def parse_chat_body(body: Any, max_tokens_limit: int = MAX_TOKENS_LIMIT) -> ChatRequest:
    """Turn an OpenAI chat-completions body into a ChatRequest; RequestError says what is wrong."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(
            "'messages' must be a non-empty list of {role, content} objects", "messages"
        )
    msgs = []
    for j, m in enumerate(messages):
        content = _content(m, j)  # checks first that m is an object with a known role
        msgs.append({"role": m["role"], "content": content})
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, key, _DEFAULTS.max_new_tokens, int)
    if max_tokens > max_tokens_limit:
        raise RequestError(
            f"'{key}' is {max_tokens}, above this server's limit of {max_tokens_limit}", key
        )
    n = body.get("n")
    if n is not None and n != 1:
        raise RequestError(f"'n' must be 1 (one choice per request), got {json.dumps(n)}", "n")
    temperature = _number(body, "temperature", _DEFAULTS.temperature, float)
    if temperature > MAX_TEMPERATURE:
        raise RequestError(
            f"'temperature' must be in [0, {MAX_TEMPERATURE:g}], got {temperature:g}", "temperature"
        )
    seed = _number(body, "seed", 0, int)
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise RequestError("'seed' must be a 64-bit signed integer", "seed")
    try:
        sampling = SamplingParams(
            max_new_tokens=max_tokens,
            temperature=temperature,
            top_p=_number(body, "top_p", _DEFAULTS.top_p, float),
            seed=seed,
        )
    except ValueError as exc:
        if isinstance(exc, RequestError):
            raise
        raise RequestError(f"bad sampling parameter: {exc}") from exc
    adapter = body.get("adapter")
    if adapter is not None and not isinstance(adapter, str):
        raise RequestError("'adapter' must be a string naming a loaded adapter", "adapter")
    return ChatRequest(messages=tuple(msgs), sampling=sampling, adapter=adapter or None,
                       json_schema=parse_response_format(body))  # fmt: skip


def parse_response_format(body: dict) -> str | None:
    """OpenAI's `response_format`: the schema (as JSON text) of a `json_schema` format, None for
    `text` or none; `json_object` and schemas outside structured.py's subset are refused."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    param = "response_format"
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise RequestError("'response_format' must be an object with a string 'type'", param)
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        raise RequestError(
            "response_format type 'json_object' is not supported by this server: it enforces a "
            "JSON schema, not free-form JSON; send {\"type\": \"json_schema\", \"json_schema\": "
            "{\"name\": ..., \"schema\": {...}}}", f"{param}.type",
        )  # fmt: skip
    if kind != "json_schema":
        raise RequestError(
            f"response_format type {json.dumps(kind)[:40]} is not supported; use 'text' or "
            "'json_schema'", f"{param}.type",
        )  # fmt: skip
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise RequestError(
            "response_format.json_schema must be an object with a 'schema' object",
            f"{param}.json_schema",
        )
    from mascot_dag.lib.llm.structured import compile_schema

    try:
        compile_schema(spec["schema"])
    # A schema is arbitrary client JSON: whatever the compiler trips on (a list where it expects
    # a dict, a key it indexes) is the client's schema being outside the subset.
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise RequestError(
            f"unsupported response_format.json_schema.schema: {exc} (this server supports "
            "objects with required, ordered properties; integers with enum or minimum/maximum; "
            "strings with maxLength or enum; booleans)", f"{param}.json_schema.schema",
        ) from exc  # fmt: skip
    return json.dumps(spec["schema"], ensure_ascii=False)


def parse_stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("'stop' must be a string or a list of non-empty strings", "stop")
    return stops


def parse_flag(body: dict, key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise RequestError(f"'{key}' must be true or false", key)
    return bool(value)
