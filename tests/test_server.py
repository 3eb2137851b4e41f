"""`mascot serve` (FastAPI + uvicorn in front of vLLM's AsyncLLM) on the real embedded
SmolLM2-135M, driven by the official `openai` client over loopback HTTP: completions, token-by-token
streaming, adapters (one from the MLflow registry), /metrics, OpenAI-style errors for malformed
requests (and a property-based fuzz of the body), cancellation of abandoned generations, 20
concurrent requests, and the project's own HTTP backend against it.

ONE server for the module: the engine takes ~30-50 s to start on 2 cores."""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import requests as http
from conftest import free_port, mascot_serve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mascot_dag.lib.llm.http_backend import OpenAIChat
from mascot_dag.lib.types import ChatRequest, SamplingParams

pytestmark = pytest.mark.slow
BASE = "smollm2"  # --served-model-name
MSGS = [
    {"role": "system", "content": "You are a kind companion."},
    {"role": "user", "content": "I failed my driving test today."},
]
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def lora_uri(base_model_path, tmp_path_factory) -> tuple[str, Path]:
    """A random LoRA (non-zero B: it changes outputs) registered as mascot-anchor@champion in a
    fresh home's MLflow store, as the training stages register theirs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mascot_dag.lib.storage import tracking
    from mascot_dag.lib.storage.home import Home

    home = Home.from_env(tmp_path_factory.mktemp("serve_home"))
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(base_model_path)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                     init_lora_weights=False)  # fmt: skip
    folder = home.root / "lora"
    get_peft_model(base, cfg).save_pretrained(folder)
    tracking.configure(home.mlflow_uri, home.mlflow_artifacts)
    with tracking.start_run("serve_test", "anchor") as run:
        tracking.log_adapter(folder)
    tracking.set_alias("mascot-anchor", "champion", tracking.register_version("mascot-anchor", run))
    return "models:/mascot-anchor@champion", home.root


@pytest.fixture(scope="module")
def url(base_model_path, lora_uri):
    """`mascot serve` (vLLM engine, the default) with the base model and a registered LoRA."""
    uri, home = lora_uri
    with mascot_serve("--model", base_model_path, "--served-model-name", BASE, "--adapter", uri,
                      env={"MASCOT_HOME": str(home)}) as base_url:  # fmt: skip
        health = http.get(f"{base_url}/health", timeout=10).json()
        assert health["engine"] == "vllm"
        print(f"\nvLLM engine started in {health['engine_start_s']:.1f} s")
        yield base_url


@pytest.fixture(scope="module")
def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)


def generated_tokens(url: str) -> float:
    """vLLM's `vllm:generation_tokens_total` counter, from /metrics."""
    text = http.get(f"{url}/metrics", timeout=10).text
    found = re.search(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", text, re.M)
    assert found, text[:2000]
    return float(found.group(1))


def running(url: str) -> int:
    return http.get(f"{url}/health", timeout=10).json()["running"]


def wait_idle(url: str, timeout_s: float = 10.0) -> float:
    """Seconds until the engine has no unfinished request; fails after `timeout_s`."""
    t0 = time.monotonic()
    while running(url):
        assert time.monotonic() - t0 < timeout_s, "the engine is still generating"
        time.sleep(0.1)
    return time.monotonic() - t0


def test_chat_completion_and_adapters(client):
    plain = client.chat.completions.create(model=BASE, messages=MSGS, max_tokens=6,
                                           temperature=0, seed=1)  # fmt: skip
    choice = plain.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length") and plain.model == BASE
    assert plain.usage.prompt_tokens > 10 and 0 < plain.usage.completion_tokens <= 6
    # The registry adapter, selected by `model` (vLLM's way) or by the `adapter` field (ours).
    by_model = client.chat.completions.create(model="mascot-anchor", messages=MSGS,
                                              max_tokens=6, temperature=0)  # fmt: skip
    by_field = client.chat.completions.create(model=BASE, messages=MSGS, max_tokens=6,
                                              temperature=0,
                                              extra_body={"adapter": "mascot-anchor"})  # fmt: skip
    assert by_model.model == by_field.model == "mascot-anchor"
    assert by_model.choices[0].message.content == by_field.choices[0].message.content
    assert by_model.choices[0].message.content != choice.message.content
    assert [m.id for m in client.models.list()] == [BASE, "mascot-anchor"]
    # A stop string ends generation in the engine; the text stops before it.
    whole = choice.message.content
    stop = whole.split()[1] if len(whole.split()) > 1 else whole[-1]
    cut = client.chat.completions.create(model=BASE, messages=MSGS, max_tokens=6, temperature=0,
                                         seed=1, stop=[stop])  # fmt: skip
    assert cut.choices[0].finish_reason == "stop" and stop not in cut.choices[0].message.content
    assert whole.startswith(cut.choices[0].message.content)


def test_stream_equals_the_whole_text(client, url):
    kw = dict(model=BASE, messages=MSGS, max_tokens=8, temperature=0.9, top_p=0.95, seed=7)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and text == whole.choices[0].message.content
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    # Token by token: one chunk per generated token (a token that ends inside a UTF-8
    # character waits for the next one, hence <=).
    assert len(content) > 1, content  # streamed in pieces, not as one finished text
    assert len(content) <= chunks[-1].usage.completion_tokens, (len(content), chunks[-1].usage)
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    raw = http.post(f"{url}/v1/chat/completions", json={**kw, "stream": True}, timeout=60)
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.endswith("data: [DONE]\n\n") and raw.text.startswith("data: {")


def test_stream_sends_tokens_as_they_are_generated(client):
    """The first token arrives long before the last: chunks are not cut from a finished text."""
    t0 = time.monotonic()
    arrivals = []
    stream = client.chat.completions.create(model=BASE, messages=MSGS, max_tokens=64,
                                            temperature=0.9, seed=3, stream=True,
                                            extra_body={"ignore_eos": True})  # fmt: skip
    for c in stream:
        if c.choices and c.choices[0].delta.content:
            arrivals.append(time.monotonic() - t0)
    ttft, total = arrivals[0], arrivals[-1]
    print(f"\nstreamed 64 tokens: first after {ttft:.2f} s, last after {total:.2f} s")
    assert len(arrivals) > 32 and ttft < total / 4


def test_metrics_expose_vllm_counters(client, url):
    before = generated_tokens(url)
    out = client.chat.completions.create(model=BASE, messages=USER, max_tokens=5, temperature=0)
    text = http.get(f"{url}/metrics", timeout=10).text
    assert "vllm:num_requests_running" in text and "vllm:prompt_tokens_total" in text
    # The engine records an iteration's stats right after handing out its tokens: allow a moment.
    deadline = time.monotonic() + 2
    while generated_tokens(url) - before < out.usage.completion_tokens:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert generated_tokens(url) - before == out.usage.completion_tokens


def _error(exc: openai.APIStatusError) -> dict:
    return exc.response.json()["error"]


@pytest.mark.parametrize(
    ("kwargs", "error", "status", "param", "says"),
    [
        ({"messages": []}, openai.BadRequestError, 400, "messages", "non-empty list"),
        ({"max_tokens": "eight"}, openai.BadRequestError, 400, "max_tokens", "integer"),
        ({"temperature": -1}, openai.BadRequestError, 400, None, "temperature"),
        ({"temperature": 2.5}, openai.BadRequestError, 400, "temperature", "[0, 2]"),
        ({"max_tokens": 100_000}, openai.BadRequestError, 400, "max_tokens", "limit of 4096"),
        ({"max_tokens": 4090}, openai.BadRequestError, 400, "messages", "context length is 4096"),
        ({"n": 2}, openai.BadRequestError, 400, "n", "'n' must be 1"),
        ({"seed": 2**70}, openai.BadRequestError, 400, "seed", "64-bit"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, openai.BadRequestError, 400,
         "messages[0].role", "must be one of"),
        ({"model": "gpt-9"}, openai.NotFoundError, 404, "model", '"gpt-9" does not exist'),
        ({"extra_body": {"adapter": "nobody"}}, openai.NotFoundError, 404, "adapter",
         '"nobody" is not loaded'),
        ({"messages": [{"role": "user", "content": "x" * (1 << 20)}]}, openai.APIStatusError,
         413, None, "limit of 1048576 bytes"),
    ],
)  # fmt: skip
def test_bad_requests_get_openai_errors(client, kwargs, error, status, param, says):
    kw = {"model": BASE, "messages": MSGS, "max_tokens": 4, **kwargs}
    with pytest.raises(error) as info:
        client.chat.completions.create(**kw)
    body = _error(info.value)
    assert info.value.status_code == status and says in body["message"]
    assert body["param"] == param and body["type"] == "invalid_request_error"
    if status == 404:
        assert body["code"] == "model_not_found"


def _post(url: str, raw: bytes | str, session=http) -> http.Response:
    return session.post(f"{url}/v1/chat/completions", data=raw, timeout=60,
                        headers={"content-type": "application/json"})  # fmt: skip


def _assert_openai_error(resp: http.Response) -> dict:
    """A 4xx with an OpenAI error body: {"error": {"message", "type", "param", "code"}}."""
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text[:500])
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == "invalid_request_error" and set(err) == {"message", "type", "param",
                                                                    "code"}  # fmt: skip
    return err


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ('{"messages": [1]}', "messages[0] must be an object"),
        ('{"messages": [{"content": "hi"}]}', "messages[0] must be an object with 'role'"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"messages": [{"role": "user", "content": "\\ud800"}]}', "lone UTF-16 surrogate"),
        ('{"messages": [{"role": "user", "content": "hi"}], "seed": ' + str(2**70) + "}", "64-bit"),
        ('{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "finite"),
        ('{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}', "finite"),
        ('{"messages": [{"role": "user", "content": "hi"}], "top_p": -Infinity}', "finite"),
        ('{"messages": [{"role": "user", "content": "hi"}], "top_p": 1e999}', "finite"),
        ('{"messages": [{"role": "user", "content": "hi"}], "seed": 1' + "0" * 5000 + "}",
         "invalid JSON"),
        ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', "max_new_tokens"),
        ("{not json", "invalid JSON"),
        ('["not", "an", "object"]', "JSON object"),
        ('{"model": "smollm2"}', "'messages'"),
        ('{"messages": [{"role": "user", "content": 3}]}', "messages[0].content"),
    ],
)  # fmt: skip
def test_malformed_bodies_get_4xx_not_500(url, raw, says):
    err = _assert_openai_error(_post(url, raw))
    assert says in err["message"]


