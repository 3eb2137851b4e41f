"""The loopback pages against hostile clients (issue 30, item 4): real servers on 127.0.0.1 (the
rating page as `mascot rate` in a subprocess on a real DuckDB file, the chat page in uvicorn with
the scripted model), real HTTP requests with forged Origin, Referer and Host headers, missing or
wrong form tokens, and cookie-less clients. What was stored is read back from DuckDB or from the
chat page itself, never from the server's own answer alone.
"""

from __future__ import annotations

import html
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests
from conftest import free_port, rate_page, stop_group, wait_healthy
from fastapi import FastAPI, Request, WebSocket
from test_human_eval import ITEM, _form, _write_db
from test_web_chat import ROSTERS, Scripted

from mascot_dag.lib.dialogue.spec import DialogueConfig
from mascot_dag.lib.storage import db
from mascot_dag.web import guard
from mascot_dag.web.chat import ChatGroup, create_app

EVIL = "http://evil.example"
TOKEN_RE = re.compile(r"""name=['"]csrf_token['"] value=['"]([^'"]*)['"]""")


def _token(text: str) -> str:
    """The form token a page carries ("" where it carries none: the code before the guard)."""
    m = TOKEN_RE.search(text)
    return html.unescape(m.group(1)) if m else ""


def _stored(path, rater: str) -> tuple[int, int]:
    r = db.query_pl(path, "SELECT (SELECT count(*) FROM human_ratings WHERE rater = ?) a, "
                          "(SELECT count(*) FROM human_choices WHERE rater = ?) b", [rater, rater])
    return int(r["a"][0]), int(r["b"][0])


# ---- the rating page -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rate_server(tmp_path_factory):
    """`mascot rate` with one more host name configured through the environment."""
    home = tmp_path_factory.mktemp("rate_sec")
    _write_db(home / "mascot.duckdb")
    with rate_page(home, MASCOT_ALLOWED_HOSTS="node7.cluster") as (base, port):
        yield base, port, home / "mascot.duckdb"


def _rater_session(base: str, rater: str) -> tuple[requests.Session, str]:
    """A browser's state after opening the item: its cookies and the form's token."""
    s = requests.Session()
    page = s.get(f"{base}/item", params={"rater": rater, "item": ITEM}, timeout=30)
    assert page.status_code == 200
    return s, _token(page.text)


def test_rate_refuses_cross_origin_posts_and_stores_nothing(rate_server):
    base, _, path = rate_server
    # the attack as reported: a foreign page posts a whole, valid form
    r = requests.post(f"{base}/item", data=_form("mallet"), headers={"Origin": EVIL}, timeout=30)
    assert r.status_code == 403 and "cross-origin" in r.text, r.text[:300]
    assert _stored(path, "mallet") == (0, 0)
    # even with the rater's cookie and token, another Origin is refused
    s, token = _rater_session(base, "mallet")
    r = s.post(f"{base}/item", data=_form("mallet", csrf_token=token), headers={"Origin": EVIL},
               timeout=30)
    assert r.status_code == 403 and "cross-origin" in r.text
    # no Origin, a foreign Referer; an opaque origin ("null": sandboxed frames, data: pages)
    for headers in ({"Referer": EVIL + "/rate.html"}, {"Origin": "null"},
                    {"Origin": f"{base}.evil.example"}):
        r = s.post(f"{base}/item", data=_form("mallet", csrf_token=token), headers=headers,
                   timeout=30)
        assert r.status_code == 403 and "cross-origin" in r.text, headers
    assert _stored(path, "mallet") == (0, 0)


