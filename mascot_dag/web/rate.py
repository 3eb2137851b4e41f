"""The blind rating page (`mascot rate`): people rate three-way items in a browser.

FastAPI + uvicorn on 127.0.0.1, server-rendered HTML, no JavaScript. The rater gives a name or
token once (it travels as `?rater=` and as a hidden field); the item page shows the context and
three dialogues labelled A, B, C in the rater's own shuffled order (lib/evaluation/human.py), then
one row
per criterion with its definition beside a 1-5 radio scale for each dialogue, and "which is
best". A POST is validated as a whole (every problem named, status 422; unknown item 404; a body
over MAX_BODY_BYTES 413) and stored in one DuckDB transaction that replaces the rater's earlier
answer for the item. This process touches DuckDB one request at a time (a lock): concurrent
submissions then wait instead of meeting as conflicting transactions, and a rating page needs no
parallel reads. Connections are opened per request, so a Dagster run can use the file in between.

The page's second task, /who (web/who.py), asks for single probe utterances which companion of
the roster said it; those answers make people a reader of the persona probe's panel.

Forms are parsed by hand (urlencoded only): no python-multipart dependency, and the body is cut
off at MAX_BODY_BYTES before anything is parsed (same approach as web/chat.py). Every request
passes `web.guard` first (Host names, same-origin POSTs, the form token the rating form carries).
"""

from __future__ import annotations

import html
import threading
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

import polars as pl
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse

from mascot_dag.lib.evaluation import human as H
from mascot_dag.lib.storage import db
from mascot_dag.web import guard, who
from mascot_dag.web.forms import FormError, read_page_form

MAX_BODY_BYTES = 32 * 1024  # a full form is ~1.5 KB plus a comment of <= 2000 characters
MAX_FIELDS = 100
STYLE = """
body{font-family:system-ui,sans-serif;max-width:1250px;margin:1em auto;padding:0 1em;color:#222}
.dialogues{display:grid;grid-template-columns:repeat(3,1fr);gap:1em}
.dialogue{border:1px solid #bbb;border-radius:6px;padding:.5em .8em;background:#fafafa}
.turn{margin:.4em 0}.who{font-weight:600}.user .who{color:#555}
table.rubric{border-collapse:collapse;margin-top:1em;width:100%}
table.rubric td,table.rubric th{border-top:1px solid #ddd;padding:.35em;vertical-align:top}
.def{color:#444;font-size:.92em;max-width:28em}.scale label{margin-right:.3em;white-space:nowrap}
.errors{background:#fee;border:1px solid #c33;padding:.5em 1em}
.ok{background:#efe;border:1px solid #3a3;padding:.5em 1em}
.context{background:#eef3fb;padding:.5em .8em;border-radius:6px;white-space:pre-wrap}
"""


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


