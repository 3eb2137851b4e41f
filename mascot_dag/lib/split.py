"""Deterministic train/eval split of contexts by a hash of the context id.

A context's split depends only on its id, the salt and the ratio: adding, removing or reordering
other contexts never moves it, so re-materialising `contexts` with more data keeps old
assignments (and everything trained or evaluated on them) valid.
"""

from __future__ import annotations

import hashlib


def assign_split(context_id: str, eval_ratio: float = 0.25, salt: str = "mascot") -> str:
    """Return "eval" for about `eval_ratio` of all ids, "train" for the rest."""
    if not 0.0 <= eval_ratio < 1.0:
        raise ValueError(f"eval_ratio must be in [0, 1), got {eval_ratio}")
    if not context_id:
        raise ValueError("assign_split: context_id is empty")
    digest = hashlib.sha256(f"{salt}\x00{context_id}".encode()).digest()
    # First 8 bytes as a uniform number in [0, 1).
    u = int.from_bytes(digest[:8], "big") / 2**64
    return "eval" if u < eval_ratio else "train"
