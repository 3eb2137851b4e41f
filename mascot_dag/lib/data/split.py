"""Deterministic train/eval split of contexts by a hash of the context id.

A context's split depends only on its id, the salt and the ratio: adding, removing or reordering
other contexts never moves it, so re-materialising `contexts` with more data keeps old
assignments (and everything trained or evaluated on them) valid. Held-out ED valences/emotions
and QMSum domains (settings `ood_valences`, `ood_domains`) get a third split, "ood".
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


# ---- in-domain vs out-of-domain (OOD) condition -------------------------------------------------
# Contexts whose ED valence (or ED emotion label) or QMSum domain is held out get the split "ood":
# never trained on (every training query selects split = 'train'), evaluated as the OOD
# condition. Everything else keeps its hash split; its eval contexts are the in-domain condition.
OOD_SPLIT = "ood"
IN_DOMAIN, OUT_OF_DOMAIN = "in_domain", "out_of_domain"
QMSUM_DOMAINS = ("academic", "committee", "product")


def validate_ood(ood_valences: list[str], ood_domains: list[str],
                 user_domains: set[str] | frozenset[str] = frozenset()) -> None:
    """Raise when a held-out name is neither an ED valence / emotion label nor a QMSum domain
    nor a `domain` of the user's contexts (`user_domains`, lower case)."""
    from mascot_dag.lib.data.valence import EMOTIONS, VALENCES

    bad = [v for v in ood_valences if v.strip().lower() not in (*VALENCES, *EMOTIONS)]
    if bad:
        raise ValueError(f"settings.ood_valences: unknown {bad}; use a valence {VALENCES} or one "
                         "of the 32 EmpatheticDialogues emotion labels")
    known = (*QMSUM_DOMAINS, *sorted(user_domains))
    bad = [d for d in ood_domains if d.strip().lower() not in known]
    if bad:
        yours = f" or a domain of your contexts {sorted(user_domains)}" if user_domains else ""
        raise ValueError(f"settings.ood_domains: unknown {bad}; use QMSum domains "
                         f"{QMSUM_DOMAINS}{yours}")


def is_ood(source: str, valence: str | None, emotion: str | None, domain: str | None,
           ood_valences: list[str], ood_domains: list[str]) -> bool:
    """Whether a context belongs to the held-out (OOD) condition: a held-out domain holds out
    every context of that domain (QMSum's, or a user's context of any mode), a held-out valence
    or emotion the ED contexts that have it."""
    held = {v.strip().lower() for v in ood_valences}
    if domain and domain.lower() in {d.strip().lower() for d in ood_domains}:
        return True
    if source == "empatheticdialogues":
        return bool(held & {(valence or "").lower(), (emotion or "").lower()} - {""})
    return (domain or "").lower() in {d.strip().lower() for d in ood_domains}


def assign_split_ood(context_id: str, source: str, valence: str | None, emotion: str | None,
                     domain: str | None, eval_ratio: float = 0.25,
                     ood_valences: list[str] | None = None,
                     ood_domains: list[str] | None = None, salt: str = "mascot") -> str:
    """"ood" for held-out contexts, else `assign_split` (train / eval by hash)."""
    if is_ood(source, valence, emotion, domain, ood_valences or [], ood_domains or []):
        return OOD_SPLIT
    return assign_split(context_id, eval_ratio, salt)


def condition_of_split(split: str | None) -> str | None:
    """The evaluation condition of a context's split: eval -> in_domain, ood -> out_of_domain."""
    return {"eval": IN_DOMAIN, OOD_SPLIT: OUT_OF_DOMAIN}.get(split or "")