def test_rate_refuses_posts_without_their_sessions_token(rate_server):
    base, _, path = rate_server
    same = {"Origin": base}
    r = requests.post(f"{base}/item", data=_form("tokenless"), headers=same, timeout=30)
    assert r.status_code == 403 and "form token" in r.text, r.text[:300]
    s, token = _rater_session(base, "tokenless")
    other, other_token = _rater_session(base, "someone")
    assert token and other_token and token != other_token  # per browser session
    for form in (_form("tokenless"), _form("tokenless", csrf_token="x" * 43),
                 _form("tokenless", csrf_token=other_token)):
        r = s.post(f"{base}/item", data=form, headers=same, timeout=30)
        assert r.status_code == 403 and "form token" in r.text
    # the right token without the cookie it belongs to
    r = requests.post(f"{base}/item", data=_form("tokenless", csrf_token=token), headers=same,
                      timeout=30)
    assert r.status_code == 403 and "form token" in r.text
    assert _stored(path, "tokenless") == (0, 0)


def test_rate_stores_a_same_origin_form_with_its_token(rate_server):
    base, _, path = rate_server
    s, token = _rater_session(base, "trent")
    r = s.post(f"{base}/item", data=_form("trent", csrf_token=token), headers={"Origin": base},
               timeout=30)
    assert r.status_code == 200 and 'id="confirmation"' in r.text.replace("'", '"')
    assert _stored(path, "trent") == (27, 1)
    # a script holding the cookie and the token sends neither Origin nor Referer: accepted
    r = s.post(f"{base}/item", data=_form("trent", best="C", csrf_token=token), timeout=30)
    assert r.status_code == 200 and _stored(path, "trent") == (27, 1)


def test_rate_answers_only_the_host_names_it_serves(rate_server):
    base, port, path = rate_server
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", "127.0.0.1"):
        r = requests.get(f"{base}/", headers={"Host": host}, timeout=30)
        assert r.status_code == 400 and "not served here" in r.text, (host, r.status_code)
        assert "evil" not in host or "MASCOT_ALLOWED_HOSTS" in r.text  # says how to allow one
    s, token = _rater_session(base, "rebind")
    r = s.post(f"{base}/item", data=_form("rebind", csrf_token=token),
               headers={"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"},
               timeout=30)
    assert r.status_code == 400 and _stored(path, "rebind") == (0, 0)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}",
                 "node7.cluster", f"node7.cluster:{port}", "node7.cluster:443"):
        r = requests.get(f"{base}/", headers={"Host": host}, timeout=30)
        assert r.status_code == 200, (host, r.text[:200])


def test_rate_allow_host_option(tmp_path):
    _write_db(tmp_path / "mascot.duckdb")
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, "MASCOT_HOME": str(tmp_path)}
    env.pop("MASCOT_ALLOWED_HOSTS", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mascot_dag.cli", "rate", "--port",
                                 str(port), "--allow-host", "gpu-3.lab:9000"], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{base}/healthz", proc, 60, "mascot rate", log.read_text)
        assert requests.get(f"{base}/", headers={"Host": "gpu-3.lab:9000"}, timeout=30).ok
        r = requests.get(f"{base}/", headers={"Host": "gpu-3.lab:9001"}, timeout=30)
        assert r.status_code == 400
        assert requests.get(f"{base}/", headers={"Host": "node7.cluster"},
                            timeout=30).status_code == 400
    finally:
        stop_group(proc)


# ---- the chat page ---------------------------------------------------------------------------

@pytest.fixture
def chat_server():
    """Starts the chat app (with `create_app` options) in uvicorn threads; stops them after."""
    import uvicorn

    running = []

    def start(**options) -> str:
        model = Scripted('{"speaker": "anchor", "action": "reassure", "tone": "calm"}')
        group = ChatGroup(ROSTERS, model, DialogueConfig(agents_per_round=1))
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(group, **options), host="127.0.0.1",
                                               port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        running.append((server, thread))
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(timeout=10)


def _sessions(base: str) -> int:
    return requests.get(f"{base}/healthz", timeout=10).json()["sessions"]


def _open(base: str, roster: str = "support") -> tuple[requests.Session, str, str]:
    """A browser opening a conversation as the page offers it: (its cookies, sid, token)."""
    s = requests.Session()
    token = _token(s.get(f"{base}/", timeout=10).text)
    r = s.post(f"{base}/new", data={"roster": roster, "csrf_token": token},
               headers={"Origin": base}, timeout=10)
    assert r.status_code == 200, r.text[:300]
    return s, s.cookies.get("mascot_chat"), token


