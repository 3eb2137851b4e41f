"""The chat with the companion group: its state (director pick, fallback, limits, the session
store), the page over real HTTP, and a real browser against `mascot chat --web` on the real tiny
model; the champion path registers a LoRA in a temporary MLflow store.

The fast tests drive the chat with a scripted chat function (fixed director and agent texts) in
place of the model, so that what the director "said" is known and the assertions are exact.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from conftest import free_port, stop_group

from mascot_dag.lib.data.personas import load_personas, personas_of_set
from mascot_dag.lib.dialogue.chat import (
    BASE_LABEL,
    MAX_MESSAGE_CHARS,
    ChatInputError,
    ChatSession,
    IdleSessions,
    UnknownSession,
    check_message,
    version_label,
)
from mascot_dag.lib.dialogue.guards import has_scaffolding, repeats
from mascot_dag.lib.dialogue.spec import DialogueConfig
from mascot_dag.lib.types import ChatRequest, ChatResult
from mascot_dag.web.chat import MAX_BODY_BYTES, ChatGroup, create_app, render

CARDS = load_personas()
SUPPORT = personas_of_set(CARDS, "support")
WORKPLACE = personas_of_set(CARDS, "workplace")
ROSTERS = {"support": SUPPORT, "workplace": WORKPLACE}
OWN_SETS = Path(__file__).resolve().parents[1] / "examples" / "own_group" / "personas"
STUDY_GROUP = {"The Tutor", "The Sceptic", "The Organiser"}


def _is_director(request: ChatRequest) -> bool:
    return request.messages[0]["content"].startswith("You are the director")


class Scripted:
    """A chat function with fixed answers: `director` for director requests, `agent` for the
    rest; records every request. Raises when a user message contains "boom"."""

    def __init__(self, director: str, agent: str = "That sounds hard. I am here with you.") -> None:
        self.director, self.agent = director, agent
        self.calls: list[ChatRequest] = []

    def __call__(self, requests_: list[ChatRequest]) -> list[ChatResult]:
        out = []
        for r in requests_:
            self.calls.append(r)
            if any("boom" in m["content"] for m in r.messages if m["role"] == "user"):
                raise RuntimeError("scripted model failure")
            out.append(ChatResult(self.director if _is_director(r) else self.agent, 10, 5))
        return out

    def director_calls(self) -> list[ChatRequest]:
        return [r for r in self.calls if _is_director(r)]


def test_director_pick_shows_persona_directive_and_version():
    model = Scripted(
        '{"speaker": "The Beacon", "action": "name the feeling", "tone": "gentle"}',
        "Beacon: It makes sense to feel low.\nUser: thanks",
    )
    config = DialogueConfig(
        agents_per_round=1, persona_adapters={"beacon": "beacon@v3"}, director_adapter="director@v2"
    )
    labels = {"beacon": version_label("mascot-persona-beacon", "3", "champion")}
    chat = ChatSession(SUPPORT, model, config, labels=labels)
    [(card, reply, d)] = chat.say("  I failed my\n driving test. ")
    assert card.persona_id == "beacon" and d["status"] == "ok"
    user, agent = chat.log
    assert user.text == "I failed my driving test." and user.role == "user"
    assert (agent.name, agent.action, agent.tone) == ("The Beacon", "name the feeling", "gentle")
    assert agent.model == "mascot-persona-beacon/3 (champion)"
    # the model's own label is stripped, and the turn ends where it starts writing the user's
    assert agent.text == reply == "It makes sense to feel low."
    director, speaker = model.calls
    assert director.adapter == "director@v2" and speaker.adapter == "beacon@v3"
    assert "name the feeling, in a gentle tone" in speaker.messages[0]["content"]


def test_invalid_directive_falls_back_and_never_repeats_a_speaker():
    model = Scripted("I think the Anchor should talk next, warmly.")  # prose, no JSON
    chat = ChatSession(SUPPORT, model, DialogueConfig(agents_per_round=2))
    chat.say("I lost my job.")
    chat.say("I do not know what to do now.")
    agents = [t for t in chat.log if t.role == "agent"]
    assert len(agents) == 4 and all(t.director_status == "fallback" for t in agents)
    assert len(model.director_calls()) == 8  # one retry per turn, then the fallback
    cards = {c.persona_id: c for c in SUPPORT}
    for prev, t in zip(agents, agents[1:], strict=False):
        assert t.speaker != prev.speaker
    for t in agents:
        assert t.action in cards[t.speaker].behaviours and t.tone == "warm"
        assert t.model == BASE_LABEL
    # least-used first: four fallback turns reach four different personas
    assert len({t.speaker for t in agents}) == 4


def test_workplace_roster_talks_in_meeting_mode():
    model = Scripted("no json")
    group = ChatGroup(ROSTERS, model, DialogueConfig(agents_per_round=1))
    chat = group.session("workplace", seed=1)
    chat.say("Plan the release for next week.")
    assert "hold a useful meeting" in model.calls[0].messages[0]["content"]
    agent = chat.log[-1]
    assert agent.speaker in {c.persona_id for c in WORKPLACE} and agent.tone == "constructive"


@pytest.mark.parametrize(
    "text,status,match",
    [
        ("", 400, "empty message"),
        (" \n\t ", 400, "empty message"),
        ("x" * (MAX_MESSAGE_CHARS + 1), 413, f"limit is {MAX_MESSAGE_CHARS}"),
        (None, 400, "must be text"),
    ],
)
def test_check_message_refuses_bad_input(text, status, match):
    with pytest.raises(ChatInputError, match=match) as info:
        check_message(text)
    assert info.value.status == status


def test_check_message_accepts_the_limit_and_collapses_whitespace():
    assert check_message("a  b\n") == "a b"
    assert len(check_message("y" * MAX_MESSAGE_CHARS)) == MAX_MESSAGE_CHARS


def test_session_store_is_bounded_and_names_unknown_ids():
    group = ChatGroup(ROSTERS, Scripted("{}"), DialogueConfig())
    now = [0.0]
    store = IdleSessions(group.session, max_sessions=2, idle_s=60, clock=lambda: now[0])
    first, _ = store.create("support")
    second, _ = store.create("workplace")
    with pytest.raises(ChatInputError, match="none has been idle") as full:
        store.create("support")  # both are active: nobody is pushed out
    assert full.value.status == 503
    now[0] = 50.0
    store.get(first)  # used again: `second` is now the only idle one
    now[0] = 100.0
    third, _ = store.create("support")
    assert len(store) == 2 and store.get(first).roster_set == "support"
    assert store.get(third).session is not store.get(first).session
    with pytest.raises(UnknownSession, match="start a new conversation"):
        store.get(second)
    with pytest.raises(UnknownSession):
        store.get(None)
    with pytest.raises(ChatInputError, match="unknown roster 'family'"):
        store.create("family")


@contextlib.contextmanager
def _serving(app):
    """`app` over real HTTP on 127.0.0.1 (uvicorn in a thread); yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def page_server():
    """The real app over real HTTP (uvicorn in a thread) with the scripted model."""
    model = Scripted('{"speaker": "anchor", "action": "reassure", "tone": "calm"}')
    labels = {"anchor": "mascot-persona-anchor/3 (champion)"}
    group = ChatGroup(ROSTERS, model, DialogueConfig(agents_per_round=1), labels)
    with _serving(create_app(group)) as base:
        yield base


