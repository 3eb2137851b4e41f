"""Structured outputs: the JSON-schema subset, the constraint processor on the real SmolLM2
tokenizer under adversarial logits, the tiny TransformersChat, and `mascot serve` driven by the
official `openai` client with `response_format`."""

from __future__ import annotations

import json
import os
import time

import openai
import pytest
from conftest import mascot_serve

from mascot_dag.lib.judges.llm_judge import best_schema, scores_schema
from mascot_dag.lib.llm import validate_requests
from mascot_dag.lib.llm.structured import Choice, Literal, Text, compile_schema
from mascot_dag.lib.types import ChatRequest, SamplingParams

MSGS = (
    {"role": "system", "content": "You rate replies. Answer with JSON."},
    {"role": "user", "content": "Rate this reply to a sad friend: 'I am here for you.'"},
)
# Small but with every segment kind, and integer options that are prefixes of each other
# ("1" of "10" and "100"): after "1" the value may end or go on.
SCHEMA = {
    "type": "object",
    "title": "rating",
    "properties": {
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "level": {"type": "integer", "enum": [1, 10, 100]},
        "mood": {"enum": ["calm", "sad"]},
        "ok": {"type": "boolean"},
        "why": {
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": 12}},
            "required": ["text"],
            "additionalProperties": False,
        },
    },
    "required": ["score", "level", "mood", "ok", "why"],
}


def conforms(value, schema) -> bool:
    """The subset's meaning, checked independently of the template (jsonschema is not installed)."""
    kind = schema.get("type") or ("string" if isinstance(schema["enum"][0], str) else "integer")
    if kind == "object":
        props = schema["properties"]
        return (isinstance(value, dict) and list(value) == list(props)
                and all(conforms(value[k], s) for k, s in props.items()))  # fmt: skip
    if "enum" in schema:
        return value in schema["enum"] and type(value) is type(schema["enum"][0])
    if kind == "integer":
        return type(value) is int and schema["minimum"] <= value <= schema["maximum"]
    if kind == "boolean":
        return isinstance(value, bool)
    return isinstance(value, str) and len(value) <= schema.get("maxLength", 200)


def test_compile_the_judge_schemas_and_name_what_is_unsupported():
    t = compile_schema(scores_schema(["consistency", "fidelity"], rationale_chars=20))
    assert t.segments[:4] == (Literal('{"scores": {"consistency": {"score": '),
                              Choice(("1", "2", "3", "4", "5")),
                              Literal(', "rationale": "'), Text(20))  # fmt: skip
    text = '{"scores": {"consistency": {"score": 4, "rationale": "fits"}, ' \
           '"fidelity": {"score": 1, "rationale": ""}}}'  # fmt: skip
    assert t.pattern().fullmatch(text) and not t.pattern().fullmatch(text.replace("4", "6"))
    assert compile_schema(json.dumps(best_schema(3))).segments[1] == Choice(("1", "2", "3"))
    bad = {
        "type array": ({"type": "array", "items": {}}, r"\$: unsupported 'type' \"array\""),
        "nested minLength": (
            {
                "type": "object",
                "properties": {"a": {"type": "string", "minLength": 2}},
                "required": ["a"],
            },  # fmt: skip
            r"\$\.properties\.a: unsupported keyword 'minLength'",
        ),
        "optional key": (
            {"type": "object", "properties": {"a": {"type": "boolean"}}},
            "every property must be 'required'",
        ),  # fmt: skip
        "open object": (
            {"type": "object", "properties": {}, "additionalProperties": True},
            "'additionalProperties' must be false",
        ),  # fmt: skip
        "free integer": ({"type": "integer"}, "needs 'enum' or integer 'minimum' and 'maximum'"),
        "wide range": ({"type": "integer", "minimum": 0, "maximum": 1000}, "span 1 to 100"),
        "nullable": ({"type": ["string", "null"]}, "unsupported 'type'"),
        "pattern": ({"type": "string", "pattern": "a+"}, "unsupported keyword 'pattern'"),
    }
    for name, (schema, message) in bad.items():
        with pytest.raises(ValueError, match=message):
            compile_schema(schema)
        print(name, "ok")
    with pytest.raises(ValueError, match="not valid JSON"):
        compile_schema("{nope")