def _say(s: requests.Session, base: str, sid: str, token: str, text: str) -> requests.Response:
    return s.post(f"{base}/say", data={"session_id": sid, "message": text, "csrf_token": token},
                  headers={"Origin": base}, timeout=30)


def test_chat_refuses_a_cross_site_new_conversation(chat_server):
    base = chat_server()
    r = requests.post(f"{base}/new", data={"roster": "workplace"}, headers={"Origin": EVIL},
                      timeout=10)
    assert r.status_code == 403 and "cross-origin" in r.text, r.text[:300]
    assert _sessions(base) == 0
    s, sid, token = _open(base)
    r = s.post(f"{base}/new", data={"roster": "workplace", "csrf_token": token},
               headers={"Origin": EVIL}, timeout=10)
    assert r.status_code == 403 and _sessions(base) == 1


def test_chat_refuses_a_message_from_another_origin(chat_server):
    base = chat_server()
    s, sid, token = _open(base)
    r = s.post(f"{base}/say", data={"session_id": sid, "message": "forged words",
                                    "csrf_token": token},
               headers={"Referer": EVIL + "/x"}, timeout=30)
    assert r.status_code == 403 and "cross-origin" in r.text
    r = requests.post(f"{base}/say", data={"session_id": sid, "message": "forged words"},
                      headers={"Origin": EVIL}, timeout=30)
    assert r.status_code == 403
    assert "forged words" not in s.get(f"{base}/", timeout=10).text  # the transcript is intact


def test_chat_refuses_posts_without_the_token(chat_server):
    base = chat_server()
    r = requests.post(f"{base}/new", data={"roster": "support"}, headers={"Origin": base},
                      timeout=10)
    assert r.status_code == 403 and "form token" in r.text, r.text[:300]
    assert _sessions(base) == 0
    s, sid, token = _open(base)
    for bad in ("", "A" * 43):
        r = s.post(f"{base}/say", data={"session_id": sid, "message": "no token",
                                        "csrf_token": bad}, headers={"Origin": base}, timeout=30)
        assert r.status_code == 403 and "form token" in r.text
    assert "no token" not in s.get(f"{base}/", timeout=10).text and _sessions(base) == 1


def test_chat_answers_only_the_host_names_it_serves(chat_server, monkeypatch):
    monkeypatch.setenv("MASCOT_ALLOWED_HOSTS", "lab.example, Node7.Cluster:8443")
    base = chat_server(allowed_hosts=["chat.cluster"])
    port = int(base.rsplit(":", 1)[1])
    for host in ("evil.example", f"evil.example:{port}", "lab.example.evil.example"):
        r = requests.get(f"{base}/", headers={"Host": host}, timeout=10)
        assert r.status_code == 400 and "not served here" in r.text, host
    r = requests.post(f"{base}/new", data={"roster": "support"},
                      headers={"Host": f"evil.example:{port}",
                               "Origin": f"http://evil.example:{port}"}, timeout=10)
    assert r.status_code == 400 and _sessions(base) == 0
    for host in (f"localhost:{port}", f"[::1]:{port}", "chat.cluster", f"lab.example:{port}",
                 "node7.cluster:8443"):
        assert requests.get(f"{base}/", headers={"Host": host}, timeout=10).ok, host


def test_cookieless_gets_open_nothing_and_push_no_conversation_out(chat_server):
    base = chat_server()
    s, sid, token = _open(base)
    assert _say(s, base, sid, token, "I feel lost.").status_code == 200
    for _ in range(65):  # more than the store holds (64)
        assert requests.get(f"{base}/", timeout=10).status_code == 200
    assert _sessions(base) == 1
    page = s.get(f"{base}/", timeout=10).text
    assert "I feel lost." in page
    assert _say(s, base, sid, token, "Still here?").status_code == 200