def _field(html: str, name: str) -> str:
    marker = f'name="{name}" value="'
    start = html.index(marker) + len(marker)
    return html[start : html.index('"', start)]


def _sid(html: str) -> str:
    return _field(html, "session_id")


def _roster_choices(html: str) -> list[str]:
    """The sets the page's "New conversation" form offers."""
    return re.findall(r'<option value="([^"]*)"', html)


def test_page_answers_and_refuses_bad_input_with_4xx(page_server):
    s = requests.Session()
    first = s.get(page_server + "/", timeout=10)
    assert first.status_code == 200 and "The Anchor" in first.text
    assert _roster_choices(first.text) == ["support", "workplace"]  # the packaged sets
    assert _sid(first.text) == ""  # a GET opens no conversation (tests/test_web_security.py)
    token = _field(first.text, "csrf_token")  # the page's guard wants it back with every form

    def post(path: str, timeout: float = 10, **fields: str) -> requests.Response:
        return s.post(page_server + path, data={**fields, "csrf_token": token}, timeout=timeout)

    ok = post("/say", 30, session_id="", message="I feel lost.")  # the first message opens it
    assert ok.status_code == 200 and ok.history[0].status_code == 303
    sid = _sid(ok.text)
    assert sid and s.cookies.get("mascot_chat") == sid
    assert 'class="persona">The Anchor<' in ok.text and "reassure" in ok.text
    assert "mascot-persona-anchor/3 (champion)" in ok.text and "I feel lost." in ok.text

    empty = post("/say", session_id=sid, message="   ")
    assert empty.status_code == 400 and "empty message" in empty.text
    assert "I feel lost." in empty.text  # the transcript is still on the error page
    big = post("/say", session_id=sid, message="z" * (MAX_MESSAGE_CHARS + 5))
    assert big.status_code == 413 and f"the limit is {MAX_MESSAGE_CHARS}" in big.text
    huge = post("/say", session_id=sid, message="z" * MAX_BODY_BYTES)
    assert huge.status_code == 413 and "request body over" in huge.text
    unknown = post("/say", session_id="nope", message="hi")
    assert unknown.status_code == 404 and "unknown chat session &#x27;nope&#x27;" in unknown.text
    bad_roster = requests.get(page_server + "/?roster=family", timeout=10)
    assert bad_roster.status_code == 400 and "unknown roster" in bad_roster.text
    assert "choose one of: support, workplace" in bad_roster.text
    # a failing model is a 500 page for that message; the server keeps serving
    failed = post("/say", session_id=sid, message="boom")
    assert failed.status_code == 500 and "scripted model failure" in failed.text
    assert failed.text.count('class="turn user"') == 1  # the failed message was rolled back
    again = post("/new", roster="workplace")
    assert again.status_code == 200 and "The Facilitator" in again.text
    assert _sid(again.text) != sid and "I feel lost." not in again.text


