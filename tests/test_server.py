"""`mascot serve` (FastAPI + uvicorn) on the real embedded SmolLM2-135M, driven by the official
`openai` client: completions, streaming, adapters (one from the MLflow registry), OpenAI-style
errors, 20 concurrent requests, and the project's own HTTP backend against it."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import requests as http
from conftest import free_port, mascot_serve

from mascot_dag.lib.llm.http_backend import OpenAIChat
from mascot_dag.lib.types import ChatRequest, SamplingParams

pytestmark = pytest.mark.slow
BASE = "smollm2"  # --served-model-name
MSGS = [
    {"role": "system", "content": "You are a kind companion."},
    {"role": "user", "content": "I failed my driving test today."},
]


@pytest.fixture(scope="module")
def lora_uri(base_model_path, tmp_path_factory) -> tuple[str, Path]:
    """A random LoRA (non-zero B: it changes outputs) registered as mascot-anchor@champion in a
    fresh home's MLflow store, as the training stages register theirs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mascot_dag.lib import tracking
    from mascot_dag.lib.home import Home

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
    """`mascot serve` with the base model and a registered LoRA, on a free loopback port."""
    uri, home = lora_uri
    with mascot_serve("--model", base_model_path, "--served-model-name", BASE, "--adapter", uri,
                      env={"MASCOT_HOME": str(home)}) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)


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


def test_stream_equals_the_whole_text(client, url):
    kw = dict(model=BASE, messages=MSGS, max_tokens=8, temperature=0.9, top_p=0.95, seed=7)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and text == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    raw = http.post(f"{url}/v1/chat/completions", json={**kw, "stream": True}, timeout=60)
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.endswith("data: [DONE]\n\n") and raw.text.startswith("data: {")


def _error(exc: openai.APIStatusError) -> dict:
    return exc.response.json()["error"]


@pytest.mark.parametrize(
    ("kwargs", "error", "status", "param", "says"),
    [
        ({"messages": []}, openai.BadRequestError, 400, "messages", "non-empty list"),
        ({"max_tokens": "eight"}, openai.BadRequestError, 400, "max_tokens", "integer"),
        ({"temperature": -1}, openai.BadRequestError, 400, None, "temperature"),
        ({"max_tokens": 100_000}, openai.BadRequestError, 400, "max_tokens", "limit of 4096"),
        ({"n": 2}, openai.BadRequestError, 400, "n", "'n' must be 1"),
        ({"model": "gpt-9"}, openai.NotFoundError, 404, "model", "'gpt-9' does not exist"),
        ({"extra_body": {"adapter": "nobody"}}, openai.NotFoundError, 404, "adapter",
         "'nobody' is not loaded"),
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


def test_malformed_bodies_and_unknown_endpoints(url):
    post = f"{url}/v1/chat/completions"
    resp = http.post(post, data="{not json", timeout=10)
    assert resp.status_code == 400 and "invalid JSON" in resp.json()["error"]["message"]
    resp = http.post(post, json={"model": BASE}, timeout=10)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"
    resp = http.post(post, json=["not", "an", "object"], timeout=10)
    assert resp.status_code == 400 and "JSON object" in resp.json()["error"]["message"]
    resp = http.post(post, json={"messages": [{"role": "user", "content": 3}]}, timeout=10)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages[0].content"
    resp = http.get(f"{url}/v1/nothing", timeout=10)
    assert resp.status_code == 404 and "no such endpoint" in resp.json()["error"]["message"]


def test_twenty_concurrent_requests_are_batched(client, url):
    def ask(i: int) -> str:
        msgs = [{"role": "user", "content": f"Tell me about the number {i}."}]
        out = client.chat.completions.create(model=BASE, messages=msgs, max_tokens=4,
                                             temperature=0.9, seed=i)  # fmt: skip
        return out.choices[0].message.content

    before = http.get(f"{url}/health", timeout=10).json()
    health_s: list[float] = []
    t0 = time.monotonic()
    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(ask, i) for i in range(20)]
        while not all(f.done() for f in futures):  # /health answers while generation runs
            t = time.monotonic()
            assert http.get(f"{url}/health", timeout=10).status_code == 200
            health_s.append(time.monotonic() - t)
            time.sleep(0.2)
        texts = [f.result() for f in futures]
    wall = time.monotonic() - t0
    after = http.get(f"{url}/health", timeout=10).json()
    assert all(texts) and len(texts) == 20
    batches = after["batches"] - before["batches"]
    print(f"20 requests in {wall:.1f} s, {batches} backend calls, health max "
          f"{max(health_s, default=0):.3f} s")  # fmt: skip
    assert after["requests"] - before["requests"] == 20 and batches < 20
    assert after["largest_batch"] > 1
    assert max(health_s, default=0) < 2.0
    assert ask(3) == texts[3]  # a request's text does not depend on its batch


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


def test_backend_failure_is_a_500_with_an_error_body():
    """A backend that fails (here: the project's HTTP backend aimed at a closed port, as when a
    proxied upstream is down) gives the client a 500 OpenAI error, not a hang or a text page."""
    import socket

    import uvicorn

    from mascot_dag.lib.llm.server import create_app

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
    finally:
        server.should_exit = True
        thread.join(timeout=10)
