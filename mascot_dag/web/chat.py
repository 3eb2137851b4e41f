"""The chat page (`mascot chat --web`): talk to the companion group in a browser.

FastAPI + uvicorn on 127.0.0.1; plain HTML forms (POST, then a 303 redirect back to the page), a
few lines of vanilla JS only to disable the button while the group answers. Each agent turn shows
the persona, the director's directive (action, tone, and whether the director's JSON was used or
the fallback), and the model version that spoke.

State: the conversation id travels in a hidden form field (and a cookie, so that reloading the
page finds it again); the server keeps conversations in `lib.chat.SessionStore` (bounded, LRU).
Generation runs in a worker thread (never on the event loop) behind ONE lock around the model:
the backend generates one batch at a time anyway, and a conversation must not interleave turns.
Forms are parsed by hand (urlencoded only), which avoids FastAPI's python-multipart dependency
and lets the body be cut off at `MAX_BODY_BYTES` before anything is parsed.
"""

from __future__ import annotations

import html
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

# At module level: FastAPI resolves the handlers' (postponed) annotations in this module's globals.
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from mascot_dag.lib.data.personas import PersonaCard
from mascot_dag.lib.dialogue.chat import (
    MAX_MESSAGE_CHARS,
    MAX_USER_MESSAGES,
    ROSTER_MODES,
    ChatInputError,
    ChatSession,
    Conversation,
    SessionStore,
    UnknownSession,
    check_message,
    version_label,
)
from mascot_dag.lib.dialogue.spec import ChatFn, DialogueConfig
from mascot_dag.web.forms import FormError, read_form

COOKIE = "mascot_chat"
# urlencoded UTF-8 takes up to 9 bytes per character; anything longer is not a form we sent.
MAX_BODY_BYTES = 16 * MAX_MESSAGE_CHARS
log = logging.getLogger(__name__)


@dataclass
class ChatGroup:
    """What every conversation shares: the rosters, the model and which versions speak."""

    rosters: dict[str, list[PersonaCard]]  # roster set -> cards
    generate: ChatFn
    config: DialogueConfig
    labels: dict[str, str] = field(default_factory=dict)  # persona_id -> version_label
    director_label: str = "base director"

    def session(self, roster_set: str, seed: int) -> ChatSession:
        return ChatSession(
            self.rosters[roster_set],
            self.generate,
            self.config,
            seed,
            ROSTER_MODES[roster_set],
            self.labels,
        )


def load_group(
    alias: str = "champion",
    max_new_tokens: int | None = None,
    agents_per_round: int | None = None,
    director_max_new_tokens: int | None = None,
    engine: str | None = None,
    profile: str | None = None,
) -> ChatGroup:
    """Both rosters with the `alias` versions from MLflow (base + persona prompts where a persona
    has none), as the profile's evaluation runs them (`mascot_dag.companions`); None options keep
    the profile's settings, `engine` runs the profile's model on another local engine."""
    from mascot_dag.companions import load_companions
    from mascot_dag.lib.data.personas import load_personas, personas_of_set
    from mascot_dag.registry import DIRECTOR_MODEL, persona_model

    cards = load_personas()
    rosters = {s: personas_of_set(cards, s) for s in ROSTER_MODES}
    ids = [c.persona_id for cs in rosters.values() for c in cs]
    group = load_companions(ids, alias, engine, profile, max_new_tokens_agent=max_new_tokens,
                            agents_per_round=agents_per_round,
                            max_new_tokens_director=director_max_new_tokens)
    labels = {p: version_label(persona_model(p), group.versions.get(p), alias) for p in ids}
    director_label = (version_label(DIRECTOR_MODEL, group.director_version, alias)
                      if group.director_version else "base director")
    group.chat.backend()  # load the model now, not on the first message
    return ChatGroup(rosters, group.chat.generate, group.config, labels, director_label)


