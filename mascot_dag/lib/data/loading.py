"""Shared pieces of the dataset loaders: the result type, the error type, strict file reading.

File-level problems (missing, empty, not UTF-8, wrong header) always raise, even with
skip_bad=True: a file like that is the wrong file, not a file with a few bad records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mascot_dag.lib.types import Context


class DataFileError(ValueError):
    """A data file cannot be used as it is; the message names file, line and what is wrong."""


@dataclass
class LoadResult:
    contexts: list[Context] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one message per skipped record


def read_text_strict(path: Path) -> str:
    """The whole file as UTF-8 text; a decode error names the line and byte offset."""
    if not path.is_file():
        raise DataFileError(f"{path}: file not found")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataFileError(
            f"{path}: line {line}: not valid UTF-8 (byte offset {exc.start}: {exc.reason}); "
            "re-save the file as UTF-8"
        ) from exc
    if text.startswith("\ufeff"):  # a BOM from spreadsheet exports is harmless
        text = text[1:]
    if not text.strip():
        raise DataFileError(f"{path}: file is empty")
    return text


def clip(text: str, cap: int) -> str:
    """At most `cap` characters; cut at the last space inside the cap when there is one."""
    if len(text) <= cap:
        return text
    cut = text.rfind(" ", 0, cap)
    return text[: cut if cut > cap // 2 else cap].rstrip()
