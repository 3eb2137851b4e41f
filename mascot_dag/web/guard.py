"""The guard in front of every loopback page (`mascot chat --web`, `mascot rate`, and any page added
later): `install(app)` wraps the whole ASGI app, so no route can be left out by forgetting a call.

Loopback is not a trust boundary: any web site the user visits can make the browser post to
127.0.0.1, and a site whose name re-resolves to 127.0.0.1 (DNS rebinding) can even read the
answers. Three checks, each refused with one message:

- Host, on every request (400): only the names the page was started for, i.e. 127.0.0.1,
  localhost and [::1] with the port the request came in on, plus the names given with
  `--allow-host` or MASCOT_ALLOWED_HOSTS (comma-separated; `name` on any port, `name:port` on that
  port only), so a cluster's hostname, a proxy or a tunnel still works. A rebinding site's name
  is none of them.
- Origin, on state-changing requests (403): Origin, or Referer where no Origin is sent, must be
  the page's own origin. Browsers send one of them on every cross-site POST (`null` included,
  which is refused); a client sending neither is not a browser and must still show the token.
- Form token, on state-changing requests (403): `csrf_token` (a form field, or the X-CSRF-Token
  header) must equal HMAC(secret of this process, the browser's `mascot_csrf` cookie). The cookie
  (HttpOnly, SameSite=Lax) is set on the first answer; pages render the token into their forms
  with `form_token(request)`. Another site can neither read a page to learn the token nor compute
  it: a local server on another port receives the cookie (cookies ignore ports), not the secret.
  A restarted page has a new secret, so a form opened before the restart asks for a reload.

A WebSocket handshake (none of today's pages opens one) gets the Host and Origin checks.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import os
import re
import secrets
import sys
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import HTMLResponse

ENV = "MASCOT_ALLOWED_HOSTS"
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
COOKIE = "mascot_csrf"
TOKEN_FIELD = "csrf_token"
TOKEN_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The guard buffers a state-changing body to find the token; each page cuts its own forms off
# far below this (chat 16 KB, rating 32 KB), so this only bounds what one request can hold.
MAX_BODY_BYTES = 1 << 20
_NAME = re.compile(r"^(\[[0-9a-f:.]+\]|[a-z0-9]([a-z0-9._-]*[a-z0-9])?)(:(\d{1,5}))?$")
_COOKIE_VALUE = re.compile(r"^[A-Za-z0-9_-]{32}$")


def split_host(value: str) -> tuple[str, int | None]:
    """A Host header or `--allow-host` entry as (lower-case name, port or None); ValueError when
    it is not a host name, an IPv4 address or a bracketed IPv6 address, with an optional port."""
    m = _NAME.match(value.strip().lower())
    if not m:
        raise ValueError(f"{value[:80]!r} is not a host name with an optional :port")
    return m.group(1), int(m.group(4)) if m.group(4) else None


class Hosts:
    """The Host names a page answers: the loopback names on its own port, plus configured ones."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        entries = [*extra, *os.environ.get(ENV, "").split(",")]
        try:
            self.extra = [split_host(e) for e in entries if e.strip()]
        except ValueError as exc:
            raise ValueError(f"allowed host (--allow-host or {ENV}): {exc}") from exc

    def allows(self, header: str, port: int | None) -> bool:
        """`port`: the local port the request came in on (None where the server does not say)."""
        try:
            name, given = split_host(header)
        except ValueError:
            return False
        if name in LOOPBACK and (port is None or (given or 80) == port):
            return True
        # an entry with a port also matches a Host without one on the scheme's default port
        return any(name == n and (p is None or p == given or (given is None and p in (80, 443)))
                   for n, p in self.extra)

    def describe(self, port: int | None) -> str:
        names = [f"{n}:{port}" if port else n for n in LOOPBACK]
        names += [f"{n}:{p}" if p else n for n, p in self.extra]
        return ", ".join(names)


def checked_hosts(names: Iterable[str] | None) -> list[str]:
    """`names` when they and MASCOT_ALLOWED_HOSTS parse; else the reason on stderr and exit 2
    (the commands call it before anything slow starts, such as loading a model)."""
    try:
        Hosts(names or ())
    except ValueError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from exc
    return list(names or ())


