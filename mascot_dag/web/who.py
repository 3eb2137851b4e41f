"""The rating page's second task (`mascot rate`, /who): which companion of the roster said it?

A rater sees ONE utterance at a time, drawn from the persona probe (`persona_probe`: base and
adapter texts mixed, in the rater's own shuffled order, lib/evaluation/human_roles.py), with no
persona, arm, context or model shown; the page's id for it is an opaque hash. The rater picks the
companion of the roster who said it (each with its name, role and short description, the same
descriptions the judge reader gets) or "can't tell". A POST is validated as a whole (unknown
utterance 404; unknown companion, missing answer, bad rater or stray field 422; a body over
MAX_BODY_BYTES 413; not a form 415), stored in one DuckDB transaction that replaces the rater's
earlier answer for that text, and answered with the next utterance. The answers are a reader of
the probe panel once there are enough (lib/stage1/panel.py, PEOPLE_MIN_TEXTS).

`install` adds the routes to the rating app, which guards every request (`web.guard`: Host,
same-origin POSTs, the form token every form here carries) and shares its DuckDB lock.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from mascot_dag.lib.evaluation import human_roles as R
from mascot_dag.lib.evaluation.human import RatingError, check_rater
from mascot_dag.lib.storage import db
from mascot_dag.web import guard
from mascot_dag.web.forms import FormError, read_page_form

MAX_BODY_BYTES = 4 * 1024  # a whole answer is ~200 bytes
MAX_FIELDS = 10
STYLE = (".utterance{background:#eef3fb;padding:.7em 1em;border-radius:6px;white-space:pre-wrap;"
         "font-size:1.1em}.choices label{display:block;margin:.45em 0}"
         ".choices .desc{color:#444;font-size:.92em}")


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


class RoleAnswers:
    """Reads the probe's texts, the roster and a rater's answers; writes answers (under the
    rating page's lock: one DuckDB access of the process at a time)."""

    def __init__(self, path: str | Path, lock: threading.RLock) -> None:
        self.path, self.lock = Path(path), lock

    def blocks(self) -> list[list[R.Utterance]]:
        with self.lock, db.connect(self.path) as con:
            texts = con.execute("SELECT persona_id, context_id, seed, arm, format, text FROM "
                                "persona_probe WHERE arm IN (?, ?)", list(R.SHOWN_ARMS)).pl()
            sets = dict(con.execute("SELECT persona_id, persona_set FROM personas").fetchall())
        return R.pool(texts, sets)

    def roster(self) -> dict[str, list[tuple[str, str, str, str]]]:
        """persona set -> [(persona id, name, role, description)]."""
        with self.lock, db.connect(self.path) as con:
            rows = con.execute("SELECT persona_set, persona_id, name, role, description FROM "
                               "personas ORDER BY persona_id").fetchall()
        out: dict[str, list[tuple[str, str, str, str]]] = {}
        for s, *rest in rows:
            out.setdefault(s, []).append(tuple(rest))  # type: ignore[arg-type]
        return out

    def answered(self, rater: str) -> dict[str, str | None]:
        """utterance id -> the rater's answer (None: can't tell)."""
        with self.lock, db.connect(self.path) as con:
            return dict(con.execute("SELECT utterance_id, answer FROM human_role_answers "
                                    "WHERE rater = ?", [rater]).fetchall())

    def save(self, rater: str, utt: R.Utterance, answer: str | None) -> bool:
        """Store one answer; whether it replaced an earlier one."""
        with self.lock:
            with db.connect(self.path) as con:
                before = con.execute(
                    "SELECT count(*) FROM human_role_answers WHERE rater = ? AND persona_id = ? "
                    "AND context_id = ? AND seed = ? AND arm = ? AND format = ?",
                    [rater, utt.persona_id, utt.context_id, utt.seed, utt.arm, utt.format]
                ).fetchone()[0]
            db.replace_many(self.path, R.replace_changes(rater, utt,
                                                         R.answer_rows(rater, utt, answer)))
        return bool(before)

    def progress(self, rater: str) -> tuple[list[R.Utterance], dict[str, str | None]]:
        """The rater's sequence and answers (only those to texts the probe still holds)."""
        seq = R.sequence(rater, self.blocks())
        ids = {u.utterance_id for u in seq}
        return seq, {k: v for k, v in self.answered(rater).items() if k in ids}


def link(rater: str, store: RoleAnswers) -> str:
    """The index page's paragraph pointing to /who ("" while the probe has no texts)."""
    seq, done = store.progress(rater)
    if not seq:
        return ""
    return (f"<p><a id='who' href='/who?rater={quote(rater)}'>Which companion said it?</a> "
            f"Single replies: name the companion of the roster who wrote each "
            f"({len(done)} of {len(seq)} answered).</p>")


def utterance_page(rater: str, utt: R.Utterance, roster: list[tuple[str, str, str, str]],
                   n_done: int, n_all: int, previous: str | None = None, answered: bool = False,
                   errors: list[str] | None = None, note: str = "", token: str = "") -> str:
    """One utterance and the roster as radio buttons (the rater's own order), prefilled with the
    rater's earlier answer (`answered`: there is one; `previous` None then means can't tell)."""
    by_id = {p[0]: p for p in roster}
    options = []
    for pid in R.roster_order(rater, list(by_id)):
        _, name, role, desc = by_id[pid]
        checked = " checked" if answered and previous == pid else ""
        options.append(f"<label><input type='radio' name='answer' value='{_e(pid)}' "
                       f"id='answer.{_e(pid)}' required{checked}> <b>{_e(name)}</b> "
                       f"({_e(role)}) <span class='desc'>{_e(desc)}</span></label>")
    checked = " checked" if answered and previous is None else ""
    options.append(f"<label><input type='radio' name='answer' value='{R.CANT_TELL}' "
                   f"id='answer.cant_tell' required{checked}> <b>Can't tell</b></label>")
    err = ("<div class='errors' id='errors'><b>Not saved:</b><ul>"
           + "".join(f"<li>{_e(p)}</li>" for p in errors) + "</ul></div>") if errors else ""
    again = ("<p class='ok'>You answered this one before; submitting replaces that answer.</p>"
             if answered and not errors else "")
    return f"""<p><a href='/?rater={quote(rater)}'>all tasks</a> · rater {_e(rater)} ·
{n_done} of {n_all} answered</p>{note}
<h1>Which companion said it?</h1>{err}{again}
<p>One reply of a companion to a person who needs support. Which companion of the group wrote
it? Go by how it sounds; pick "can't tell" rather than guess.</p>
<div class='utterance' id='utterance'>{_e(utt.text)}</div>
<form method='post' action='/who' id='who-form'>
<input type='hidden' name='{guard.TOKEN_FIELD}' value='{_e(token)}'>
<input type='hidden' name='rater' value='{_e(rater)}'>
<input type='hidden' name='u' value='{_e(utt.utterance_id)}'>
<div class='choices'>{''.join(options)}</div>
<button type='submit' id='submit'>Submit</button></form>"""


def install(app: FastAPI, store: RoleAnswers, page: Callable[[str, str], str],
            problem: Callable[..., HTMLResponse]) -> None:
    """Add GET and POST /who to the rating app; `page(title, body)` and `problem(status,
    problems, title)` are the app's own page renderers."""

    def render(title: str, body: str) -> str:
        return page(title, f"<style>{STYLE}</style>{body}")

    async def show(request: Request, rater: str, utt: R.Utterance | None, status: int = 200,
                   errors: list[str] | None = None, note: str = "") -> HTMLResponse:
        seq, done = await run_in_threadpool(store.progress, rater)
        if utt is None:
            utt = next((u for u in seq if u.utterance_id not in done), None)
        if utt is None:
            body = ("<p id='all-done'>You answered every utterance. Thank you!</p>" if seq else
                    "<h1>Nothing to identify</h1><p>The persona probe has no texts yet: "
                    "materialise persona_adapters (<code>make demo</code>).</p>")
            return HTMLResponse(render("Which companion said it?",
                                       f"{note}{body}<p><a href='/?rater={quote(rater)}'>all "
                                       "tasks</a></p>"), status_code=status)
        rosters = await run_in_threadpool(store.roster)
        answered = utt.utterance_id in done
        return HTMLResponse(render("Which companion said it?", utterance_page(
            rater, utt, rosters.get(utt.persona_set, []), len(done), len(seq),
            done.get(utt.utterance_id), answered, errors, note, guard.form_token(request))),
            status_code=status)

    async def known() -> dict[str, R.Utterance]:
        blocks = await run_in_threadpool(store.blocks)
        return {u.utterance_id: u for b in blocks for u in b}

    @app.get("/who", response_class=HTMLResponse)
    async def who(request: Request, rater: str = "", u: str = "") -> HTMLResponse:
        try:
            rater = check_rater(rater)
        except RatingError as e:
            return problem(422, e.problems, "Bad request")
        utt = None
        if u:
            utt = (await known()).get(u)
            if utt is None:
                return problem(404, [f"u: unknown utterance {u[:60]!r} (the probe may have been "
                                     "re-run): see /who?rater=..."], "Unknown utterance")
        return await show(request, rater, utt)

    @app.post("/who", response_class=HTMLResponse)
    async def answer(request: Request) -> HTMLResponse:
        try:
            form = await read_page_form(request, MAX_BODY_BYTES, MAX_FIELDS, guard.TOKEN_FIELD)
        except FormError as e:
            return problem(e.status, [str(e)])
        utterances = await known()
        rosters = await run_in_threadpool(store.roster)
        ids = {s: [p[0] for p in ps] for s, ps in rosters.items()}
        try:
            rater, utt, said = R.parse_answer(form, utterances, ids)
        except RatingError as e:
            utt = utterances.get(form.get("u", [""])[0].strip())
            try:
                rater = check_rater(form.get("rater", [""])[0])
            except RatingError:
                utt = None  # no page to show the form again on: the problems alone
            if e.status == 404 or utt is None:
                return problem(e.status, e.problems, "Not saved")
            return await show(request, rater, utt, e.status, e.problems)
        replaced = await run_in_threadpool(store.save, rater, utt, said)
        what = "replaced your earlier answer" if replaced else "saved"
        note = (f"<p class='ok' id='confirmation'>Thank you, {_e(rater)}: your answer {what}. "
                f"<a id='change' href='/who?rater={quote(rater)}&amp;u={quote(utt.utterance_id)}'>"
                "Change it</a></p>")
        return await show(request, rater, None, note=note)