def test_packaged_group_keeps_its_two_rosters_and_modes():
    group = ChatGroup(ROSTERS, Scripted("{}"), DialogueConfig())
    assert group.modes == {"support": "support", "workplace": "meeting"}
    assert group.default_roster == "support"
    with pytest.raises(ChatInputError, match="choose one of: support, workplace$"):
        create_app(group, default_roster="family")


def test_render_escapes_what_users_and_models_wrote():
    model = Scripted('{"speaker": "anchor", "action": "<b>x</b>", "tone": "calm"}', "<script>1")
    group = ChatGroup(ROSTERS, model, DialogueConfig(agents_per_round=1))
    store = IdleSessions(group.session)
    sid, conv = store.create("support")
    conv.session.say("<img src=x onerror=alert(1)>")
    page = render(group, conv, sid)
    assert "<img src=x" not in page and "&lt;img src=x" in page
    assert "<script>1" not in page and "&lt;b&gt;x&lt;/b&gt;" in page


# --- real model -------------------------------------------------------------------------------

MASCOT = Path(sys.executable).parent / "mascot"
START_TIMEOUT_S = 150  # imports + MLflow migrations + model load, on 2 shared cores


def _stop(proc: subprocess.Popen) -> None:
    stop_group(proc)  # its own group (start_new_session), never by name