def test_schema_joins_the_cache_key_only_when_set_and_is_validated():
    import hashlib
    from dataclasses import asdict

    plain = ChatRequest(MSGS, SamplingParams(seed=3))
    # The key a schema-less request has always had (existing caches must keep hitting).
    old = {"model": "m", "adapter": None, "adapter_version": None,
           "messages": list(MSGS), "sampling": asdict(plain.sampling)}  # fmt: skip
    blob = json.dumps(old, sort_keys=True, ensure_ascii=False).encode("utf-8")
    assert plain.cache_key("m", None) == hashlib.sha256(blob).hexdigest()
    structured = ChatRequest(MSGS, SamplingParams(seed=3), json_schema=json.dumps(SCHEMA))
    assert structured.cache_key("m", None) != plain.cache_key("m", None)
    bad = ChatRequest(MSGS, json_schema=json.dumps({"type": "array"}))
    with pytest.raises(ValueError, match=r"request 1: unsupported json_schema: .*'type' \"array\""):
        validate_requests([structured, bad])


@pytest.fixture(scope="module")
def tokenizer(base_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_model_path)


def test_processor_yields_valid_json_whatever_the_logits(tokenizer):
    """Property-style: random logits (scaled up, with quotes, backslashes, newlines and EOS
    boosted to tempt the worst token) never produce text outside the schema."""
    import torch

    from mascot_dag.lib.llm.structured import SchemaProcessor, token_table

    eos = tokenizer.eos_token_id
    table = token_table(tokenizer)
    assert token_table(tokenizer) is table  # decoded once per tokenizer
    tempting = [i for i, t in enumerate(table.texts) if t and any(c in t for c in '"\\\n{}')]
    template = compile_schema(SCHEMA)
    judge = compile_schema(scores_schema(["consistency", "fidelity"], rationale_chars=30))
    vocab = len(tokenizer)
    t0 = time.monotonic()
    for seed in range(4):
        gen = torch.Generator().manual_seed(seed)
        rows = [template, judge, template, None]  # None: an unconstrained row is left alone
        proc = SchemaProcessor(tokenizer, rows, {eos})
        ids = torch.zeros(len(rows), 3, dtype=torch.long)  # a 3-token "prompt"
        done = [False] * len(rows)
        for _step in range(max(t.max_chars() for t in rows if t) + 1):
            scores = torch.randn(len(rows), vocab, generator=gen) * 8
            scores[:, tempting] += 6 * torch.rand(len(tempting), generator=gen)
            scores[:, eos] += 4
            out = proc(ids, scores.clone())
            if seed % 2:  # sampling from what is left, as _SeededSampler does, not only argmax
                nxt = torch.multinomial(out.softmax(-1), 1, generator=gen)
            else:
                nxt = out.argmax(-1, keepdim=True)
            assert torch.equal(out[3], scores[3])  # the unconstrained row is untouched
            nxt[[i for i, d in enumerate(done) if d]] = eos  # finished rows get padding
            done = [d or int(n) == eos for d, n in zip(done, nxt[:, 0], strict=True)]
            ids = torch.cat([ids, nxt], dim=1)
            if all(done[:3]):
                break
        assert all(done[:3]), f"seed {seed}: the template did not end within its max_chars"
        for row, t, schema in zip(
            ids[:3, 3:].tolist(), rows[:3], [SCHEMA, None, SCHEMA], strict=True
        ):
            text = tokenizer.decode(row[: row.index(eos)])
            assert t.pattern().fullmatch(text), (seed, text)
            value = json.loads(text)
            assert conforms(value, schema or scores_schema(["consistency", "fidelity"], 30))
    print(f"\n4 seeds x 3 constrained rows valid, e.g. {text!r}; {time.monotonic() - t0:.1f}s")


@pytest.mark.slow
def test_tiny_model_writes_schema_valid_json(base_model_path):
    from mascot_dag.lib.llm.transformers_backend import TransformersChat

    chat = TransformersChat(base_model_path, os.environ["MASCOT_MODELS_DIR"], batch_size=4)
    schema = json.dumps(SCHEMA)
    budget = compile_schema(SCHEMA).max_chars()  # a token has >= 1 char: never cut
    greedy = SamplingParams(max_new_tokens=budget, temperature=0.0, top_p=1.0)
    plain = ChatRequest(MSGS, SamplingParams(max_new_tokens=8, temperature=0.0, top_p=1.0))
    reqs = [ChatRequest(MSGS, greedy, json_schema=schema), plain]
    reqs += [ChatRequest(MSGS, SamplingParams(max_new_tokens=budget, temperature=0.9, seed=s),
                         json_schema=schema) for s in (1, 2)]  # fmt: skip
    t0 = time.monotonic()
    results = chat.generate(reqs)
    texts = [r.text for r in results]
    for k in (0, 2, 3):
        assert conforms(json.loads(texts[k]), SCHEMA), texts[k]
        assert results[k].completion_tokens < budget
    assert texts[2] != texts[3]  # sampled with their own seeds, still inside the schema
    # the schema-less request in the same call is what it is alone, and not JSON-shaped
    assert chat.generate([plain])[0].text == texts[1] and not texts[1].startswith("{")
    # cut by max_new_tokens: the result says so (completion_tokens == max_new_tokens)
    cut = chat.generate([ChatRequest(MSGS, SamplingParams(max_new_tokens=4, temperature=0.0),
                                     json_schema=schema)])[0]  # fmt: skip
    assert cut.completion_tokens == 4 and compile_schema(SCHEMA).pattern().match(cut.text) is None
    print(f"\n{texts}; {time.monotonic() - t0:.0f}s")


