"""The chat page (`mascot chat --web`): talk to the companion group in a browser.

FastAPI + uvicorn on 127.0.0.1; plain HTML forms (POST, then a 303 redirect back to the page), a
few lines of vanilla JS only to disable the button while the group answers. Each agent turn shows
the persona, the director's directive (action and tone only when the director's JSON was valid;
else its status), the model version that spoke, and the reply guards' work (resamples, what was
cleaned: `lib.dialogue.guards`). A note says what the embedded 135M model can and cannot do.
The page serves every persona set of the persona folder (the packaged support and workplace
sets, or a user's `MASCOT_PERSONAS_DIR`), each in its mode (`lib.data.personas.set_mode`).

Every request passes `web.guard` first (Host names, same-origin POSTs, the form token). A GET
never opens a conversation: the first message (POST /say without a session id) or the "Start"
form (POST /new) does, so only the page's own forms can. State: the conversation id travels in a
hidden form field (and a cookie, so that reloading the page finds it again); the server keeps
conversations in `IdleSessions`, which makes room only by dropping conversations idle past
IDLE_S: no client can push the open ones out by opening new ones.
Generation runs in a worker thread (never on the event loop) behind ONE lock around the model:
the backend generates one batch at a time anyway, and a conversation must not interleave turns.
Forms are parsed by hand (urlencoded only), which avoids FastAPI's python-multipart dependency
and lets the body be cut off at `MAX_BODY_BYTES` before anything is parsed.
"""

from __future__ import annotations

import html
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# At module level: FastAPI resolves the handlers' (postponed) annotations in this module's globals.
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from mascot_dag.lib.data.personas import PersonaCard, mode_sets, set_mode
from mascot_dag.lib.dialogue.chat import (
    IDLE_S,
    MAX_MESSAGE_CHARS,
    MAX_USER_MESSAGES,
    MODEL_NOTE,
    ChatInputError,
    ChatSession,
    Conversation,
    IdleSessions,
    UnknownSession,
    check_message,
    check_roster,
    version_label,
)
from mascot_dag.lib.dialogue.spec import ChatFn, DialogueConfig
from mascot_dag.web import guard
from mascot_dag.web.forms import FormError, read_form

COOKIE = "mascot_chat"
# urlencoded UTF-8 takes up to 9 bytes per character; anything longer is not a form we sent.
MAX_BODY_BYTES = 16 * MAX_MESSAGE_CHARS
log = logging.getLogger(__name__)