@pytest.mark.slow
def test_browser_chat_on_the_base_model(browser, base_model_path, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    home, port = tmp_path / "home", free_port()  # an empty home: no champion in MLflow
    log = tmp_path / "server.log"
    env = {**os.environ, "MASCOT_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    # 12 agent tokens, one agent per message: a reply in ~5-25 s on 2 shared cores
    cmd = [
        str(MASCOT),
        "chat",
        "--web",
        "--port",
        str(port),
        "--max-new-tokens",
        "12",
        "--agents-per-round",
        "1",
        "--engine",  # starts in ~9 s; the champion test below speaks through vLLM
        "transformers",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"chat server exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"not up:\n{log.read_text()[-3000:]}"
            try:
                if requests.get(base + "/healthz", timeout=2).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.5)

        browser.set_page_load_timeout(180)  # the POST returns once the group has answered
        browser.get(base + "/")
        said = ["I failed my driving test today.", "I feel stupid, everyone passed but me.",
                "Thanks. What would you do in my place?"]
        for n, message in enumerate(said, 1):
            browser.find_element(By.NAME, "message").send_keys(message)
            browser.find_element(By.ID, "send").click()
            WebDriverWait(browser, 180).until(
                lambda b, n=n: len(b.find_elements(By.CSS_SELECTOR, ".turn.agent")) >= n)
        agents = browser.find_elements(By.CSS_SELECTOR, ".turn.agent")
        assert len(agents) == 3
        shown = list(said[:1])
        names = [n for c in SUPPORT for n in (c.persona_id, c.name)]
        for i, agent in enumerate(agents):
            assert agent.find_element(By.CLASS_NAME, "persona").text in {c.name for c in SUPPORT}
            # a directive is shown only when the director's JSON was valid (chat guards)
            if agent.find_elements(By.CSS_SELECTOR, ".directive.invalid"):
                assert agent.find_element(By.CLASS_NAME, "status").text.strip()
            else:
                assert agent.find_element(By.CLASS_NAME, "action").text.strip()
                assert agent.find_element(By.CLASS_NAME, "tone").text.strip()
            assert agent.find_element(By.CLASS_NAME, "model").text == BASE_LABEL
            text = agent.find_element(By.CLASS_NAME, "text").text.strip()
            assert text and not has_scaffolding(text, names, ""), text
            assert not repeats(text, shown), (text, shown)
            shown += [text] + said[i + 1 : i + 2]
        assert "135M" in browser.find_element(By.CLASS_NAME, "note").text
        assert said[0] in browser.find_element(By.ID, "log").text
        shot = tmp_path / "chat.png"
        assert browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 1000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        _stop(proc)
    assert proc.returncode is not None


@pytest.mark.slow
def test_champion_versions_speak_and_are_labelled(home, base_model_path, request):
    """A LoRA registered as `champion` of every support persona: the group attaches it (vLLM's
    engine, the chat's default, as `mascot serve`: a LoRA request per persona) and each agent
    turn names `mascot-persona-<id>/1 (champion)`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mascot_dag.registry import persona_model
    from mascot_dag.resources.tracking import MLflowResource
    from mascot_dag.web.chat import load_group

    torch.manual_seed(0)
    lora = home / "lora"
    cfg = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    get_peft_model(AutoModelForCausalLM.from_pretrained(base_model_path), cfg).save_pretrained(lora)
    tracking = MLflowResource()
    with tracking.start_run("chat-test", "lora") as run:
        tracking.log_adapter(lora)
    for card in SUPPORT:
        version = tracking.register_version(persona_model(card.persona_id), run)
        tracking.set_alias(persona_model(card.persona_id), "champion", version)

    from mascot_dag.lib.llm.vllm_backend import VLLMChat
    from mascot_dag.resources.llm import close_shared_vllm

    group = load_group("champion", max_new_tokens=6, agents_per_round=1, engine="vllm")
    request.addfinalizer(close_shared_vllm)  # its engine process holds GiBs
    assert isinstance(group.generate.__self__.backend(), VLLMChat)
    for card in SUPPORT:
        assert group.labels[card.persona_id] == f"{persona_model(card.persona_id)}/1 (champion)"
        assert group.config.persona_adapters[card.persona_id].endswith("@v1")
    assert group.labels["facilitator"] == BASE_LABEL and group.director_label == "base director"
    chat = group.session("support", seed=3)
    chat.say("My exam went badly.")
    agent = chat.log[-1]
    assert agent.model == f"{persona_model(agent.speaker)}/1 (champion)"
    # the directive schema (on by default) makes even the base director's first answer valid
    assert agent.director_status == "ok"


# --- a user's persona folder (issue 31) --------------------------------------------------------


@pytest.mark.slow
def test_page_serves_the_sets_of_the_users_persona_folder(home, base_model_path, monkeypatch):
    """MASCOT_PERSONAS_DIR with one set, study_group: the page offers exactly that set, a message
    gets a reply from one of its personas on the real tiny base model (no trained versions: the
    base model with persona prompts), and an unknown roster is one line naming study_group."""
    from mascot_dag.web.chat import load_group

    monkeypatch.setenv("MASCOT_PERSONAS_DIR", str(OWN_SETS))  # read when the group loads
    group = load_group("base", max_new_tokens=12, agents_per_round=1, engine="transformers")
    assert list(group.rosters) == ["study_group"] and group.modes == {"study_group": "support"}
    assert group.default_roster == "study_group"
    assert {c.name for c in group.rosters["study_group"]} == STUDY_GROUP
    with _serving(create_app(group)) as base:
        s = requests.Session()
        first = s.get(base + "/", timeout=10)
        assert first.status_code == 200
        assert _roster_choices(first.text) == ["study_group"]
        assert "Roster <b>study_group</b>" in first.text and "The Tutor" in first.text
        token = _field(first.text, "csrf_token")
        assert _field(first.text, "roster") == "study_group"  # the first message opens it there

        said = s.post(base + "/say", timeout=180, data={
            "session_id": "", "roster": "study_group", "csrf_token": token,
            "message": "I have an exam on Friday and have not started revising."})
        assert said.status_code == 200 and said.history[0].status_code == 303, said.text[-2000:]
        speakers = re.findall(r'class="persona">([^<]*)<', said.text)
        models = re.findall(r'class="model">([^<]*)<', said.text)
        assert len(speakers) == 1 and speakers[0] in STUDY_GROUP, speakers
        assert models == [BASE_LABEL]
        reply = re.search(r'<p class="text">(.*?)</p>', said.text, re.S)
        assert reply and reply.group(1).strip(), said.text[-2000:]

        for name, bad in (
            ("support", s.get(base + "/?roster=support", timeout=10)),  # a packaged set
            ("nosuch", s.post(base + "/new", data={"roster": "nosuch", "csrf_token": token},
                              timeout=10)),
        ):
            assert bad.status_code == 400
            errors = re.findall(r'<p class="error" role="alert">([^<]*)</p>', bad.text)
            assert errors == [f"unknown roster &#x27;{name}&#x27;; choose one of: study_group"]
    with pytest.raises(ChatInputError, match="unknown roster 'workplace'; choose one of: "
                       "study_group$"):
        create_app(group, default_roster="workplace")


def test_web_chat_refuses_a_roster_the_persona_folder_lacks(home, tmp_path):
    """`mascot chat --web --roster nosuch` with the user's folder: one line on stderr naming the
    folder's sets, a non-zero exit, and no server started (nothing listens on the port)."""
    port = free_port()
    env = {**os.environ, "MASCOT_HOME": str(home), "HF_HUB_OFFLINE": "1",
           "MASCOT_PERSONAS_DIR": str(OWN_SETS)}
    proc = subprocess.run(
        [str(MASCOT), "chat", "--web", "--roster", "nosuch", "--port", str(port)],
        env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    err = proc.stderr.strip()
    assert proc.returncode != 0, proc
    assert "Traceback" not in err and "╭" not in err, err
    assert len(err.splitlines()) == 1, err
    assert "--roster 'nosuch'" in err and "study_group" in err, err
    assert "Chat page on" not in proc.stdout
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # nothing was started there
