"""A user's own contexts (`mascot demo --contexts FILE`, `MASCOT_CONTEXTS_PATH`): one CSV, JSONL
or Parquet file, one context per row.

Columns: `context_id` and `text` (required); `mode` (support | meeting, default support),
`roster` (the persona set that speaks; default: the mode's roster), `domain` (default
`emotional_support` / `meeting`), `split` (train | eval | ood; default: by a hash of the id, as
for every source), `history` (earlier turns: a JSON list of {"speaker", "text"}, or plain text
with one turn per line as `speaker: text`).

Same rules as the EmpatheticDialogues and QMSum loaders (lib.data.loading): errors name the file
and the line (CSV: the file's line; JSONL: its line; Parquet: row N, 1-based), duplicate ids are
rejected, skip_bad skips bad rows only while `min_kept` of the file loads.
A context keeps the dialogue code's two formats: a support context is stored with source
`empatheticdialogues` and a meeting context with source `qmsum` (the formats every stage reads
modes from), its `source_file` naming the user's file and `source_ref` its line.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from mascot_dag.lib.data.loading import (
    MIN_KEPT_FRACTION,
    DataFileError,
    LoadResult,
    check_kept,
    clip,
    read_text_strict,
)
from mascot_dag.lib.types import Context

# A user's context ids: `user:<context_id>` (never clash with the datasets' ids).
USER_CONTEXT_PREFIX = "user:"

REQUIRED = ("context_id", "text")
OPTIONAL = ("mode", "roster", "domain", "split", "history")
MODES = {"support": "empatheticdialogues", "meeting": "qmsum"}
SPLITS = ("train", "eval", "ood")
TEXT_CAP = 4000
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def _rows(path: Path) -> list[tuple[str, dict]]:
    """[(where, row)] of the file: where is 'line N' (CSV, JSONL) or 'row N' (Parquet)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import polars as pl

        if not path.is_file():
            raise DataFileError(f"{path}: file not found")
        try:
            df = pl.read_parquet(path)
        except Exception as exc:  # polars raises several types for a file that is not Parquet
            raise DataFileError(f"{path}: not a readable Parquet file: {exc}") from exc
        if df.is_empty():
            raise DataFileError(f"{path}: file is empty (no rows)")
        return [(f"row {i + 1}", r) for i, r in enumerate(df.to_dicts())]
    text = read_text_strict(path)
    if suffix == ".jsonl":
        out = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                row = {"__error__": f"not valid JSON ({exc.msg})"}
            out.append((f"line {i}", row if isinstance(row, dict)
                        else {"__error__": "not a JSON object"}))
        return out
    if suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise DataFileError(f"{path}: line 1: header lacks column(s) {', '.join(missing)} "
                                f"(required: {', '.join(REQUIRED)}; found: {reader.fieldnames})")
        return [(f"line {reader.line_num}", r) for r in reader]
    raise DataFileError(f"{path}: unknown format {suffix or '(no suffix)'}: use .csv, .jsonl "
                        "or .parquet")


def _history(raw: object) -> list[dict[str, str]]:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return []
    if isinstance(raw, str) and raw.strip().startswith("["):
        raw = json.loads(raw)
    if isinstance(raw, str):
        turns = []
        for line in raw.splitlines():
            if line.strip():
                speaker, sep, said = line.partition(":")
                turns.append({"speaker": speaker.strip() if sep else "speaker",
                              "text": (said if sep else line).strip()})
        return turns
    if not isinstance(raw, list) or not all(
            isinstance(t, dict) and str(t.get("text", "")).strip() for t in raw):
        raise ValueError("a list of {\"speaker\", \"text\"} turns with non-empty text")
    return [{"speaker": str(t.get("speaker") or "speaker"), "text": clip(str(t["text"]), TEXT_CAP)}
            for t in raw]


def _context(path: Path, where: str, row: dict, rosters: set[str] | None) -> Context:
    if "__error__" in row:
        raise ValueError(row["__error__"])

    def field(name: str) -> str:
        v = row.get(name)
        return "" if v is None else str(v).strip()

    for name in REQUIRED:
        if not field(name):
            raise ValueError(f"field '{name}' is missing or empty")
    cid = field("context_id")
    if not ID_RE.match(cid):
        raise ValueError(f"field 'context_id': {cid!r} is not an id (letters, digits, _.:-)")
    mode = field("mode").lower() or "support"
    if mode not in MODES:
        raise ValueError(f"field 'mode': {mode!r} is not support or meeting")
    split = field("split").lower()
    if split and split not in SPLITS:
        raise ValueError(f"field 'split': {split!r} is not one of {', '.join(SPLITS)}")
    roster = field("roster")
    if roster and rosters is not None and roster not in rosters:
        raise ValueError(f"field 'roster': no persona set {roster!r} (sets: "
                         f"{', '.join(sorted(rosters))})")
    try:
        history = _history(row.get("history"))
    except (ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"field 'history': {exc}") from None
    text = clip(" ".join(field("text").split()), TEXT_CAP)
    domain = field("domain") or ("emotional_support" if mode == "support" else "meeting")
    # the support opening is the person's first turn (engine._opening_of): their text itself
    # when no earlier turns are given
    turns = history or ([{"speaker": "speaker", "text": text}] if mode == "support" else [])
    return Context(
        context_id=f"{USER_CONTEXT_PREFIX}{cid}", source=MODES[mode], domain=domain.lower(),
        situation=text[:300], text=text, turns=turns,
        topic=text[:300] if mode == "meeting" else None,
        queries=[{"query": text, "answer": ""}] if mode == "meeting" else [],
        source_file=str(path), source_ref=where, split=split,
    )


def persona_sets() -> set[str] | None:
    """The persona sets a `roster` value may name: those of the persona folder (None when the
    folder cannot be read: `persona_cards` reports that on its own)."""
    from mascot_dag.lib.data.personas import PersonaFileError, load_personas

    try:
        return {c.persona_set for c in load_personas()}
    except PersonaFileError:
        return None


def load_user_contexts(
    path: str | Path, skip_bad: bool = False, min_kept: float = MIN_KEPT_FRACTION,
    rosters: set[str] | None = None,
) -> LoadResult:
    """The file's contexts (ids prefixed `user:`); `rosters`: the persona sets a `roster` value
    may name (None: not checked). A row's own `split` is kept in Context.split (empty: the
    `contexts` asset assigns one). Raises DataFileError naming file and line."""
    path = Path(path)
    rows = _rows(path)
    if not rows:
        raise DataFileError(f"{path}: file is empty (no rows)")
    if path.suffix.lower() != ".csv":
        keys = set().union(*(r.keys() for _, r in rows))
        missing = [c for c in REQUIRED if c not in keys]
        if missing:
            raise DataFileError(f"{path}: no row has field(s) {', '.join(missing)} "
                                f"(required: {', '.join(REQUIRED)})")
    result = LoadResult()
    count = result.count(path)
    seen: dict[str, str] = {}
    for where, row in rows:
        count.lines += 1
        try:
            c = _context(path, where, row, rosters)
            if c.context_id in seen:
                raise ValueError(f"field 'context_id': duplicate id "
                                 f"{c.context_id.removeprefix(USER_CONTEXT_PREFIX)!r} (first at "
                                 f"{seen[c.context_id]})")
        except ValueError as exc:
            msg = f"{path}: {where}: {exc}"
            if not skip_bad:
                raise DataFileError(msg) from None
            result.skipped.append(msg)
            n = int(where.split()[-1])
            count.skip(n)
            continue
        seen[c.context_id] = where
        result.contexts.append(c)
    check_kept(result, min_kept)
    return result