@dataclass
class ChatGroup:
    """What every conversation shares: the rosters, the model and which versions speak.
    `modes`: roster set -> support | meeting; a set left out speaks in the mode `set_mode` gives
    it among the rosters' cards (the workplace set in meetings, every other set in support)."""

    rosters: dict[str, list[PersonaCard]]  # roster set -> cards, in the folder's order
    generate: ChatFn
    config: DialogueConfig
    labels: dict[str, str] = field(default_factory=dict)  # persona_id -> version_label
    director_label: str = "base director"
    modes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cards = [c for cs in self.rosters.values() for c in cs]
        self.modes = {s: self.modes.get(s) or set_mode(cards, s) for s in self.rosters}

    @property
    def default_roster(self) -> str:
        """The set in the support role (`mode_sets`): `support`, or a user's trained set."""
        return mode_sets([c for cs in self.rosters.values() for c in cs])["support"]

    def session(self, roster_set: str, seed: int) -> ChatSession:
        """A new conversation with `roster_set`; a ChatInputError naming the sets when the group
        has no such roster."""
        check_roster(roster_set, self.rosters)
        return ChatSession(
            self.rosters[roster_set],
            self.generate,
            self.config,
            seed,
            self.modes[roster_set],  # support | meeting (set_mode)
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
    """Every persona set of the persona folder (`persona_dir()`: the packaged support and
    workplace sets, or MASCOT_PERSONAS_DIR's), each in its mode (`set_mode`), with the `alias`
    versions from MLflow (base + persona prompts where a persona has none), as the profile's
    evaluation runs them (`mascot_dag.companions`); None options keep the profile's settings,
    `engine` runs the profile's model on another local engine."""
    from mascot_dag.companions import load_companions
    from mascot_dag.lib.data.personas import load_personas, personas_of_set
    from mascot_dag.registry import DIRECTOR_MODEL, persona_model

    cards = load_personas()
    sets = dict.fromkeys(c.persona_set for c in cards)  # file order
    rosters = {s: personas_of_set(cards, s) for s in sets}
    modes = {s: set_mode(cards, s) for s in sets}
    ids = [c.persona_id for cs in rosters.values() for c in cs]
    group = load_companions(ids, alias, engine, profile, max_new_tokens_agent=max_new_tokens,
                            agents_per_round=agents_per_round,
                            max_new_tokens_director=director_max_new_tokens)
    labels = {p: version_label(persona_model(p), group.versions.get(p), alias) for p in ids}
    director_label = (version_label(DIRECTOR_MODEL, group.director_version, alias)
                      if group.director_version else "base director")
    group.chat.backend()  # load the model now, not on the first message
    return ChatGroup(rosters, group.chat.generate, group.config, labels, director_label, modes)


class _Page(Exception):
    """An error page: status and the message shown (with the transcript when there is one)."""

    def __init__(
        self,
        status: int,
        message: str,
        conv: Conversation | None = None,
        sid: str | None = None,
        draft: str = "",
        roster: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.conv, self.sid = status, message, conv, sid
        self.draft, self.roster = draft, roster


def create_app(
    group: ChatGroup,
    max_sessions: int = 64,
    default_roster: str | None = None,
    allowed_hosts: Iterable[str] = (),
    idle_s: float = IDLE_S,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """The page's app; `default_roster`: the set a new conversation speaks with (None: the
    group's support-role set); `allowed_hosts`: Host names beyond loopback (`web.guard`)."""
    default_roster = default_roster or group.default_roster
    check_roster(default_roster, group.rosters)
    store = IdleSessions(group.session, max_sessions, idle_s, clock)
    model_lock = threading.Lock()
    app = FastAPI(title="MASCOT chat", docs_url=None, redoc_url=None)
    guard.install(app, allowed_hosts)

    def page(
        request: Request,
        conv: Conversation | None,
        sid: str | None,
        status: int = 200,
        error: str = "",
        draft: str = "",
        roster: str | None = None,
    ) -> HTMLResponse:
        token = guard.form_token(request)
        body = render(group, conv, sid, error, draft, token, roster or default_roster)
        resp = HTMLResponse(body, status_code=status)
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

    def create(roster: str, draft: str = "") -> tuple[str, Conversation]:
        try:
            return store.create(roster)
        except ChatInputError as exc:
            raise _Page(exc.status, str(exc), draft=draft) from exc

    @app.exception_handler(_Page)
    async def _error_page(request: Request, exc: _Page) -> HTMLResponse:
        return page(request, exc.conv, exc.sid, exc.status, exc.message, exc.draft, exc.roster)

    @app.get("/", response_class=HTMLResponse)
    async def index(request: Request, roster: str | None = None) -> HTMLResponse:
        # Only shows: a GET opens no conversation (a page load from anywhere could, and fill the
        # store); the first message or the "Start" form opens one.
        if roster:
            try:
                check_roster(roster, group.rosters)
            except ChatInputError as exc:
                raise _Page(exc.status, str(exc)) from exc
        sid = request.cookies.get(COOKIE)
        try:
            conv = store.get(sid)
        except UnknownSession:
            conv = None
        if conv is None or (roster and roster != conv.roster_set):
            return page(request, None, None, roster=roster)
        return page(request, conv, sid)

    @app.post("/new")
    async def new(request: Request) -> RedirectResponse:
        sid, _ = create((await form(request)).get("roster") or default_roster)
        resp = RedirectResponse("/", status_code=303)
        resp.set_cookie(COOKIE, sid, httponly=True, samesite="lax")
        return resp

    @app.post("/say")
    async def say(request: Request) -> RedirectResponse:
        data = await form(request)
        sid, raw = data.get("session_id", ""), data.get("message", "")
        roster = data.get("roster") or default_roster
        conv = None
        if sid:
            try:
                conv = store.get(sid)
            except UnknownSession as exc:
                raise _Page(404, str(exc)) from exc
        try:
            text = check_message(raw)
        except ChatInputError as exc:
            draft = raw[: 2 * MAX_MESSAGE_CHARS]
            raise _Page(exc.status, str(exc), conv, sid, draft, roster) from exc
        if conv is None:  # the page's first message opens the conversation
            sid, conv = create(roster, raw)
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
    group: ChatGroup,
    conv: Conversation | None,
    sid: str | None,
    error: str = "",
    draft: str = "",
    token: str = "",
    roster: str | None = None,
) -> str:
    """The page; without a conversation its message box opens one in `roster` (None: the
    group's default roster). `token` is the guard's form token: every form carries it, or the
    guard refuses the POST. The roster choice lists every set of the group."""
    e = html.escape
    rows = []
    for t in conv.session.log if conv else []:
        if t.role == "user":
            rows.append(f'<div class="turn user"><b>You</b><p>{e(t.text)}</p></div>')
            continue
        status = "" if t.director_status == "ok" else f" ({e(t.director_status or '')})"
        if t.directive_valid:
            directive = (f'<span class="directive">action: <i class="action">{e(t.action or "")}'
                         f'</i>; tone: <i class="tone">{e(t.tone or "")}</i>{status}</span>')
        else:  # the director's JSON was invalid (fallback) or its action was cut off
            directive = (f'<span class="directive invalid">director: '
                         f'<i class="status">{e(t.director_status or "")}</i>, no valid '
                         "directive to show</span>")
        details = f"; resampled {t.resamples}x" if t.resamples else ""
        details += f"; cleaned: {e(', '.join(t.guards))}" if t.guards else ""
        rows.append(
            f'<div class="turn agent" data-speaker="{e(t.speaker)}" '
            f'data-resamples="{t.resamples}"><b class="persona">{e(t.name)}</b> {directive}'
            f'<p class="text">{e(t.text) or "<i>(no words)</i>"}</p>'
            f'<small>model: <span class="model">{e(t.model or "")}</span>'
            f'<span class="details">{details}</span></small></div>'
        )
    roster_set = conv.roster_set if conv else (roster or group.default_roster)
    names = ", ".join(c.name for c in group.rosters.get(roster_set, []))
    options = "".join(
        f'<option value="{e(s)}"{" selected" if s == roster_set else ""}>{e(s)}</option>'
        for s in group.rosters
    )
    err = f'<p class="error" role="alert">{e(error)}</p>' if error else ""
    token_field = f'<input type="hidden" name="{guard.TOKEN_FIELD}" value="{e(token)}">'
    chat_form = f"""
<form id="say" method="post" action="/say">{token_field}
 <input type="hidden" name="session_id" value="{e(sid or "") if conv else ""}">
 <input type="hidden" name="roster" value="{e(roster_set)}">
 <textarea name="message" rows="3" maxlength="{MAX_MESSAGE_CHARS}" placeholder="Say something"
  >{e(draft)}</textarea><br>
 <button id="send" type="submit">Send</button>
 <span id="wait" hidden>The group is answering...</span>
 <small>(up to {MAX_MESSAGE_CHARS} characters)</small>
</form>"""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>MASCOT chat</title><style>
body {{ font-family: sans-serif; max-width: 46em; margin: 1em auto; }}
.turn {{ border-left: 4px solid #999; padding: .2em .8em; margin: .6em 0; }}
.agent {{ border-color: #4a7; }} .directive, small {{ color: #555; }}
.error {{ color: #b00; font-weight: bold; }} textarea {{ width: 100%; }}
</style></head><body>
<h1>MASCOT companions</h1>
<p>Roster <b>{e(roster_set)}</b>: {e(names)}. Director: {e(group.director_label)}.</p>
<p class="note"><small>{e(MODEL_NOTE)}</small></p>
<form method="post" action="/new">{token_field}New conversation with the
 <select name="roster">{options}</select> roster <button type="submit">Start</button></form>
{err}<div id="log">{"".join(rows)}</div><a id="end"></a>{chat_form}
<script>
const f = document.getElementById("say");
if (f) f.addEventListener("submit", () => {{
  document.getElementById("send").disabled = true;
  document.getElementById("wait").hidden = false;
}});
</script></body></html>"""


def serve(
    port: int,
    group: ChatGroup,
    default_roster: str | None = None,
    allowed_hosts: Iterable[str] = (),
) -> None:
    """Serve the chat page on 127.0.0.1:port until interrupted (no accounts: `web.guard` keeps
    other sites and other Host names out); `default_roster` None: the support-role set."""
    import uvicorn

    uvicorn.run(
        create_app(group, default_roster=default_roster, allowed_hosts=allowed_hosts),
        host="127.0.0.1",
        port=port,
        log_level="warning",
    )
