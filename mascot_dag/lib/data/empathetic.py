"""EmpatheticDialogues loader: the original 8-column CSV layout -> one `Context` per conversation.

Layout (one utterance per row, as distributed by ParlAI):
`conv_id,utterance_idx,context,prompt,speaker_idx,utterance,selfeval,tags`.
`context` is the emotion label, `prompt` the situation, `_comma_` stands for a comma, and
`utterance_idx` parity gives the role: odd = speaker (the person who lived the situation, whom
the agents support), even = listener. `speaker_idx`, `selfeval` and `tags` may be empty.
Context.text (what agents see) = situation + "\n" + the first speaker turn, or the situation
alone when that turn repeats it verbatim.

Each utterance and the situation are capped at UTTERANCE_CAP characters (cut, not rejected): ED
turns are short (the validation split's longest is ~630 characters), so only corrupted rows hit
the cap, and they should not blow up prompts.

Bad rows (wrong field count, non-integer utterance_idx, unknown emotion, empty utterance,
conflicting labels inside a conversation) raise DataFileError naming file and line; with
skip_bad=True they are skipped and listed in LoadResult.skipped instead, and counted per line in
LoadResult.lines. A row is one line: a quoted field that runs past its line is a quote fault
(an unbalanced `"`), reported at the line that opened it; skipping it skips that line only and
reads on from the next, so one stray quote cannot swallow the rest of the file. A load that
keeps less than `min_kept` of a file's lines fails (loading.check_kept).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from mascot_dag.lib.data.loading import (
    MIN_KEPT_FRACTION,
    DataFileError,
    LoadResult,
    check_kept,
    clip,
    read_text_strict,
)
from mascot_dag.lib.data.valence import VALENCE, valence_of
from mascot_dag.lib.types import Context

HEADER = [
    "conv_id",
    "utterance_idx",
    "context",
    "prompt",
    "speaker_idx",
    "utterance",
    "selfeval",
    "tags",
]
UTTERANCE_CAP = 2000
SOURCE = "empatheticdialogues"


@dataclass
class _Conv:
    conv_id: str
    emotion: str
    prompt: str
    file: Path
    first_line: int
    last_line: int
    utterances: dict[int, str] = field(default_factory=dict)
    lines: list[int] = field(default_factory=list)  # the line of each kept utterance


def _unescape(text: str) -> str:
    return clip(text.replace("_comma_", ",").strip(), UTTERANCE_CAP)


def _csv_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("*.csv"))
        if not files:
            raise DataFileError(f"{path}: folder holds no *.csv files")
        return files
    if not path.exists():
        raise DataFileError(f"{path}: file not found")
    return [path]


def _check_row(row: list[str], emotion_seen: _Conv | None) -> tuple[int, str, str, str]:
    """(utterance_idx, emotion, prompt, utterance) of a valid row; ValueError says what is wrong."""
    if len(row) != len(HEADER):
        raise ValueError(
            f"expected {len(HEADER)} fields, found {len(row)} (a stray comma in the text?)"
        )
    conv_id, idx_s, emotion, prompt, _spk, utterance = row[:6]
    if not conv_id.strip():
        raise ValueError("conv_id is empty")
    try:
        idx = int(idx_s)
    except ValueError:
        raise ValueError(f"utterance_idx {idx_s!r} is not an integer") from None
    if idx < 1:
        raise ValueError(f"utterance_idx {idx} must be >= 1")
    emotion = emotion.strip().lower()
    if emotion not in VALENCE:
        raise ValueError(
            f"unknown emotion {row[2]!r} in column 'context' (expected one of the 32 ED labels)"
        )
    utterance = _unescape(utterance)
    if not utterance:
        raise ValueError("utterance is empty")
    prompt = _unescape(prompt)
    if not prompt:
        raise ValueError("prompt (situation) is empty")
    if emotion_seen is not None:
        if emotion != emotion_seen.emotion:
            raise ValueError(
                f"emotion {emotion!r} differs from {emotion_seen.emotion!r} earlier in {conv_id}"
            )
        if idx in emotion_seen.utterances:
            raise ValueError(f"utterance_idx {idx} repeats in {conv_id}")
    return idx, emotion, prompt, utterance


class _Lines:
    """The file's physical lines for csv.reader, with a position the loader can move back: after
    a quote fault, reading resumes on the line after the one that opened the quote."""

    def __init__(self, text: str):
        # Split as csv.reader's StringIO(newline="") does, so line numbers agree with it.
        self.lines = io.StringIO(text, newline="").readlines()
        self.pos = 0  # index of the next line to hand out; line number = index + 1

    def __iter__(self):
        return self

    def __next__(self) -> str:
        if self.pos >= len(self.lines):
            raise StopIteration
        self.pos += 1
        return self.lines[self.pos - 1]


def _quote_fault(row: list[str], first: int, last: int, n_lines: int) -> str:
    """What to say about a record that ran over several lines: ED rows are one line each (the
    ParlAI layout writes commas as _comma_ and has no line breaks), so a field holding a line
    break was opened by a quote that does not close on its own line."""
    k = next((i for i, f in enumerate(row) if "\n" in f or "\r" in f), 0)
    name = f" ({HEADER[k]})" if k < len(HEADER) else ""
    end = "the end of the file" if last >= n_lines else f"line {last}"
    return (f"quote fault: field {k + 1}{name} opens a quote (\") on line {first} that is not "
            f"closed on that line; read as one field it would swallow everything up to {end}. "
            "Remove the stray quote or close it on the same line")


def _read_file(path: Path, convs: dict[str, _Conv], skip_bad: bool, result: LoadResult) -> None:
    text = read_text_strict(path)
    src = _Lines(text)
    reader = csv.reader(src)
    count = result.count(path)
    try:
        header = next(reader)
    except (StopIteration, csv.Error) as exc:
        raise DataFileError(f"{path}: line 1: cannot read the header: {exc}") from exc
    if [h.strip() for h in header] != HEADER:
        raise DataFileError(
            f"{path}: line 1: wrong header {','.join(header)!r}; expected {','.join(HEADER)!r} "
            "(the original EmpatheticDialogues layout)"
        )
    while True:
        line = src.pos + 1
        try:
            row = next(reader)
            problem = _quote_fault(row, line, src.pos, len(src.lines)) if src.pos > line else None
        except StopIteration:
            break
        except csv.Error as exc:  # e.g. a NUL byte, or a quoted field past csv's size limit
            hint = " (an unbalanced quote?)" if src.pos > line else ""
            problem = f"malformed CSV: {exc}{hint}"
            row = None
        if row is not None and not problem and (not row or (len(row) == 1 and not row[0].strip())):
            continue  # blank line
        count.lines += 1
        if problem:
            msg = f"{path}: line {line}: {problem}"
            if not skip_bad:
                raise DataFileError(msg)
            # Skip the line that opened the fault only: what followed it is read as rows again.
            result.skipped.append(msg)
            count.skip(line)
            src.pos = line
            reader = csv.reader(src)
            continue
        conv_id = row[0].strip()
        known = convs.get(conv_id)
        if known is not None and known.file != path:
            msg = f"{path}: line {line}: conv_id {conv_id} also appears in {known.file}"
            raise DataFileError(msg)
        try:
            idx, emotion, prompt, utterance = _check_row(row, known)
        except ValueError as exc:
            msg = f"{path}: line {line}: {exc}"
            if not skip_bad:
                raise DataFileError(msg) from None
            result.skipped.append(msg)
            count.skip(line)
            continue
        if known is None:
            known = convs[conv_id] = _Conv(conv_id, emotion, prompt, path, line, line)
        known.utterances[idx] = utterance
        known.lines.append(line)
        known.last_line = line
    if count.lines == 0:
        raise DataFileError(f"{path}: no data rows after the header")


def _to_context(conv: _Conv) -> Context | None:
    order = sorted(conv.utterances)
    turns = [
        {"speaker": "speaker" if i % 2 == 1 else "listener", "text": conv.utterances[i]}
        for i in order
    ]
    opening = next((t["text"] for t in turns if t["speaker"] == "speaker"), None)
    if opening is None:
        return None
    return Context(
        context_id=f"ed:{conv.conv_id}",
        source=SOURCE,
        domain="emotional_support",
        situation=conv.prompt,
        # ~17% of ED openings repeat the situation verbatim; show it once then.
        text=conv.prompt if opening == conv.prompt else f"{conv.prompt}\n{opening}",
        emotion=conv.emotion,
        valence=valence_of(conv.emotion),
        turns=turns,
        source_file=str(conv.file),
        source_ref=f"lines {conv.first_line}-{conv.last_line}",
    )


def load_empathetic_dialogues(
    path: str | Path, skip_bad: bool = False, min_kept: float = MIN_KEPT_FRACTION
) -> LoadResult:
    """Contexts of an ED CSV file, or of every *.csv in a folder (sorted by name).

    DataFileError when a file keeps less than `min_kept` of its data lines (see `check_kept`)."""
    convs: dict[str, _Conv] = {}
    result = LoadResult()
    for f in _csv_files(Path(path)):
        _read_file(f, convs, skip_bad, result)
    for conv in convs.values():
        ctx = _to_context(conv)
        if ctx is None:
            # Only possible when skip_bad dropped every speaker row of the conversation.
            result.skipped.append(
                f"{conv.file}: lines {conv.first_line}-{conv.last_line}: "
                f"conversation {conv.conv_id} has no speaker (odd utterance_idx) turn left"
            )
            for line in conv.lines:
                result.count(conv.file).skip(line)
            continue
        result.contexts.append(ctx)
    check_kept(result, min_kept)
    return result
