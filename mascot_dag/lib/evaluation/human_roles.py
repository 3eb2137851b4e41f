"""People as a reader of the persona probe: "which companion of the roster said it?"

The blind rating page (`web/who.py`) shows single utterances from `persona_probe` (base and
adapter texts mixed; persona, arm, context and model hidden) and asks which companion of the
roster said it, or "can't tell". This module holds the pure parts:

- the draw. All raters walk ONE common order of paired units (`pool`): units grouped by (persona
  set, format, persona), each group ordered by a hash of the unit's key, then taken round-robin,
  so every block of `BLOCK_UNITS` units holds each (format, persona) once. Each unit brings both
  of its texts (base and adapter) into the same block, and each rater sees a block's texts in
  an order shuffled by `random.Random(f"{rater}\\0{block}")` (`sequence`). Why a common order:
  a text counts for the paired gain only when the other arm of its unit is read too, and the
  plurality answer and the raters' agreement need texts answered by >= 2 raters; raters each
  drawing from the whole pool would spread thin over ~1000 texts and share almost none.
- the shown id (`utterance_id`): a hash of the unit's key AND the text, so the page never
  carries persona or arm, and an answer to a text the probe has since regenerated no longer
  matches it (`matched_answers` drops it).
- aggregation (`people_readings`): per text the plurality answer over raters ("can't tell" is an
  answer of its own); a tie at the top, or "can't tell" on top, gives predicted = None (not
  identifiable), rows shaped like `probe_readings` with reader "people".
- the raters' agreement (`rater_agreement`): Cohen's kappa when exactly two raters answered the
  texts that >= 2 raters answered, Fleiss' kappa (generalised to a varying number of raters per
  text) when more did; "can't tell" is a category of its own; n is reported.
- coverage (`coverage`): whether the answers are enough for people to join the probe panel
  (the threshold and its reason: `lib/stage1/panel.PEOPLE_MIN_TEXTS`).

Known limit: the two texts of a unit answer the same request in the same block, so a rater who
notices that may answer both alike; that pulls people's gain toward zero (conservative).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from mascot_dag.lib.evaluation.human import RatingError, check_rater
from mascot_dag.lib.stage1.probe import UNIT

READER = "people"
SHOWN_ARMS = ("base", "adapter")  # the probe's ablation arms (warm_start) are not asked
BLOCK_UNITS = 8  # units per block: each (format, persona) of the support roster once
CANT_TELL = "-"  # the form's value for "can't tell" (never a persona id: ids are slugs)
FIELDS = ("rater", "u", "answer")
ANSWER_SCHEMA = {"rater": pl.String, "persona_id": pl.String, "context_id": pl.String,
                 "seed": pl.Int64, "arm": pl.String, "format": pl.String,
                 "utterance_id": pl.String, "answer": pl.String}
READING_SCHEMA = {"persona_id": pl.String, "context_id": pl.String, "seed": pl.Int64,
                  "arm": pl.String, "format": pl.String, "reader": pl.String,
                  "predicted": pl.String, "identifiable": pl.Float64}


@dataclass(frozen=True)
class Utterance:
    """One persona_probe text as the page knows it (only `utterance_id` and `text` are shown)."""

    utterance_id: str
    persona_set: str
    persona_id: str
    context_id: str
    seed: int
    arm: str
    format: str
    text: str


def utterance_id(persona_id: str, context_id: str, seed: int, arm: str, fmt: str,
                 text: str) -> str:
    """The opaque id a rater sees: 24 hex digits of SHA-256 over the text's key and the text."""
    raw = "\0".join([persona_id, context_id, str(int(seed)), arm, fmt, text])
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:24]


def with_ids(texts: pl.DataFrame) -> pl.DataFrame:
    """persona_probe rows with their `utterance_id` column."""
    ids = [utterance_id(*r) for r in texts.select(*UNIT, "text").iter_rows()]
    return texts.with_columns(utterance_id=pl.Series(ids, dtype=pl.String))


def _key_hash(*parts: Any) -> str:
    return hashlib.sha256("\0".join(map(str, parts)).encode("utf-8")).hexdigest()


def pool(texts: pl.DataFrame, persona_set_of: dict[str, str]) -> list[list[Utterance]]:
    """The common order: blocks of `BLOCK_UNITS` paired units, their texts in canonical order.
    `texts`: persona_probe rows; `persona_set_of`: persona id -> set (personas outside it are
    left out, as are units missing an arm of SHOWN_ARMS)."""
    t = texts.filter(pl.col("arm").is_in(SHOWN_ARMS)
                     & pl.col("persona_id").is_in(list(persona_set_of)))
    units: dict[tuple, dict[str, Utterance]] = {}
    for pid, cid, seed, arm, fmt, text in t.select(*UNIT, "text").iter_rows():
        u = Utterance(utterance_id(pid, cid, seed, arm, fmt, text), persona_set_of[pid], pid,
                      cid, int(seed), arm, fmt, text)
        units.setdefault((pid, cid, int(seed), fmt), {})[arm] = u
    groups: dict[tuple, list[tuple]] = {}
    for key, arms in units.items():
        if len(arms) == len(SHOWN_ARMS):
            pid, cid, seed, fmt = key
            groups.setdefault((persona_set_of[pid], fmt, pid), []).append(key)
    ordered = [sorted(g, key=lambda k: _key_hash(*k)) for _, g in sorted(groups.items())]
    flat = [g[i] for i in range(max(map(len, ordered), default=0)) for g in ordered if i < len(g)]
    return [[units[k][a] for k in flat[b:b + BLOCK_UNITS] for a in SHOWN_ARMS]
            for b in range(0, len(flat), BLOCK_UNITS)]


