"""The drop folder (`MASCOT_HOME/inbox/`): new context files, validated then accepted or rejected.

Users drop files into the inbox; a sensor calls `process_inbox` (or the pieces below):

- `*.csv`  : EmpatheticDialogues, the original 8-column layout (see loaders/empathetic.py).
- `*.jsonl`: QMSum meetings. The domain comes from the file name prefix (`academic_`, `committee_`,
  `product_`) or from the subfolder it was dropped in (`inbox/Academic/x.jsonl`).

A valid file is moved atomically to `MASCOT_HOME/data/incoming/empatheticdialogues/<name>.csv` or
`MASCOT_HOME/data/incoming/qmsum/<domain>/<name>.jsonl`. The `contexts` asset reads the demo data
(or the files named by its config / $MASCOT_ED_PATH / $MASCOT_QMSUM_PATH) PLUS every accepted file
under `MASCOT_HOME/data/incoming/`, listed by `incoming_sources(home)`.

A malformed file is moved to `MASCOT_HOME/inbox/rejected/<name>` with `<name>.error.txt` beside it
(file, line, what is wrong). So is a file holding a context id that any source of the next load
already holds (the configured paths, the packaged data, files accepted earlier): the error names
both files and the id, since the load would otherwise fail on the duplicate at every run.
A file is validated as a whole before it moves, with the loaders'
strict mode (one bad row rejects the file), so a malformed file is never half-loaded, and the move
into `incoming/` is atomic (rename, or copy to a hidden temp file + rename across file systems),
so the asset never reads a partial file.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from mascot_dag.lib.data import DataFileError, LoadResult, load_empathetic_dialogues, load_qmsum
from mascot_dag.lib.data.empathetic import SOURCE as ED_SOURCE
from mascot_dag.lib.data.qmsum import DOMAINS as QMSUM_DOMAINS
from mascot_dag.lib.data.qmsum import SOURCE as QMSUM_SOURCE
from mascot_dag.lib.data.sources import known_ids as ids_of_sources
from mascot_dag.lib.storage.home import Home

SUFFIX_SOURCE = {".csv": ED_SOURCE, ".jsonl": QMSUM_SOURCE}


def _root(home: Path | str | Home) -> Path:
    return home.root if isinstance(home, Home) else Path(home)


def incoming_dir(home: Path | str | Home) -> Path:
    """`MASCOT_HOME/data/incoming`: accepted files, read by the `contexts` asset."""
    return _root(home) / "data" / "incoming"


def rejected_dir(home: Path | str | Home) -> Path:
    return _root(home) / "inbox" / "rejected"


def source_of(path: Path) -> str:
    """`empatheticdialogues` for *.csv, `qmsum` for *.jsonl."""
    try:
        return SUFFIX_SOURCE[path.suffix.lower()]
    except KeyError:
        raise DataFileError(
            f"{path}: unknown file type {path.suffix!r}; drop *.csv (EmpatheticDialogues) "
            "or *.jsonl (QMSum)"
        ) from None


def qmsum_domain(path: Path) -> str:
    """The QMSum domain of a dropped JSONL: file name prefix, else the folder it lies in."""
    name = path.name.lower()
    for d in QMSUM_DOMAINS:
        if name.startswith(f"{d}_"):
            return d
    if path.parent.name.lower() in QMSUM_DOMAINS:
        return path.parent.name.lower()
    raise DataFileError(
        f"{path}: cannot tell the QMSum domain; name the file academic_*.jsonl, committee_*.jsonl "
        "or product_*.jsonl, or drop it into an Academic/, Committee/ or Product/ subfolder"
    )


def _candidates(folder: Path, patterns: tuple[str, ...]) -> list[Path]:
    found = []
    for pattern in patterns:
        for p in folder.glob(pattern):
            # Hidden names are temp files of editors and of our own atomic copies.
            if p.is_file() and not p.name.startswith((".", "~")):
                found.append(p)
    return found


def scan_inbox(inbox: Path, min_age_s: float = 0.0) -> list[Path]:
    """New files in the inbox, sorted: *.csv and *.jsonl at the top level, *.jsonl in domain
    subfolders. `rejected/` is never scanned. Files modified less than `min_age_s` ago are left
    for the next scan (they may still be being copied in)."""
    inbox = Path(inbox)
    if not inbox.is_dir():
        return []
    files = _candidates(inbox, ("*.csv", "*.jsonl"))
    for sub in inbox.iterdir():
        if sub.is_dir() and sub.name.lower() in QMSUM_DOMAINS:
            files += _candidates(sub, ("*.jsonl",))
    now = time.time()
    return sorted(p for p in files if now - p.stat().st_mtime >= min_age_s)


def known_ids(home: Path | str | Home) -> dict[str, str]:
    """context_id -> file, over every source the next `contexts` load reads: the configured
    ED / QMSum paths ($MASCOT_ED_PATH, $MASCOT_QMSUM_PATH, else the packaged data) and the files
    accepted earlier. Run config paths given to one run only are not known here."""
    return ids_of_sources(incoming_sources(home))


def validate_file(
    path: Path, home: Path | str | Home | None = None, known: dict[str, str] | None = None
) -> LoadResult:
    """Load the whole file strictly; DataFileError (file, line, what is wrong) when it is unusable.

    With `known` (or `home`, to compute it: `known_ids`), a file holding a context id that
    another source of the next load already holds (same ED conv_id, same QMSum transcript) is
    refused too: the `contexts` load would fail on the duplicate, every run after it as well.
    """
    path = Path(path)
    source = source_of(path)
    if source == ED_SOURCE:
        result = load_empathetic_dialogues(path, skip_bad=False)
    else:
        result = load_qmsum(path, domain=qmsum_domain(path), skip_bad=False)
    if not result.contexts:
        raise DataFileError(f"{path}: no usable contexts ({'; '.join(result.skipped) or 'empty'})")
    if known is None:
        known = known_ids(home) if home is not None else {}
    clash = [c.context_id for c in result.contexts if c.context_id in known]
    if clash:
        what = "transcript" if source == QMSUM_SOURCE else "conversation id (conv_id)"
        raise DataFileError(
            f"{path}: context id {clash[0]} is already read from {known[clash[0]]} by the "
            f"contexts load ({len(clash)} of this file's {len(result.contexts)} contexts clash); "
            f"the load would fail on the duplicates: change the {what} or drop only new ones"
        )
    return result


def _free_name(folder: Path, name: str) -> Path:
    """`folder/name`, or `folder/<stem>-2<suffix>`, ... when that is taken."""
    target = folder / name
    stem, suffix = Path(name).stem, Path(name).suffix
    n = 2
    while target.exists() or (folder / f"{target.name}.error.txt").exists():
        target = folder / f"{stem}-{n}{suffix}"
        n += 1
    return target


def _move_atomic(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        # Another file system: copy beside the target under a hidden name, then rename.
        tmp = dst.parent / f".{dst.name}.{os.getpid()}.tmp"
        shutil.copyfile(src, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst)
        src.unlink()
    return dst


def accept(path: Path, home: Path | str | Home) -> Path:
    """Move a validated file into `MASCOT_HOME/data/incoming/<source>/...`; returns where it is."""
    path = Path(path)
    source = source_of(path)
    folder = incoming_dir(home) / source
    if source == QMSUM_SOURCE:
        folder = folder / qmsum_domain(path)
    return _move_atomic(path, _free_name(folder, path.name))


def reject(path: Path, home: Path | str | Home, error: str | BaseException) -> Path:
    """Move a malformed file to `MASCOT_HOME/inbox/rejected/` with `<name>.error.txt` beside it."""
    path = Path(path)
    folder = rejected_dir(home)
    folder.mkdir(parents=True, exist_ok=True)
    target = _free_name(folder, path.name)
    note = folder / f"{target.name}.error.txt"
    tmp = folder / f".{note.name}.tmp"
    tmp.write_text(
        f"file: {path}\nrejected: {time.strftime('%Y-%m-%d %H:%M:%S')}\nerror: {error}\n",
        encoding="utf-8",
    )
    os.replace(tmp, note)
    return _move_atomic(path, target)


def incoming_sources(home: Path | str | Home) -> tuple[list[Path], list[Path]]:
    """(accepted EmpatheticDialogues CSVs, accepted QMSum JSONLs), sorted.

    QMSum files lie in `qmsum/<domain>/`, so `load_qmsum(f)` finds the domain from the folder.
    """
    base = incoming_dir(home)
    ed = sorted(p for p in (base / ED_SOURCE).glob("*.csv") if not p.name.startswith("."))
    qm = sorted(
        p
        for d in QMSUM_DOMAINS
        for p in (base / QMSUM_SOURCE / d).glob("*.jsonl")
        if not p.name.startswith(".")
    )
    return ed, qm


@dataclass
class InboxOutcome:
    file: Path  # where it was dropped
    moved_to: Path
    accepted: bool
    contexts: int = 0
    error: str | None = None


def process_inbox(home: Path | str | Home, min_age_s: float = 0.0) -> list[InboxOutcome]:
    """Validate every new inbox file and accept or reject it (what the sensor runs)."""
    outcomes = []
    files = scan_inbox(_root(home) / "inbox", min_age_s=min_age_s)
    known = known_ids(home) if files else {}  # read the sources once per scan, not per file
    for f in files:
        try:
            result = validate_file(f, known=known)
        except DataFileError as exc:
            outcomes.append(InboxOutcome(f, reject(f, home, exc), False, error=str(exc)))
            continue
        moved = accept(f, home)
        known.update({c.context_id: str(moved) for c in result.contexts})
        outcomes.append(InboxOutcome(f, moved, True, contexts=len(result.contexts)))
    return outcomes