def test_first_message_opens_the_conversation(chat_server):
    """What a browser does on a fresh page: type, send (the form's token travels with it)."""
    base = chat_server()
    s = requests.Session()
    page = s.get(f"{base}/", timeout=10).text
    assert 'name="message"' in page and _sessions(base) == 0
    r = _say(s, base, "", _token(page), "I failed my exam.")
    assert r.status_code == 200 and "I failed my exam." in r.text
    assert s.cookies.get("mascot_chat") and _sessions(base) == 1


def test_a_full_page_evicts_only_idle_conversations(chat_server):
    now = [0.0]
    base = chat_server(max_sessions=2, idle_s=600, clock=lambda: now[0])
    a, sid_a, tok_a = _open(base)
    b, sid_b, tok_b = _open(base)
    c = requests.Session()
    tok_c = _token(c.get(f"{base}/", timeout=10).text)
    r = c.post(f"{base}/new", data={"roster": "support", "csrf_token": tok_c},
               headers={"Origin": base}, timeout=10)
    assert r.status_code == 503 and "try again" in r.text
    assert _sessions(base) == 2
    now[0] = 500.0
    assert _say(a, base, sid_a, tok_a, "A is talking").status_code == 200
    now[0] = 700.0  # b idle 700 s > 600; a idle 200 s
    r = c.post(f"{base}/new", data={"roster": "support", "csrf_token": tok_c},
               headers={"Origin": base}, timeout=10)
    assert r.status_code == 200 and _sessions(base) == 2
    assert _say(b, base, sid_b, tok_b, "B is back").status_code == 404
    assert "A is talking" in a.get(f"{base}/", timeout=10).text


# ---- a page added later ----------------------------------------------------------------------

def test_a_page_added_later_is_guarded_by_install():
    """`guard.install` on a new app: its POST route and WebSocket get every check without a line
    of their own. (FastAPI, Request and WebSocket are imported at module level: FastAPI resolves
    the handlers' postponed annotations in the module's globals.)"""
    import uvicorn
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    app = FastAPI()
    guard.install(app)
    done: list[bytes] = []

    @app.get("/")
    async def page(request: Request) -> dict:
        return {"token": guard.form_token(request)}

    @app.post("/act")
    async def act(request: Request) -> dict:
        done.append(await request.body())  # the body read by the guard arrives whole
        return {"ok": True}

    @app.websocket("/ws")
    async def ws(conn: WebSocket) -> None:
        await conn.accept()
        await conn.send_text("hello")
        await conn.close()

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        s = requests.Session()
        token = s.get(f"{base}/", timeout=10).json()["token"]
        assert s.post(f"{base}/act", data={"a": "1"}, headers={"Origin": base},
                      timeout=10).status_code == 403
        assert s.post(f"{base}/act", data={"a": "1", "csrf_token": token},
                      headers={"Origin": EVIL}, timeout=10).status_code == 403
        assert requests.get(f"{base}/", headers={"Host": "evil.example"},
                            timeout=10).status_code == 400
        assert done == []
        r = s.post(f"{base}/act", data={"a": "1", "csrf_token": token}, headers={"Origin": base},
                   timeout=10)
        assert r.status_code == 200 and done == [f"a=1&csrf_token={token}".encode()]
        with connect(f"ws://127.0.0.1:{port}/ws", origin=base) as conn:
            assert conn.recv(timeout=10) == "hello"
        # a foreign Origin; a rebinding name (the socket is ours, the Host the URI's); a second
        # Host header beside the right one
        for uri, options in ((f"ws://127.0.0.1:{port}/ws", {"origin": EVIL}),
                             (f"ws://evil.example:{port}/ws", {"sock": True}),
                             (f"ws://127.0.0.1:{port}/ws",
                              {"additional_headers": {"Host": "evil.example"}})):
            if options.get("sock"):
                options = {"sock": socket.create_connection(("127.0.0.1", port), 10)}
            with pytest.raises(InvalidStatus) as info:
                connect(uri, open_timeout=10, **options)
            assert info.value.response.status_code == 403, uri
    finally:
        server.should_exit = True
        thread.join(timeout=10)