def sequence(rater: str, blocks: list[list[Utterance]]) -> list[Utterance]:
    """The rater's order: block after block, each block's texts shuffled per rater."""
    out = []
    for b, block in enumerate(blocks):
        shown = list(block)
        random.Random(f"{rater}\0{b}").shuffle(shown)
        out += shown
    return out


def roster_order(rater: str, persona_ids: Sequence[str]) -> list[str]:
    """The answer options in the rater's own order (the same on every page for that rater, so a
    position on the list cannot favour one companion across raters)."""
    ids = sorted(persona_ids)
    random.Random(f"{rater}\0roster").shuffle(ids)
    return ids


def parse_answer(form: dict[str, list[str]], known: dict[str, Utterance],
                 roster: dict[str, Sequence[str]]) -> tuple[str, Utterance, str | None]:
    """Validate a submitted answer: (rater, utterance, persona id or None for "can't tell").
    RatingError names every bad field (422); an unknown utterance is a 404."""
    problems = []
    for name, values in sorted(form.items()):
        if name not in FIELDS:
            problems.append(f"unknown field {name[:60]!r}")
        elif len(values) > 1:
            problems.append(f"field {name} given {len(values)} times")
    uid = form.get("u", [""])[0].strip()
    utt = known.get(uid)
    if utt is None:
        raise RatingError([f"u: unknown utterance {uid[:60]!r} (the probe may have been re-run: "
                           "open the page again); nothing was stored"], status=404)
    rater = ""
    try:
        rater = check_rater(form.get("rater", [""])[0])
    except RatingError as e:
        problems += e.problems
    answer = form.get("answer", [""])[0].strip()
    ids = list(roster.get(utt.persona_set, ()))
    if not answer:
        problems.append("answer: missing; pick the companion who said it, or \"can't tell\"")
    elif answer != CANT_TELL and answer not in ids:
        problems.append(f"answer: unknown companion {answer[:60]!r}; pick one of "
                        f"{', '.join(ids)} or \"can't tell\"")
    if problems:
        raise RatingError(problems)
    return rater, utt, None if answer == CANT_TELL else answer


def answer_rows(rater: str, utt: Utterance, answer: str | None) -> pl.DataFrame:
    """The `human_role_answers` row of one answer."""
    return pl.DataFrame([[rater, utt.persona_id, utt.context_id, utt.seed, utt.arm, utt.format,
                          utt.utterance_id, answer]], schema=ANSWER_SCHEMA, orient="row")


def replace_changes(rater: str, utt: Utterance, rows: pl.DataFrame) -> list:
    """`db.replace_many` changes: the rater's earlier answer for the text goes, the new comes."""
    where = ("rater = ? AND persona_id = ? AND context_id = ? AND seed = ? AND arm = ? "
             "AND format = ?")
    return [("human_role_answers", rows, where,
             [rater, utt.persona_id, utt.context_id, utt.seed, utt.arm, utt.format])]


# ---- aggregation -----------------------------------------------------------------------------

def matched_answers(answers: pl.DataFrame, texts: pl.DataFrame) -> pl.DataFrame:
    """The answers given to the texts `texts` (persona_probe rows) hold NOW: an answer whose
    utterance id no longer matches (the text was regenerated) is dropped."""
    if answers.is_empty():
        return pl.DataFrame(schema=ANSWER_SCHEMA)
    current = with_ids(texts).select(*UNIT, "utterance_id").with_columns(
        pl.col("seed").cast(pl.Int64))
    return answers.select(*ANSWER_SCHEMA).cast(ANSWER_SCHEMA).join(
        current, on=[*UNIT, "utterance_id"], how="semi")


def plurality(answers: Sequence[str | None]) -> str | None:
    """The answer most raters gave; None on a tie at the top, or when "can't tell" (None) is on
    top, or with no answers."""
    top = Counter(answers).most_common()
    if not top or (len(top) > 1 and top[0][1] == top[1][1]):
        return None
    return top[0][0]


def people_readings(matched: pl.DataFrame) -> pl.DataFrame:
    """`probe_readings` rows of reader "people": per text the plurality answer over raters."""
    rows = []
    for key, part in matched.group_by(UNIT, maintain_order=True):
        predicted = plurality(part["answer"].to_list())
        rows.append([*key, READER, predicted, float(predicted == key[0])])
    return pl.DataFrame(rows, schema=READING_SCHEMA, orient="row")


