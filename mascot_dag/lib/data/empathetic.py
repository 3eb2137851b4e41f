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
skip_bad=True they are skipped and listed in LoadResult.skipped instead.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from mascot_dag.lib.data.loading import DataFileError, LoadResult, clip, read_text_strict
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


def _read_file(path: Path, convs: dict[str, _Conv], skip_bad: bool, skipped: list[str]) -> None:
    text = read_text_strict(path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except (StopIteration, csv.Error) as exc:
        raise DataFileError(f"{path}: line 1: cannot read the header: {exc}") from exc
    if [h.strip() for h in header] != HEADER:
        raise DataFileError(
            f"{path}: line 1: wrong header {','.join(header)!r}; expected {','.join(HEADER)!r} "
            "(the original EmpatheticDialogues layout)"
        )
    n_rows = 0
    start = reader.line_num + 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise DataFileError(f"{path}: line {reader.line_num}: malformed CSV: {exc}") from exc
        where = start if start == reader.line_num else f"{start}-{reader.line_num}"
        line = reader.line_num
        start = line + 1
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # blank line
        n_rows += 1
        conv_id = row[0].strip()
        known = convs.get(conv_id)
        if known is not None and known.file != path:
            msg = f"{path}: line {where}: conv_id {conv_id} also appears in {known.file}"
            raise DataFileError(msg)
        try:
            idx, emotion, prompt, utterance = _check_row(row, known)
        except ValueError as exc:
            msg = f"{path}: line {where}: {exc}"
            if not skip_bad:
                raise DataFileError(msg) from None
            skipped.append(msg)
            continue
        if known is None:
            known = convs[conv_id] = _Conv(conv_id, emotion, prompt, path, line, line)
        known.utterances[idx] = utterance
        known.last_line = line
    if n_rows == 0:
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


def load_empathetic_dialogues(path: str | Path, skip_bad: bool = False) -> LoadResult:
    """Contexts of an ED CSV file, or of every *.csv in a folder (sorted by name)."""
    convs: dict[str, _Conv] = {}
    result = LoadResult()
    for f in _csv_files(Path(path)):
        _read_file(f, convs, skip_bad, result.skipped)
    for conv in convs.values():
        ctx = _to_context(conv)
        if ctx is None:
            # Only possible when skip_bad dropped every speaker row of the conversation.
            result.skipped.append(
                f"{conv.file}: lines {conv.first_line}-{conv.last_line}: "
                f"conversation {conv.conv_id} has no speaker (odd utterance_idx) turn left"
            )
            continue
        result.contexts.append(ctx)
    return result