def test_tiny_temperature_and_unknown_endpoints(url):
    # 1e-300 is a valid temperature (in [0, 2]): vLLM clamps it to its smallest, near-greedy one.
    body = {"messages": USER, "temperature": 1e-300, "max_tokens": 2}
    resp = _post(url, json.dumps(body))
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2
    resp = http.get(f"{url}/v1/nothing", timeout=10)
    assert resp.status_code == 404 and "no such endpoint" in resp.json()["error"]["message"]


# ---- property-based fuzz of the request body ------------------------------------------------
_text = st.text(max_size=12) | st.just("\ud800")  # a lone surrogate goes out as "\ud800"
_leaf = st.none() | st.booleans() | st.integers() | st.floats() | _text
_junk = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                     max_leaves=6)  # fmt: skip
_good_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=20)}
)
_message = _good_message | st.dictionaries(st.sampled_from(["role", "content"]), _junk) | _junk
_schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
# A valid body: it generates 1-2 tokens (a prompt costs ~1 s of prefill on 2 busy cores).
_valid = st.fixed_dictionaries(
    {"messages": st.lists(_good_message, min_size=1, max_size=2), "max_tokens": st.integers(1, 2)},
    optional={
        "model": st.sampled_from([BASE, "mascot-anchor"]),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.01, 1),
        "seed": st.integers(0, 2**63 - 1),
        "stop": st.lists(st.text(min_size=1, max_size=3), max_size=2),
        "stream": st.booleans(),
        "stream_options": st.just({"include_usage": True}),
        "response_format": st.sampled_from([{"type": "text"}, {"type": "json_schema",
                                             "json_schema": {"name": "s", "schema": _schema}}]),
        "adapter": st.just("mascot-anchor"),
        "ignore_eos": st.booleans(),
    },
)  # fmt: skip
_FIELDS = ["messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p",
           "seed", "stop", "n", "stream", "stream_options", "response_format", "adapter",
           "ignore_eos"]  # fmt: skip