class Ratings:
    """Reads items and answers from the DuckDB file, writes submissions (one at a time)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        # every DuckDB access of this process goes through it (reads are cheap; see module doc)
        self.lock = threading.RLock()

    def items(self) -> list[H.Item]:
        with self.lock, db.connect(self.path) as con:
            dialogues = con.execute("SELECT dialogue_id, stage, method, context_id FROM dialogues "
                                    "WHERE stage = 'eval'").pl()
            comparisons = con.execute("SELECT * FROM comparisons").pl()
        return H.build_items(dialogues, comparisons)

    def item(self, item_id: str) -> H.Item | None:
        return next((i for i in self.items() if i.item_id == item_id), None)

    def content(self, item: H.Item) -> tuple[str, dict[str, list[dict]], dict[str, str]]:
        """Context text, turns per dialogue id, persona id -> 'Name (role)'."""
        with self.lock, db.connect(self.path) as con:
            ctx = con.execute("SELECT text FROM contexts WHERE context_id = ?",
                              [item.context_id]).fetchone()
            turns = con.execute("SELECT dialogue_id, turn_idx, role, speaker, text FROM turns "
                                "WHERE dialogue_id IN (?, ?, ?) ORDER BY dialogue_id, turn_idx",
                                list(item.dialogue_ids)).pl()
            personas = con.execute("SELECT persona_id, name, role FROM personas").fetchall()
        by_id = {d: g.to_dicts()
                 for (d,), g in turns.group_by("dialogue_id", maintain_order=True)}
        return (ctx[0] if ctx else "(context text not found)"), by_id, {
            p: f"{n} ({r})" for p, n, r in personas}

    def answers(self, rater: str) -> dict[str, tuple[pl.DataFrame, str]]:
        """item_id -> (that rater's rating rows, best dialogue id)."""
        with self.lock, db.connect(self.path) as con:
            r = con.execute("SELECT * FROM human_ratings WHERE rater = ?", [rater]).pl()
            c = con.execute("SELECT item_id, best_dialogue_id FROM human_choices WHERE rater = ?",
                            [rater]).fetchall()
        return {iid: (r.filter(pl.col("item_id") == iid), best) for iid, best in c}

    def save(self, item: H.Item, sub: dict) -> tuple[int, bool]:
        """Store one submission; returns (rating rows written, whether it replaced an answer)."""
        ratings, choice = H.submission_rows(item, sub)
        with self.lock:
            with db.connect(self.path) as con:
                before = con.execute("SELECT count(*) FROM human_choices WHERE item_id = ? AND "
                                     "rater = ?", [item.item_id, sub["rater"]]).fetchone()[0]
            db.replace_many(self.path, H.replace_changes(item, sub["rater"], ratings, choice))
        return len(ratings), bool(before)


# ---- pages -----------------------------------------------------------------------------------

def login_page(error: str = "") -> str:
    err = f"<p class='errors'>{_e(error)}</p>" if error else ""
    return _page("MASCOT blind rating", f"""<h1>Blind rating of companion dialogues</h1>{err}
<p>You will see one situation and three group dialogues at a time, in random order, without
knowing which system wrote which. Rate each on every criterion (1 = absent or harmful,
2 = weak, 3 = adequate, 4 = good, 5 = excellent) and pick the best.</p>
<form method="get" action="/"><label>Your name or rater token:
<input name="rater" id="rater" maxlength="64" required></label>
<button type="submit" id="start">Start</button></form>""")


def index_page(rater: str, items: list[H.Item], done: set[str], who: str = "") -> str:
    """`who`: the paragraph linking the /who task (web/who.py), "" when it has nothing."""
    if not items:
        return _page("MASCOT blind rating", "<h1>Nothing to rate</h1><p>No three-way items: the "
                     "eval dialogues (MASCOT and at least two other methods on one context) are "
                     f"not in the database yet; run <code>make demo</code>.</p>{who}")
    rows = "".join(
        f"<li><a href='/item?rater={quote(rater)}&amp;item={quote(i.item_id)}'>item {n}</a> "
        f"{'(rated, open to change)' if i.item_id in done else ''}</li>"
        for n, i in enumerate(items, 1))
    nxt = next((i for i in items if i.item_id not in done), None)
    go = (f"<p><a id='next' href='/item?rater={quote(rater)}&amp;item={quote(nxt.item_id)}'>"
          "Rate the next unrated item</a></p>" if nxt else "<p id='all-done'>You rated every item. "
          "Thank you!</p>")
    return _page("MASCOT blind rating", f"<h1>Hello, {_e(rater)}</h1>{who}<p>{len(done)} of "
                 f"{len(items)} items rated.</p>{go}<ol>{rows}</ol>")


def _dialogue(slot: str, turns: list[dict], names: dict[str, str]) -> str:
    parts = []
    for t in turns:
        who = "User" if t["role"] == "user" else names.get(t["speaker"], t["speaker"])
        parts.append(f"<div class='turn {_e(t['role'])}'><span class='who'>{_e(who)}:</span> "
                     f"{_e(t['text'])}</div>")
    return (f"<div class='dialogue' id='dialogue-{slot}'><h3>Dialogue {slot}</h3>"
            f"{''.join(parts) or '<em>(no turns)</em>'}</div>")


def item_page(rater: str, item: H.Item, content, previous=None, errors: list[str] | None = None,
              form: dict[str, list[str]] | None = None, token: str = "") -> str:
    """The rating form, prefilled from `form` (a rejected submission) or `previous` (stored);
    `token`: the guard's form token, without which the guard refuses the POST."""
    ctx, turns, names = content
    order = H.shown_order(rater, item)
    filled: dict[str, str] = {}
    if form:
        filled = {k: v[0] for k, v in form.items() if v}
    elif previous is not None:
        rows, best = previous
        slot_of = {item.dialogue_ids[i]: s for s, i in zip(H.SLOTS, order, strict=True)}
        for did, crit, score in rows.select("dialogue_id", "criterion", "score").iter_rows():
            filled[H.field_name(slot_of.get(did, "?"), crit)] = str(score)
        filled["best"] = slot_of.get(best, "")
    dialogues = "".join(_dialogue(s, turns.get(item.dialogue_ids[i], []), names)
                        for s, i in zip(H.SLOTS, order, strict=True))
    rows, level = [], None
    for lv, c, definition in H.CRITERIA:
        if lv != level:
            level = lv
            what = ("agent-level: the companions' replies, judged reply by reply" if lv == "agent"
                    else "collective: the group conversation as a whole")
            rows.append(f"<tr><th colspan='4'>{_e(what.capitalize())}</th></tr>")
        cells = []
        for s in H.SLOTS:
            name = H.field_name(s, c)
            radios = "".join(
                f"<label><input type='radio' name='{name}' value='{v}' id='{name}.{v}' required"
                f"{' checked' if filled.get(name) == str(v) else ''}>{v}</label>"
                for v in H.SCALE)
            cells.append(f"<td class='scale'><b>{s}</b> {radios}</td>")
        rows.append(f"<tr><td><b>{_e(H.TITLES.get(c, c))}</b><div class='def'>{_e(definition)}"
                    f"</div></td>{''.join(cells)}</tr>")
    best = "".join(f"<label><input type='radio' name='best' value='{s}' id='best.{s}' required"
                   f"{' checked' if filled.get('best') == s else ''}>Dialogue {s}</label> "
                   for s in H.SLOTS)
    err = ("<div class='errors' id='errors'><b>Not saved:</b><ul>"
           + "".join(f"<li>{_e(p)}</li>" for p in errors) + "</ul></div>") if errors else ""
    note = "<p class='ok'>You rated this item before; submitting replaces that answer.</p>" \
        if previous is not None and not form else ""
    heads = "".join(f"<th>Dialogue {s}</th>" for s in H.SLOTS)
    body = f"""<p><a href='/?rater={quote(rater)}'>all items</a> · rater {_e(rater)}</p>
<h1>Rate three dialogues</h1>{err}{note}
<h2>Situation</h2><div class='context'>{_e(ctx)}</div>
<h2>Dialogues</h2><div class='dialogues'>{dialogues}</div>
<form method='post' action='/item' id='rating'>
<input type='hidden' name='{guard.TOKEN_FIELD}' value='{_e(token)}'>
<input type='hidden' name='rater' value='{_e(rater)}'>
<input type='hidden' name='item' value='{_e(item.item_id)}'>
<p>1 = absent or harmful, 2 = weak, 3 = adequate, 4 = good, 5 = excellent.</p>
<table class='rubric'><tr><th>criterion</th>{heads}</tr>
{''.join(rows)}</table>
<h2>Which dialogue is best overall?</h2><p>{best}</p>
<p><label>Comment (optional, up to {H.MAX_COMMENT} characters)<br>
<textarea name='comment' rows='3' cols='80' maxlength='{H.MAX_COMMENT}'>
{_e(filled.get('comment', ''))}</textarea></label></p>
<button type='submit' id='submit'>Submit ratings</button></form>"""
    return _page("Rate: three dialogues", body)


def saved_page(rater: str, n: int, replaced: bool, items: list[H.Item], done: set[str]) -> str:
    nxt = next((i for i in items if i.item_id not in done), None)
    link = (f"<a id='next' href='/item?rater={quote(rater)}&amp;item={quote(nxt.item_id)}'>Next "
            "item</a>" if nxt else "<span id='all-done'>You rated every item. Thank you!</span>")
    what = "replaced your earlier answer" if replaced else "saved"
    return _page("Saved", f"<p class='ok' id='confirmation'>Thank you, {_e(rater)}: {n} ratings "
                 f"and your best pick {what} ({len(done)} of {len(items)} items rated).</p>"
                 f"<p>{link} · <a href='/?rater={quote(rater)}'>all items</a></p>")


# ---- app -------------------------------------------------------------------------------------

def create_app(path: str | Path, allowed_hosts: Iterable[str] = ()) -> FastAPI:
    """The page's app; `allowed_hosts`: Host names beyond loopback (`web.guard`)."""
    store = Ratings(path)
    roles = who.RoleAnswers(path, store.lock)  # "which companion said it?" (web/who.py)
    app = FastAPI(title="MASCOT blind rating", docs_url=None, redoc_url=None, openapi_url=None)
    guard.install(app, allowed_hosts)

    def problem(status: int, problems: list[str], title: str = "Not saved") -> HTMLResponse:
        body = "<ul>" + "".join(f"<li>{_e(p)}</li>" for p in problems) + "</ul>"
        return HTMLResponse(_page(title, f"<div class='errors' id='errors'><b>{_e(title)}:</b>"
                                  f"{body}</div>"), status_code=status)

    @app.get("/", response_class=HTMLResponse)
    async def index(rater: str | None = None) -> HTMLResponse:
        if rater is None:
            return HTMLResponse(login_page())
        try:
            rater = H.check_rater(rater)
        except H.RatingError as e:
            return HTMLResponse(login_page(e.problems[0]), status_code=422)
        items = await run_in_threadpool(store.items)
        done = set(await run_in_threadpool(store.answers, rater))
        return HTMLResponse(index_page(rater, items, done,
                                       await run_in_threadpool(who.link, rater, roles)))

    @app.get("/item", response_class=HTMLResponse)
    async def show(request: Request, rater: str = "", item: str = "") -> HTMLResponse:
        try:
            rater = H.check_rater(rater)
        except H.RatingError as e:
            return problem(422, e.problems, "Bad request")
        it = await run_in_threadpool(store.item, item)
        if it is None:
            return problem(404, [f"unknown item {item[:120]!r}: see the list at /?rater=..."],
                           "Unknown item")
        content = await run_in_threadpool(store.content, it)
        previous = (await run_in_threadpool(store.answers, rater)).get(it.item_id)
        return HTMLResponse(item_page(rater, it, content, previous,
                                      token=guard.form_token(request)))

    @app.post("/item", response_class=HTMLResponse)
    async def submit(request: Request) -> HTMLResponse:
        try:
            form = await read_page_form(request, MAX_BODY_BYTES, MAX_FIELDS, guard.TOKEN_FIELD)
        except FormError as e:
            extra = (f"; the comment takes at most {H.MAX_COMMENT} characters"
                     if e.status == 413 else "")
            return problem(e.status, [f"{e}{extra}"])
        item_id = form.get("item", [""])[0]
        it = await run_in_threadpool(store.item, item_id)
        if it is None:
            return problem(404, [f"item: unknown item {item_id[:120]!r}; nothing was stored"],
                           "Unknown item")
        try:
            sub = H.parse_submission(it, form)
        except H.RatingError as e:
            rater = form.get("rater", [""])[0]
            if not H.RATER_RE.match(rater.strip()):
                return problem(e.status, e.problems)
            content = await run_in_threadpool(store.content, it)
            return HTMLResponse(item_page(rater.strip(), it, content, errors=e.problems,
                                          form=form, token=guard.form_token(request)),
                                status_code=e.status)
        n, replaced = await run_in_threadpool(store.save, it, sub)
        items = await run_in_threadpool(store.items)
        done = set(await run_in_threadpool(store.answers, sub["rater"]))
        return HTMLResponse(saved_page(sub["rater"], n, replaced, items, done))

    who.install(app, roles, _page, problem)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"ok": True, "db": str(store.path)})

    return app


def serve(path: str | Path, port: int, host: str = "127.0.0.1",
          allowed_hosts: Iterable[str] = ()) -> None:
    import uvicorn

    uvicorn.run(create_app(path, allowed_hosts), host=host, port=port, log_level="warning")


def export(path: str | Path, out: str | Path) -> int:
    """Write every rating (long form, with best pick and comment) to .csv or .parquet."""
    out = Path(out)
    if out.suffix not in (".csv", ".parquet"):
        raise ValueError(f"--export {out}: use a .csv or .parquet file name")
    # an export only reads: read-only, so it runs beside other readers and never runs DDL
    with db.connect(path, read_only=True) as con:
        ratings = con.execute("SELECT * FROM human_ratings").pl()
        choices = con.execute("SELECT * FROM human_choices").pl()
    table = H.export_table(ratings, choices)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".csv":
        table.write_csv(out)
    else:
        table.write_parquet(out)
    return len(table)