class _Page(Exception):
    """An error page: status and the message shown (with the transcript when there is one)."""

    def __init__(
        self,
        status: int,
        message: str,
        conv: Conversation | None = None,
        sid: str | None = None,
        draft: str = "",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.conv, self.sid, self.draft = (
            status,
            message,
            conv,
            sid,
            draft,
        )


def create_app(group: ChatGroup, max_sessions: int = 64, default_roster: str = "support") -> Any:
    if default_roster not in ROSTER_MODES:
        raise ValueError(f"default_roster must be one of {list(ROSTER_MODES)}: {default_roster!r}")
    store = SessionStore(group.session, max_sessions)
    model_lock = threading.Lock()
    app = FastAPI(title="MASCOT chat", docs_url=None, redoc_url=None)

    def page(
        conv: Conversation | None,
        sid: str | None,
        status: int = 200,
        error: str = "",
        draft: str = "",
    ) -> HTMLResponse:
        resp = HTMLResponse(render(group, conv, sid, error, draft), status_code=status)
        if sid and conv is not None:
            resp.set_cookie(COOKIE, sid, httponly=True, samesite="lax")
        return resp

    async def form(request: Request) -> dict[str, str]:
        try:
            fields = await read_form(request, MAX_BODY_BYTES)
        except FormError as exc:
            message = str(exc)
            if exc.status == 413:
                message += f"; messages are limited to {MAX_MESSAGE_CHARS} characters"
            raise _Page(exc.status, message) from exc
        return {k: v[0] for k, v in fields.items()}

    @app.exception_handler(_Page)
    async def _error_page(request: Request, exc: _Page) -> HTMLResponse:
        return page(exc.conv, exc.sid, exc.status, exc.message, exc.draft)

    @app.get("/", response_class=HTMLResponse)
    async def index(request: Request, roster: str | None = None) -> HTMLResponse:
        sid = request.cookies.get(COOKIE)
        try:
            conv = store.get(sid)
        except UnknownSession:
            conv = None
        if conv is None or (roster and roster != conv.roster_set):
            try:
                sid, conv = store.create(roster or default_roster)
            except ChatInputError as exc:
                raise _Page(exc.status, str(exc)) from exc
        return page(conv, sid)

    @app.post("/new")
    async def new(request: Request) -> RedirectResponse:
        roster = (await form(request)).get("roster") or default_roster
        try:
            sid, _ = store.create(roster)
        except ChatInputError as exc:
            raise _Page(exc.status, str(exc)) from exc
        resp = RedirectResponse("/", status_code=303)
        resp.set_cookie(COOKIE, sid, httponly=True, samesite="lax")
        return resp

    @app.post("/say")
    async def say(request: Request) -> RedirectResponse:
        data = await form(request)
        sid = data.get("session_id", "")
        try:
            conv = store.get(sid)
        except UnknownSession as exc:
            raise _Page(404, str(exc)) from exc
        raw = data.get("message", "")
        try:
            text = check_message(raw)
        except ChatInputError as exc:
            raise _Page(exc.status, str(exc), conv, sid, raw[: 2 * MAX_MESSAGE_CHARS]) from exc
        if conv.session.user_messages >= MAX_USER_MESSAGES:
            raise _Page(
                409,
                f"this conversation has reached {MAX_USER_MESSAGES} messages; "
                "start a new conversation",
                conv,
                sid,
            )

        def run() -> None:
            with model_lock:
                conv.session.say(text)

        try:
            await run_in_threadpool(run)
        except Exception as exc:  # the page reports it; the server keeps serving
            log.exception("chat generation failed")
            raise _Page(
                500, f"the group could not answer: {type(exc).__name__}: {exc}", conv, sid, raw
            ) from exc
        resp = RedirectResponse("/#end", status_code=303)
        resp.set_cookie(COOKIE, sid, httponly=True, samesite="lax")
        return resp

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse(
            {
                "ok": True,
                "sessions": len(store),
                "labels": group.labels,
                "director": group.director_label,
            }
        )

    return app


def render(
    group: ChatGroup, conv: Conversation | None, sid: str | None, error: str = "", draft: str = ""
) -> str:
    e = html.escape
    rows = []
    for t in conv.session.log if conv else []:
        if t.role == "user":
            rows.append(f'<div class="turn user"><b>You</b><p>{e(t.text)}</p></div>')
            continue
        status = "" if t.director_status == "ok" else f" ({e(t.director_status or '')})"
        rows.append(
            f'<div class="turn agent" data-speaker="{e(t.speaker)}">'
            f'<b class="persona">{e(t.name)}</b> '
            f'<span class="directive">action: <i class="action">{e(t.action or "")}</i>; '
            f'tone: <i class="tone">{e(t.tone or "")}</i>{status}</span>'
            f'<p class="text">{e(t.text) or "<i>(no words)</i>"}</p>'
            f'<small>model: <span class="model">{e(t.model or "")}</span></small></div>'
        )
    roster_set = conv.roster_set if conv else "support"
    names = ", ".join(c.name for c in group.rosters.get(roster_set, []))
    options = "".join(
        f'<option value="{s}"{" selected" if s == roster_set else ""}>{s}</option>'
        for s in ROSTER_MODES
    )
    err = f'<p class="error" role="alert">{e(error)}</p>' if error else ""
    chat_form = (
        ""
        if conv is None
        else f"""
<form id="say" method="post" action="/say">
 <input type="hidden" name="session_id" value="{e(sid or "")}">
 <textarea name="message" rows="3" maxlength="{MAX_MESSAGE_CHARS}" placeholder="Say something"
  >{e(draft)}</textarea><br>
 <button id="send" type="submit">Send</button>
 <span id="wait" hidden>The group is answering...</span>
 <small>(up to {MAX_MESSAGE_CHARS} characters)</small>
</form>"""
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>MASCOT chat</title><style>
body {{ font-family: sans-serif; max-width: 46em; margin: 1em auto; }}
.turn {{ border-left: 4px solid #999; padding: .2em .8em; margin: .6em 0; }}
.agent {{ border-color: #4a7; }} .directive, small {{ color: #555; }}
.error {{ color: #b00; font-weight: bold; }} textarea {{ width: 100%; }}
</style></head><body>
<h1>MASCOT companions</h1>
<p>Roster <b>{e(roster_set)}</b>: {e(names)}. Director: {e(group.director_label)}.</p>
<form method="post" action="/new">New conversation with the
 <select name="roster">{options}</select> roster <button type="submit">Start</button></form>
{err}<div id="log">{"".join(rows)}</div><a id="end"></a>{chat_form}
<script>
const f = document.getElementById("say");
if (f) f.addEventListener("submit", () => {{
  document.getElementById("send").disabled = true;
  document.getElementById("wait").hidden = false;
}});
</script></body></html>"""


def serve(port: int, group: ChatGroup, default_roster: str = "support") -> None:
    """Serve the chat page on 127.0.0.1:port until interrupted (loopback only: no auth)."""
    import uvicorn

    uvicorn.run(
        create_app(group, default_roster=default_roster),
        host="127.0.0.1",
        port=port,
        log_level="warning",
    )