_edge = st.sampled_from([math.nan, math.inf, -math.inf, 1e-300, 1e999, -1, 0, 2**63, 2**70, ""])
_mutation = st.dictionaries(
    st.sampled_from(_FIELDS), _junk | _edge | st.lists(_message, max_size=3), min_size=1, max_size=2
)


def _mutate(body: dict, changes: dict) -> dict:
    for key, value in changes.items():
        # Never a long generation, so that a fuzz case stays fast: no token count of 3-4096,
        # and no null max_tokens (the server's default is 48).
        if key.endswith("tokens") and type(value) is int and 2 < value <= 4096:
            value += 5000
        if key == "max_tokens" and value is None:
            continue
        body[key] = value
    return body


# 5% valid bodies, 70% valid bodies with one or two fields broken (most are 4xx, a few still
# valid), 15% any JSON value, 10% bytes that are rarely JSON.
_raw = (
    st.integers(0, 19)
    .flatmap(
        lambda k: (
            _valid
            if k == 0
            else st.builds(_mutate, _valid, _mutation)
            if k < 15
            else _junk
            if k < 18
            else st.binary(max_size=40)
        )
    )
    .map(lambda v: v if isinstance(v, bytes) else json.dumps(v))
)  # NaN and Infinity: bare tokens


@pytest.fixture(scope="module")
def session():
    with http.Session() as s:  # one keep-alive connection: 200 cases in seconds
        yield s


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(raw=_raw)
def test_fuzzed_bodies_never_get_a_500(url, session, raw):
    resp = _post(url, raw, session)
    assert resp.status_code < 500, (raw[:300], resp.text[:500])
    if resp.status_code >= 400:
        _assert_openai_error(resp)
    elif resp.headers["content-type"].startswith("text/event-stream"):
        assert resp.text.endswith("data: [DONE]\n\n")
    else:
        assert resp.json()["usage"]["completion_tokens"] <= 2