@dataclass(frozen=True)
class RaterAgreement:
    """The raters' agreement on the texts >= 2 of them answered."""

    kappa: float  # NaN: undefined (no such texts, or one category throughout)
    method: str  # "Cohen" (two raters) | "Fleiss" (more) | "" (no text with two raters)
    n_texts: int
    n_raters: int

    def describe(self) -> str:
        if not self.method:
            return "raters' agreement: no text answered by two raters yet"
        k = "n/a" if math.isnan(self.kappa) else f"{self.kappa:.3f}"
        return (f"raters' agreement: {self.method}'s kappa {k} on {self.n_texts} texts answered "
                f"by >= 2 of {self.n_raters} raters")


def fleiss_kappa(counts: np.ndarray) -> float:
    """Fleiss' kappa of a texts x categories count matrix; each text needs >= 2 answers, not the
    same number (P_i uses each text's own n_i; category shares pool all answers)."""
    counts = np.asarray(counts, dtype=float)
    n = counts.sum(axis=1)
    if counts.size == 0 or (n < 2).any():
        raise ValueError("Fleiss' kappa needs texts with >= 2 answers each")
    p_i = ((counts ** 2).sum(axis=1) - n) / (n * (n - 1))
    shares = counts.sum(axis=0) / n.sum()
    p_e = float((shares ** 2).sum())
    return float("nan") if p_e >= 1 else float((p_i.mean() - p_e) / (1 - p_e))


def rater_agreement(matched: pl.DataFrame) -> RaterAgreement:
    """Cohen's or Fleiss' kappa (module doc) on the texts answered by >= 2 raters."""
    from mascot_dag.lib.stage1.readers import cohen_kappa

    shared = matched.filter(pl.len().over(UNIT) >= 2)
    if shared.is_empty():
        return RaterAgreement(math.nan, "", 0, 0)
    raters = sorted(set(shared["rater"].to_list()))
    n_texts = shared.select(UNIT).unique().height
    if len(raters) == 2:
        wide = shared.with_columns(pl.col("answer").fill_null("<none>")).pivot(
            on="rater", index=UNIT, values="answer")
        return RaterAgreement(cohen_kappa(wide[raters[0]].to_list(), wide[raters[1]].to_list()),
                              "Cohen", n_texts, 2)
    labels = sorted({a or "<none>" for a in shared["answer"].to_list()})
    col = {c: j for j, c in enumerate(labels)}
    texts = {}
    for key, answer in zip(shared.select(UNIT).rows(), shared["answer"].to_list(), strict=True):
        texts.setdefault(key, np.zeros(len(labels)))[col[answer or "<none>"]] += 1
    return RaterAgreement(fleiss_kappa(np.array(list(texts.values()))), "Fleiss", n_texts,
                          len(raters))


@dataclass(frozen=True)
class PeopleCoverage:
    """How far people's answers cover one format of the probe (arms base and the compared one)."""

    format: str
    n_answers: int
    n_texts: int  # texts with >= 1 answer
    n_paired_texts: int  # of those, texts whose unit's other arm is answered too
    fewest_contexts: int  # fewest contexts with a paired unit, over the roster's personas
    joins: bool
    min_texts: int  # the thresholds it was held to
    min_contexts: int

    def describe(self) -> str:
        what = (f"people/{self.format}: {self.n_answers} answers on {self.n_texts} texts "
                f"({self.n_paired_texts} in complete base/adapter pairs; fewest contexts of a "
                f"persona {self.fewest_contexts})")
        if self.joins:
            return f"{what}: a reader of the panel"
        return (f"{what}: not yet a reader (needs >= {self.min_texts} texts in complete pairs "
                f"and every persona on >= {self.min_contexts} contexts)")


def coverage(matched: pl.DataFrame, personas: Sequence[str], formats: Sequence[str],
             arm: str, min_texts: int, min_contexts: int) -> list[PeopleCoverage]:
    """Per format: the counts of `PeopleCoverage` and whether people join the panel (>= min_texts
    texts in complete pairs, and every persona with paired units on >= min_contexts contexts)."""
    out = []
    for fmt in formats:
        part = matched.filter((pl.col("format") == fmt) & pl.col("arm").is_in(["base", arm]))
        texts = part.select(UNIT).unique()
        pairs = texts.group_by("persona_id", "context_id", "seed").agg(
            pl.col("arm").n_unique().alias("arms")).filter(pl.col("arms") == 2)
        contexts = dict(pairs.group_by("persona_id").agg(pl.col("context_id").n_unique())
                        .rows())
        fewest = min((contexts.get(p, 0) for p in personas), default=0)
        paired = 2 * pairs.height
        out.append(PeopleCoverage(fmt, part.height, texts.height, paired, fewest,
                                  paired >= min_texts and fewest >= min_contexts, min_texts,
                                  min_contexts))
    return out