@pytest.fixture(scope="module")
def served(base_model_path):
    """`mascot serve` on a free loopback port, the tiny model named "smollm2"."""
    with mascot_serve("--model", base_model_path, "--served-model-name", "smollm2",
                      "--engine", "transformers") as url:
        yield url


@pytest.mark.slow
def test_served_response_format(served):
    from mascot_dag.lib.llm.http_backend import OpenAIChat

    client = openai.OpenAI(base_url=f"{served}/v1", api_key="x", max_retries=0, timeout=120)
    fmt = {"type": "json_schema", "json_schema": {"name": "rating", "schema": SCHEMA,
                                                  "strict": True}}  # fmt: skip
    kw = dict(model="smollm2", messages=list(MSGS), max_tokens=compile_schema(SCHEMA).max_chars())
    out = client.chat.completions.create(**kw, temperature=0, response_format=fmt)
    assert out.choices[0].finish_reason == "stop"
    assert conforms(json.loads(out.choices[0].message.content), SCHEMA)
    text = client.chat.completions.create(**kw | {"max_tokens": 6}, temperature=0,
                                          response_format={"type": "text"})  # fmt: skip
    assert not text.choices[0].message.content.startswith("{")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**kw, response_format={"type": "json_object"})
    body = err.value.response.json()["error"]
    assert "'json_object' is not supported" in body["message"]
    assert body["param"] == "response_format.type"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**kw, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"tags": {"type": "array"}},
                "required": ["tags"]}}})  # fmt: skip
    body = err.value.response.json()["error"]
    assert "$.properties.tags: unsupported 'type' \"array\"" in body["message"]
    assert body["param"] == "response_format.json_schema.schema"
    # the project's own HTTP backend sends a request's json_schema as response_format
    judge = json.dumps(best_schema(3))
    res = OpenAIChat(f"{served}/v1", model="smollm2").generate(
        [
            ChatRequest(
                MSGS, SamplingParams(max_new_tokens=12, temperature=0.9, seed=5), json_schema=judge
            )
        ]
    )
    assert json.loads(res[0].text)["best"] in (1, 2, 3)


@pytest.mark.slow
def test_tiny_model_as_structured_director_names_allowed_speakers(base_model_path):
    # without the schema the base 135M director is valid on the first try ~30-55% of the time
    # (scripts/bench_director.py); with it every first answer is a usable directive
    from mascot_dag.lib.data.personas import load_personas, personas_of_set
    from mascot_dag.lib.dialogue.engine import DialogueState, direct_turns
    from mascot_dag.lib.dialogue.spec import DialogueConfig, DialogueSpec
    from mascot_dag.lib.llm.transformers_backend import TransformersChat
    from mascot_dag.lib.types import Context

    roster = personas_of_set(load_personas(), "support")
    chat = TransformersChat(base_model_path, os.environ["MASCOT_MODELS_DIR"], batch_size=4)
    ctx = Context("ctx-1", "empatheticdialogues", "emotional_support", "I lost my job.",
                  "I lost my job and I feel useless.")
    states = []
    for i, last in enumerate(roster):  # each state forbids a different last speaker
        st = DialogueState(DialogueSpec(f"t:{i}", ctx, "support", roster, None, i, 4))
        st.add("user", "user", "I lost my job.", "dataset")
        st.add("agent", last.persona_id, "That is hard.", "test")
        states.append(st)
    decided = direct_turns(states, chat.generate, DialogueConfig(structured_director=True))
    for d, last in zip(decided, roster, strict=True):
        assert d["status"] == "ok", d["raw_output"]
        assert d["speaker"] != last.persona_id and d["action"]