# ---- abandoned generations are cancelled ----------------------------------------------------
LONG = {"model": BASE, "messages": MSGS, "max_tokens": 1000, "ignore_eos": True,
        "temperature": 0.9, "seed": 5}  # fmt: skip


def _served_alone(client, url: str) -> float:
    """Serve a short request after a cancelled one and return its seconds (a printed figure).
    The engine's token counter grows by exactly this request's tokens: nothing of the cancelled
    request is still being generated beside it."""
    before = generated_tokens(url)
    t0 = time.monotonic()
    out = client.chat.completions.create(model=BASE, messages=USER, max_tokens=4, temperature=0)
    took = time.monotonic() - t0
    assert out.choices[0].message.content
    wait_idle(url)  # the counter is updated as the engine's step stats arrive
    assert generated_tokens(url) - before == out.usage.completion_tokens
    return took


def _send(url: str, body: dict) -> socket.socket:
    """POST `body` on a raw socket, so the test decides exactly when the client goes away."""
    raw = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                 b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                 % (len(raw), raw))  # fmt: skip
    return sock


def test_closed_stream_cancels_its_generation(client, url):
    wait_idle(url)
    before = generated_tokens(url)
    t0 = time.monotonic()
    with _send(url, {**LONG, "stream": True}) as sock:
        seen = b""
        while not re.search(rb'"delta": \{"content": "[^"]', seen):  # the first token's chunk
            got = sock.recv(65536)
            assert got, seen[-500:]
            seen += got
        ttft = time.monotonic() - t0
    idle_s = wait_idle(url)  # the client has gone: the engine must drop the request
    spent = generated_tokens(url) - before
    took = _served_alone(client, url)
    print(
        f"\nstream closed after its first token ({ttft:.2f} s): {spent:.0f} of 1000 tokens "
        f"generated, engine idle {idle_s:.2f} s later, next request served in {took:.2f} s"
    )
    assert spent >= 1, "generation never began"
    assert spent < 100, f"{spent:.0f} of 1000 tokens: the engine kept generating for nobody"


def test_abandoned_request_cancels_its_generation(client, url):
    """A non-streamed request whose client disconnects while it waits is aborted too."""
    wait_idle(url)
    before = generated_tokens(url)
    with _send(url, LONG):
        deadline = time.monotonic() + 30
        while generated_tokens(url) == before:  # generation has begun
            assert time.monotonic() < deadline
            time.sleep(0.05)
    idle_s = wait_idle(url)
    spent = generated_tokens(url) - before
    took = _served_alone(client, url)
    print(
        f"\nabandoned request: {spent:.0f} of 1000 tokens generated, engine idle {idle_s:.2f} s "
        f"after the client left, next request served in {took:.2f} s"
    )
    assert spent >= 1, "generation never began"
    assert spent < 100, f"{spent:.0f} of 1000 tokens: the engine kept generating for nobody"


