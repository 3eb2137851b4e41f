"""Shared pieces of the dataset loaders: the result type, the error type, strict file reading.

File-level problems (missing, empty, not UTF-8, wrong header) always raise, even with
skip_bad=True: a file like that is the wrong file, not a file with a few bad records. So does a
file of which skip_bad would keep less than `min_kept` of its data lines (`check_kept`): a load
that drops most of a file is a wrong file too, and the `contexts` asset would otherwise replace
the stored rows of that source with almost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mascot_dag.lib.types import Context

# The share of a file's data lines a skip_bad load must keep; below it the load fails.
MIN_KEPT_FRACTION = 0.9


class DataFileError(ValueError):
    """A data file cannot be used as it is; the message names file, line and what is wrong."""


@dataclass
class LineCount:
    """Data lines of one file (header and blank lines not counted) and the skipped ones among
    them, each bad line counted, so a record that swallowed many lines cannot pass as one."""

    lines: int = 0
    bad: int = 0
    bad_ranges: list[tuple[int, int]] = field(default_factory=list)  # inclusive line ranges

    def skip(self, first: int, last: int | None = None) -> None:
        last = first if last is None else last
        self.bad += last - first + 1
        self.bad_ranges.append((first, last))


@dataclass
class LoadResult:
    contexts: list[Context] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one message per skipped record
    lines: dict[Path, LineCount] = field(default_factory=dict)  # per file read

    def count(self, path: Path) -> LineCount:
        return self.lines.setdefault(path, LineCount())


def _ranges(ranges: list[tuple[int, int]], cap: int = 6) -> str:
    """'line 3', 'lines 3, 5-9', ... (adjacent ranges merged; the first `cap` of them)."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    ranges = merged
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in ranges[:cap]]
    more = f" and {len(ranges) - cap} more ranges" if len(ranges) > cap else ""
    single = len(ranges) == 1 and ranges[0][0] == ranges[0][1]
    return ("line " if single else "lines ") + ", ".join(parts) + more


def check_kept(result: LoadResult, min_kept: float) -> None:
    """Raise DataFileError for the first file whose kept data lines fall below `min_kept` (a
    fraction in [0, 1]; 0 keeps any file that yields something)."""
    if not 0.0 <= min_kept <= 1.0:
        raise ValueError(f"min_kept_fraction must lie in [0, 1], got {min_kept}")
    for path, n in result.lines.items():
        kept = n.lines - n.bad
        if n.lines and (kept == 0 or kept < min_kept * n.lines):
            first = next((m for m in result.skipped if m.startswith(f"{path}:")), "")
            raise DataFileError(
                f"{path}: only {kept} of {n.lines} data lines loaded ({n.bad} skipped: "
                f"{_ranges(n.bad_ranges)}; first: {first.removeprefix(f'{path}: ')}); "
                f"skip_bad_rows keeps a file only when at least {min_kept:.0%} of its lines "
                "load (min_kept_fraction): fix the file, or lower the fraction"
            )


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
