"""QMSum loader: meeting transcripts (JSON Lines) -> one `Context` per (meeting, topic).

Input: a folder holding `<Domain>/*.jsonl` (or the upstream `<Domain>/jsonl/*.jsonl`), Domain one
of Academic, Committee, Product; or one JSONL file, whose domain is the `domain` argument or the
name of its (grand)parent folder. One meeting per line with `topic_list`, `specific_query_list`
and `meeting_transcripts`; `relevant_text_span` holds inclusive 0-based [start, end] index pairs
written as strings.

meeting_id = f"{domain}:{h}", h the first 12 hex digits of a sha256 over the full transcript: it
does not depend on file names or line order, so it is stable across re-downloads and unique per
meeting. A meeting that repeats an earlier transcript is skipped (listed in `skipped`).

The excerpt agents see is the topic's turns as "Speaker: text" lines with transcription markup
(`{vocalsound}`, `{disfmarker}`, `{gap}`, any `{...}`) removed, whitespace collapsed and spaced
tokenisation tidied (" ," -> ","). It is capped at `max_chars`, cut at a turn boundary (only a
first turn longer than the cap is cut inside the turn); discontiguous spans are joined by "...".
A topic's `queries` are the specific queries whose spans all lie inside the topic's spans; a query
spanning several topics belongs to none of them.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from mascot_dag.lib.data.loading import (
    MIN_KEPT_FRACTION,
    DataFileError,
    LoadResult,
    check_kept,
    clip,
    read_text_strict,
)
from mascot_dag.lib.types import Context

DOMAINS: tuple[str, ...] = ("academic", "committee", "product")
SOURCE = "qmsum"
_MARKUP = re.compile(r"\{[^{}]*\}")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:?!%)])")
_SPLIT_CONTRACTION = re.compile(r"(\w)\s+('(?:s|re|m|ll|ve|d|t)\b|n't\b)", re.IGNORECASE)


def clean_turn(text: str) -> str:
    """Transcript text without markup, with collapsed whitespace and tidied punctuation."""
    text = _MARKUP.sub(" ", text)
    text = " ".join(text.split())
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    text = _SPLIT_CONTRACTION.sub(r"\1\2", text)
    text = re.sub(r"\(\s+", "(", text)
    # Markup removal can leave runs like ", ," or a lone leading comma.
    text = re.sub(r"([,.])(?:\s*,)+", r"\1", text)
    return text.lstrip(",. ").strip()


def _domain_of(file: Path, domain: str | None) -> str:
    if domain is not None:
        d = domain.strip().lower()
        if d not in DOMAINS:
            raise DataFileError(
                f"{file}: unknown QMSum domain {domain!r}; expected one of {DOMAINS}"
            )
        return d
    for parent in (file.parent, file.parent.parent):
        if parent.name.lower() in DOMAINS:
            return parent.name.lower()
    raise DataFileError(
        f"{file}: cannot tell the QMSum domain from the folder name; pass domain= one of {DOMAINS}"
    )


def _files(path: Path, domain: str | None) -> list[tuple[Path, str]]:
    if path.is_file():
        return [(path, _domain_of(path, domain))]
    if not path.exists():
        raise DataFileError(f"{path}: file not found")
    found = []
    for sub in sorted(p for p in path.iterdir() if p.is_dir() and p.name.lower() in DOMAINS):
        d = sub.name.lower()
        if domain is not None and d != domain.strip().lower():
            continue
        for f in sorted([*sub.glob("*.jsonl"), *sub.glob("jsonl/*.jsonl")]):
            found.append((f, d))
    if not found:
        raise DataFileError(
            f"{path}: no <Domain>/*.jsonl files (Domain one of Academic, Committee, Product)"
        )
    return found


def _spans(raw: Any, n_turns: int, what: str) -> list[tuple[int, int]]:
    if not isinstance(raw, list) or not raw:
        raise ValueError(
            f"{what}: relevant_text_span must be a non-empty list of [start, end] pairs"
        )
    spans = []
    for pair in raw:
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"{what}: span {pair!r} is not a [start, end] pair")
        try:
            start, end = int(pair[0]), int(pair[1])
        except (TypeError, ValueError):
            raise ValueError(f"{what}: span {pair!r} does not hold integers") from None
        if not 0 <= start <= end < n_turns:
            raise ValueError(
                f"{what}: span {pair!r} must satisfy 0 <= start <= end < {n_turns} "
                "(the number of turns)"
            )
        spans.append((start, end))
    return spans


def _field(obj: dict, key: str, kind: type, what: str) -> Any:
    if key not in obj:
        raise ValueError(f"{what}: missing key {key!r}")
    if not isinstance(obj[key], kind):
        raise ValueError(f"{what}: {key!r} must be a {kind.__name__}")
    return obj[key]


def _excerpt(
    turns: list[dict], indices: list[int], max_chars: int
) -> tuple[str, list[dict[str, str]]]:
    lines: list[str] = []
    kept: list[dict[str, str]] = []
    size, prev = 0, None
    for i in indices:
        text = clean_turn(turns[i]["content"])
        if not text:
            continue  # a turn that was only markup
        line = f"{turns[i]['speaker'].strip()}: {text}"
        if prev is not None and i != prev + 1:
            line = "...\n" + line
        prev = i
        if size + len(line) + (1 if lines else 0) > max_chars:
            if not lines:  # never return an empty excerpt: cut the first turn itself
                line = clip(line, max_chars)
                lines.append(line)
                kept.append(
                    {"speaker": turns[i]["speaker"].strip(), "text": line.split(": ", 1)[1]}
                )
            break
        size += len(line) + (1 if lines else 0)
        lines.append(line)
        kept.append({"speaker": turns[i]["speaker"].strip(), "text": text})
    return "\n".join(lines), kept


def _meeting_contexts(
    obj: Any, file: Path, line: int, domain: str, max_chars: int
) -> tuple[str, list[Context]]:
    what = "meeting"
    if not isinstance(obj, dict):
        raise ValueError("a line must hold one JSON object (a meeting)")
    turns = _field(obj, "meeting_transcripts", list, what)
    if not turns:
        raise ValueError("meeting_transcripts is empty")
    for i, t in enumerate(turns):
        if not (
            isinstance(t, dict)
            and isinstance(t.get("speaker"), str)
            and isinstance(t.get("content"), str)
        ):
            raise ValueError(
                f"meeting_transcripts[{i}] must be an object with string 'speaker' and 'content'"
            )
    topics = _field(obj, "topic_list", list, what)
    queries = _field(obj, "specific_query_list", list, what)
    digest = hashlib.sha256(
        json.dumps(turns, sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()
    meeting_id = f"{domain}:{digest[:12]}"
    query_sets = []
    for qi, q in enumerate(queries):
        w = f"specific_query_list[{qi}]"
        if not isinstance(q, dict):
            raise ValueError(f"{w} is not an object")
        spans = _spans(_field(q, "relevant_text_span", list, w), len(turns), w)
        idx = {i for s, e in spans for i in range(s, e + 1)}
        query_sets.append(
            ({"query": _field(q, "query", str, w), "answer": _field(q, "answer", str, w)}, idx)
        )
    contexts = []
    for ti, topic in enumerate(topics):
        w = f"topic_list[{ti}] (topic index {ti})"
        if not isinstance(topic, dict):
            raise ValueError(f"{w} is not an object")
        name = _field(topic, "topic", str, w).strip()
        if not name:
            raise ValueError(f"{w}: topic is empty")
        spans = _spans(_field(topic, "relevant_text_span", list, w), len(turns), w)
        indices = sorted({i for s, e in spans for i in range(s, e + 1)})
        text, kept = _excerpt(turns, indices, max_chars)
        inside = set(indices)
        contexts.append(
            Context(
                context_id=f"qmsum:{meeting_id}:{ti}",
                source=SOURCE,
                domain=domain,
                situation=name,
                text=text,
                meeting_id=meeting_id,
                topic=name,
                turns=kept,
                queries=[q for q, idx in query_sets if idx <= inside],
                source_file=str(file),
                source_ref=f"line {line}, topic {ti}",
            )
        )
    return meeting_id, contexts


def load_qmsum(
    path: str | Path,
    domain: str | None = None,
    max_chars: int = 6000,
    skip_bad: bool = False,
    min_kept: float = MIN_KEPT_FRACTION,
) -> LoadResult:
    """Contexts of QMSum JSONL data: one per (meeting, topic).

    DataFileError when a file keeps less than `min_kept` of its lines (loading.check_kept); a
    meeting skipped as a repeat of an earlier one counts as kept (its contexts are loaded)."""
    if max_chars < 100:
        raise ValueError(f"max_chars must be >= 100, got {max_chars}")
    result = LoadResult()
    seen: dict[str, str] = {}
    for file, d in _files(Path(path), domain):
        text = read_text_strict(file)
        count = result.count(file)
        for line_no, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            count.lines += 1
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                msg = f"{file}: line {line_no}: invalid JSON ({exc.msg} at column {exc.colno})"
                if not skip_bad:
                    raise DataFileError(msg) from None
                result.skipped.append(msg)
                count.skip(line_no)
                continue
            try:
                meeting_id, contexts = _meeting_contexts(obj, file, line_no, d, max_chars)
            except ValueError as exc:
                msg = f"{file}: line {line_no}: {exc}"
                if not skip_bad:
                    raise DataFileError(msg) from None
                result.skipped.append(msg)
                count.skip(line_no)
                continue
            if meeting_id in seen:
                result.skipped.append(
                    f"{file}: line {line_no}: same transcript as {seen[meeting_id]}; skipped"
                )
                continue
            seen[meeting_id] = f"{file}: line {line_no}"
            result.contexts.extend(contexts)
    check_kept(result, min_kept)
    return result