def test_twenty_concurrent_requests_share_the_engine(client, url):
    def ask(i: int) -> str:
        msgs = [{"role": "user", "content": f"Tell me about the number {i}."}]
        out = client.chat.completions.create(model=BASE, messages=msgs, max_tokens=4,
                                             temperature=0.9, seed=i)  # fmt: skip
        return out.choices[0].message.content

    before = http.get(f"{url}/health", timeout=10).json()
    health_s: list[float] = []
    most = 0
    t0 = time.monotonic()
    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(ask, i) for i in range(20)]
        while not all(f.done() for f in futures):  # /health answers while generation runs
            t = time.monotonic()
            resp = http.get(f"{url}/health", timeout=10)
            health_s.append(time.monotonic() - t)
            most = max(most, resp.json()["running"])
            time.sleep(0.1)
        texts = [f.result() for f in futures]
    wall = time.monotonic() - t0
    after = http.get(f"{url}/health", timeout=10).json()
    assert all(texts) and len(texts) == 20
    print(f"\n20 requests in {wall:.1f} s, at most {most} in the engine at once, health max "
          f"{max(health_s, default=0):.3f} s")  # fmt: skip
    assert after["requests"] - before["requests"] == 20 and most > 1
    assert max(health_s, default=0) < 2.0


def test_project_http_backend_against_serve(url):
    """What `OpenAIChat` (the LLM judge's backend) sends still works against mascot serve."""
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    reqs = [ChatRequest(tuple(MSGS), sampling), ChatRequest(tuple(MSGS), sampling, "mascot-anchor")]
    ours = OpenAIChat(f"{url}/v1", model=BASE).generate(reqs)
    vllm_style = OpenAIChat(f"{url}/v1", model=BASE, adapter_as_model=True).generate(reqs)
    assert [r.text for r in ours] == [r.text for r in vllm_style]
    assert ours[0].text != ours[1].text and all(r.completion_tokens > 0 for r in ours)
    body = OpenAIChat(f"{url}/v1", model=BASE).payload(reqs[1])
    assert json.loads(json.dumps(body))["adapter"] == "mascot-anchor"
    # Structured outputs: the engine enforces the schema.
    schema = {"type": "object", "properties": {"score": {"type": "integer", "enum": [1, 2, 3]}},
              "required": ["score"]}  # fmt: skip
    judged = OpenAIChat(f"{url}/v1", model=BASE).generate(
        [ChatRequest(tuple(MSGS), SamplingParams(max_new_tokens=20, temperature=0.0),
                     json_schema=json.dumps(schema))])  # fmt: skip
    assert json.loads(judged[0].text)["score"] in (1, 2, 3)


def test_backend_failure_is_a_500_with_an_error_body():
    """A backend that fails (here: the project's HTTP backend aimed at a closed port, as when a
    proxied upstream is down) gives the client a 500 OpenAI error, not a hang or a text page."""
    import uvicorn

    from mascot_dag.lib.serving.server import create_app

    upstream = OpenAIChat(f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=0)
    app = create_app(upstream, "proxy", adapters=[])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        while not server.started:
            time.sleep(0.05)
        resp = http.post(f"{url}/v1/chat/completions", json={"messages": MSGS}, timeout=30)
        err = resp.json()["error"]
        assert resp.status_code == 500 and err["type"] == "server_error"
        assert "ChatBackendError" in err["message"] and "Is the server running" in err["message"]
        assert http.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"] == "proxy"
        assert http.get(f"{url}/health", timeout=10).json()["engine"] == "batched"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_transformers_engine_for_machines_without_vllm(base_model_path):
    """`--engine transformers`: the same app over TransformersChat (whole texts, one chunk)."""
    from fastapi.testclient import TestClient

    from mascot_dag.lib.llm.transformers_backend import TransformersChat
    from mascot_dag.lib.serving.server import create_app

    backend = TransformersChat(base_model_path, str(Path(base_model_path).parent), batch_size=2)
    with TestClient(create_app(backend, BASE)) as tc:  # runs the lifespan, like uvicorn
        body = {"messages": USER, "max_tokens": 4, "temperature": 0, "seed": 1}
        whole = tc.post("/v1/chat/completions", json=body).json()
        streamed = tc.post("/v1/chat/completions", json={**body, "stream": True}).text
        assert whole["usage"]["completion_tokens"] == 4 and whole["choices"][0]["message"]
        events = [json.loads(x[6:]) for x in streamed.split("\n\n") if x.startswith("data: {")]
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
        assert text == whole["choices"][0]["message"]["content"] and "[DONE]" in streamed
        refused = tc.post("/v1/chat/completions", json={**body, "ignore_eos": True})
        assert refused.status_code == 400 and "vLLM engine" in refused.json()["error"]["message"]
        assert tc.get("/health").json()["engine"] == "batched"
