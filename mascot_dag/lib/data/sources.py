"""The sources one `contexts` load reads, and the ids they already hold.

A load reads the configured EmpatheticDialogues and QMSum paths (run config, else $MASCOT_ED_PATH
/ $MASCOT_QMSUM_PATH, else the packaged demo data) plus every file the inbox accepted into
`MASCOT_HOME/data/incoming/`. A context id may come from one of them only: the inbox checks a new
file against all of them (`known_ids`), and the load names the files of any id it still finds
twice (`duplicate_ids_error`).
"""

from __future__ import annotations

import os
from collections import defaultdict
from importlib import resources
from pathlib import Path

from mascot_dag.lib.data.empathetic import load_empathetic_dialogues
from mascot_dag.lib.data.loading import DataFileError
from mascot_dag.lib.data.qmsum import load_qmsum
from mascot_dag.lib.types import Context

DEMO_DIR = Path(str(resources.files("mascot_dag") / "data"))
DEMO_ED = DEMO_DIR / "empatheticdialogues"
DEMO_QMSUM = DEMO_DIR / "qmsum"


def configured_sources(ed_path: str = "", qmsum_path: str = "") -> tuple[Path, Path]:
    """(ED path, QMSum path) of a load: the given ones, else the environment, else the demo."""
    ed = ed_path or os.environ.get("MASCOT_ED_PATH") or str(DEMO_ED)
    qm = qmsum_path or os.environ.get("MASCOT_QMSUM_PATH") or str(DEMO_QMSUM)
    return Path(ed), Path(qm)


def user_contexts_path(configured: str = "") -> Path | None:
    """The user's own contexts file (`mascot demo --contexts`): run config, else
    $MASCOT_CONTEXTS_PATH, else None. Its contexts join the ED/QMSum sources above (the demo
    data by default, which also gives pi_SFT its listener turns)."""
    raw = configured or os.environ.get("MASCOT_CONTEXTS_PATH") or ""
    return Path(raw) if raw else None


def known_ids(
    incoming: tuple[list[Path], list[Path]], ed_path: str = "", qmsum_path: str = ""
) -> dict[str, str]:
    """context_id -> the file it comes from, over every source the next load reads.

    Sources are read leniently (skip_bad): a bad base file fails the load on its own and says
    so there; here it only must not hide the ids it does hold. A source that cannot be read at
    all holds no ids to clash with."""
    known: dict[str, str] = {}
    ed, qm = configured_sources(ed_path, qmsum_path)
    ed_in, qm_in = incoming
    loads = [lambda: load_empathetic_dialogues(ed, skip_bad=True, min_kept=0.0),
             lambda: load_qmsum(qm, skip_bad=True, min_kept=0.0)]
    loads += [lambda f=f: load_empathetic_dialogues(f, skip_bad=True, min_kept=0.0)
              for f in ed_in]
    loads += [lambda f=f: load_qmsum(f, skip_bad=True, min_kept=0.0) for f in qm_in]
    for load in loads:
        try:
            contexts = load().contexts
        except DataFileError:
            continue
        for c in contexts:
            known.setdefault(c.context_id, c.source_file)
    return known


def duplicate_ids_error(contexts: list[Context]) -> str | None:
    """None when every context id is unique; else a message naming the ids and, for each, the
    files it comes from (one of them is usually an inbox file accepted before a base path
    gained the same conversation)."""
    files: dict[str, list[str]] = defaultdict(list)
    for c in contexts:
        files[c.context_id].append(c.source_file)
    dupes = {cid: fs for cid, fs in files.items() if len(fs) > 1}
    if not dupes:
        return None
    shown = "; ".join(f"{cid} in {' and '.join(fs)}" for cid, fs in list(dupes.items())[:5])
    more = f" (and {len(dupes) - 5} more)" if len(dupes) > 5 else ""
    n = f"{len(dupes)} context ids come" if len(dupes) > 1 else "1 context id comes"
    return (f"{n} from two sources of this load: {shown}{more}. "
            "Remove the conversations (or the file under data/incoming/) from one of them")