def form_token(request: Request) -> str:
    """The token this request's browser session must send back with a form ("" without a guard:
    a page rendered outside `install`, as tests do)."""
    return request.scope.get("state", {}).get(TOKEN_FIELD, "")


def install(app: Any, allowed_hosts: Iterable[str] = ()) -> None:
    """Put the guard around `app`; ValueError names a malformed allowed host."""
    app.add_middleware(PageGuard, hosts=Hosts(allowed_hosts))


def _refusal(status: int, message: str) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html><head><meta charset='utf-8'><title>Refused</title></head><body>"
        f"<p class='error' role='alert'>{html.escape(message)}</p></body></html>", status)


def cross_origin(headers: Headers, host: str) -> str | None:
    """Why a state-changing request comes from another origin, or None when it does not."""
    if "origin" in headers:
        what, source = "Origin", headers["origin"]
    elif "referer" in headers:
        what, source = "Referer", headers["referer"]
    else:
        return None  # not a browser: the token decides
    parts = urlsplit(source)
    if parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower():
        return None
    return (f"cross-origin request refused: {what} {source[:100]!r} is not this page "
            f"(http://{host}); submit the form from the page itself")


class PageGuard:
    """ASGI middleware: the three checks of the module doc, then the page (with the body that was
    read to find the token handed on unchanged)."""

    def __init__(self, app: Any, hosts: Hosts) -> None:
        self.app, self.hosts = app, hosts
        self.secret = secrets.token_bytes(32)

    def token(self, cookie: str) -> str:
        return hmac.new(self.secret, cookie.encode(), hashlib.sha256).hexdigest()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        hosts = headers.getlist("host")
        host = hosts[0] if len(hosts) == 1 else ""  # two Host headers: which one is meant?
        port = (scope.get("server") or (None, None))[1]
        if scope["type"] == "websocket":
            # browsers send Origin on every WebSocket handshake and let any site open one;
            # a close before accepting is answered 403
            if not self.hosts.allows(host, port) or cross_origin(headers, host):
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        if not self.hosts.allows(host, port):
            await _refusal(400, f"Host {host[:80]!r} is not served here: this page answers "
                           f"{self.hosts.describe(port)}; to open it under another name, start "
                           f"it with --allow-host NAME or list the name in {ENV}"
                           )(scope, receive, send)
            return
        cookie = _cookie(headers)
        fresh = cookie is None
        cookie = cookie or secrets.token_urlsafe(24)
        expected = self.token(cookie)
        scope.setdefault("state", {})[TOKEN_FIELD] = expected
        if scope["method"] not in SAFE_METHODS:
            problem = cross_origin(headers, host)
            if problem:
                await _refusal(403, problem)(scope, receive, send)
                return
            body = await _read_body(receive)
            if body is None:  # the client left
                return
            if len(body) > MAX_BODY_BYTES:
                await _refusal(413, f"request body over {MAX_BODY_BYTES} bytes"
                               )(scope, receive, send)
                return
            sent = headers.get(TOKEN_HEADER) or _form_field(headers, body)
            if fresh or not hmac.compare_digest(sent.encode(), expected.encode()):
                await _refusal(403, "form token missing or wrong (the page was opened before "
                               "the server restarted, or cookies are off): reload the page and "
                               "submit again")(scope, receive, send)
                return
            receive = _replay(body, receive)
        if fresh:
            send = _with_cookie(send, cookie)
        await self.app(scope, receive, send)


def _cookie(headers: Headers) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and _COOKIE_VALUE.match(value):
            return value
    return None


def _form_field(headers: Headers, body: bytes) -> str:
    if "application/x-www-form-urlencoded" not in headers.get("content-type", ""):
        return ""
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return fields.get(TOKEN_FIELD, [""])[0]


async def _read_body(receive: Any) -> bytes | None:
    """The whole body, or its first MAX_BODY_BYTES + 1 bytes; None when the client disconnects."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY_BYTES or not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """A `receive` that hands the page the body already read, then waits as the original does."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _with_cookie(send: Any, cookie: str) -> Any:
    async def sender(message: dict) -> None:
        if message["type"] == "http.response.start":
            MutableHeaders(scope=message).append(
                "set-cookie", f"{COOKIE}={cookie}; HttpOnly; Path=/; SameSite=Lax")
        await send(message)

    return sender
