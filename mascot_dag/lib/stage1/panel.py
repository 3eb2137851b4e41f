"""The probe panel's verdict: a persona effect counts only when every valid reader sees it.

`persona_probe` holds the texts of each paired unit (base and adapter, in each format) and
`probe_readings` one prediction per reader of each text (`lib.stage1.readers`). Per reader and
format, the paired identifiability gain is summarised exactly as before (`probe.summarise`:
context-clustered bootstrap); then ONE rule decides:

- a reader counts when its accuracy on reference utterances it did not learn from is at least
  `readers.MIN_READER_ACCURACY` (a reader that cannot tell the references apart cannot tell an
  adapter's texts apart either; its gain is noise);
- a persona's gain is established when its CI lies above zero for every valid reader (and
  format); a persona is significantly worse when its CI lies below zero for ANY of them;
- the roster passes when every valid reader's pooled verdict passes (`probe.roster_verdict`),
  and the pooled figure reported is the most conservative one (the lowest lower bound). With no
  valid reader nothing is established and the roster does not pass.

People (`lib.evaluation.human_roles`: blind raters name which companion said each probe text)
are the reference the automatic readers stand in for, so they need no accuracy on reference
utterances: their accuracy is None, meaning "counts by definition" (`panel_verdict`). They join
the panel, per format, once their answers are enough (`PEOPLE_MIN_TEXTS`); below that the verdict
lists them as not yet a reader, and the automatic readers decide alone.

Why so strict: on the study's adapters the lexical reader saw +12.1 [+5.5, +18.8] points and a
semantic reader of the same texts -0.8 [-7.8, +5.9], with two personas significantly less
recognisable (issue 34). A gain one reader alone sees is a change of words, not of voice.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from mascot_dag.lib.evaluation import human_roles
from mascot_dag.lib.stage1.probe import UNIT, RosterVerdict, reader_summary, roster_verdict
from mascot_dag.lib.stage1.readers import MIN_READER_ACCURACY, cohen_kappa

# People join the panel (per format) once they have answered >= PEOPLE_MIN_TEXTS texts in complete
# base/adapter pairs (32 paired units) AND every persona of the roster has such pairs on >=
# `min_contexts` contexts. Why 64: a paired unit's difference is -1, 0 or +1 with a standard
# deviation near 0.7 at the probe's identification rates, so at 32 units the 95% CI of people's
# pooled gain is about +-24 points wide: as wide as the largest gains any reader measured in
# issue 34 (+23 points, one persona, lexical reader). With fewer answers people's CI holds zero
# whatever they heard, and as a reader that must agree they would block every verdict by sample
# size alone: a veto that says nothing about voices. From 64 on every answer narrows the CI (to
# confirm the +10-point pooled target people need about 190 paired units, ~380 texts). 64 texts
# are also 4 blocks of the page's common order (`human_roles.BLOCK_UNITS`), about 20 minutes for
# one rater. Why the per-persona floor: a persona's CI on fewer contexts can lie wholly below
# zero by chance, and "significantly worse" blocks (`stats.MIN_CLUSTERS_FOR_SIGNIFICANCE`).
PEOPLE_MIN_TEXTS = 64


@dataclass(frozen=True)
class PanelVerdict:
    """The roster's verdict under the panel, and each valid reader's own."""

    passed: bool
    gain: float  # the most conservative valid (reader, format)'s pooled figures
    lo: float
    hi: float
    n_contexts: int
    n_units: int
    reader: str  # which (reader/format) the pooled figures are
    established: tuple[str, ...]  # personas whose gain every valid reader sees
    worse: tuple[str, ...]  # personas significantly worse under some valid reader
    invalid: tuple[str, ...]  # readers below MIN_READER_ACCURACY
    per_reader: dict[str, RosterVerdict]
    description: str


def panel_verdict(summary: pl.DataFrame, accuracies: dict[str, float], personas: Sequence[str],
                  min_contexts: int, min_accuracy: float = MIN_READER_ACCURACY) -> PanelVerdict:
    """The one verdict rule (module doc). `summary`: `reader_summary`; `accuracies`: reader ->
    accuracy on held-out reference utterances (a reader missing there does not count). An
    accuracy of None marks a reference reader (people): it counts by definition, since the
    references' accuracy is what stands in for people's judgement; `roster_panel` gives it only
    once people's answers are enough (`PEOPLE_MIN_TEXTS`)."""
    readers = sorted(set(summary["reader"].to_list()))
    valid = [r for r in readers if r in accuracies
             and (accuracies[r] is None or accuracies[r] >= min_accuracy)]
    invalid = tuple(r for r in readers if r not in valid)
    per_reader = {}
    for (reader, fmt), part in summary.group_by(["reader", "format"], maintain_order=True):
        per_reader[f"{reader}/{fmt}"] = roster_verdict(part, personas, min_contexts)
    counted = {k: v for k, v in per_reader.items() if k.split("/")[0] in valid}
    lines = []
    for key, v in per_reader.items():
        name = key.split("/")[0]
        acc = accuracies.get(name, float("nan"))
        state = "" if key in counted else ", does not count"
        what = ("reference reader, counts by definition" if name in accuracies and acc is None
                else f"reader accuracy {_pct(acc)}{state}")
        lines.append(f"{key} ({what}): {_pct(v.gain, True)} "
                     f"[{_pct(v.lo, True)}, {_pct(v.hi, True)}]")
    if not counted:
        return PanelVerdict(False, math.nan, math.nan, math.nan, 0, 0, "", (), (), invalid,
                            per_reader, "no valid reader (accuracy on held-out reference "
                            f"utterances below {min_accuracy:.0%}): nothing is established. "
                            + "; ".join(lines))
    key, worst = min(counted.items(), key=lambda kv: (kv[1].lo, kv[1].gain))
    rows = {(r["reader"], r["format"], r["persona"]): r for r in summary.to_dicts()}

    def ci(k: str, p: str) -> tuple[float, float]:
        reader, fmt = k.split("/")
        r = rows[(reader, fmt, p)]
        return r["identifiable_lo"], r["identifiable_hi"]

    established = tuple(p for p in personas if all(ci(k, p)[0] > 0 for k in counted))
    worse = tuple(p for p in personas if any(ci(k, p)[1] < 0 for k in counted))
    passed = all(v.passed for v in counted.values())
    description = (
        f"panel verdict: {'passes' if passed else 'does not pass'}; most conservative valid "
        f"reader {key}: pooled identifiability gain {_pct(worst.gain, True)} "
        f"[{_pct(worst.lo, True)}, {_pct(worst.hi, True)}] on {worst.n_contexts} held-out "
        f"contexts ({worst.n_units} paired units); established under every valid reader: "
        f"{', '.join(established) or 'none'}"
        + (f"; significantly worse under some reader: {', '.join(worse)}" if worse else "")
        + ". Readers: " + "; ".join(lines))
    return PanelVerdict(passed, worst.gain, worst.lo, worst.hi, worst.n_contexts, worst.n_units,
                        key, established, worse, invalid, per_reader, description)


def persona_verdict(summary: pl.DataFrame, accuracies: dict[str, float], persona: str,
                    min_contexts: int) -> PanelVerdict:
    """`panel_verdict` of one persona (its rows in a `reader_summary`): the persona is its own
    pool, so its row stands for 'all'."""
    own = summary.filter(pl.col("persona") == persona)
    if own.is_empty():
        raise ValueError(f"the probe summary has no rows for persona {persona!r}")
    return panel_verdict(pl.concat([own.with_columns(persona=pl.lit("all")), own]), accuracies,
                         [persona], min_contexts)


def _pct(x: float, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x * 100:+.1f}" if signed else f"{x * 100:.0f}%"


def reader_agreement(readings: pl.DataFrame) -> pl.DataFrame:
    """Cohen's kappa of every pair of readers on the same texts (per format)."""
    rows = []
    for (fmt,), part in readings.group_by(["format"], maintain_order=True):
        # a reader that named no persona (the judge on broken output) says "<none>"
        wide = part.with_columns(pl.col("predicted").fill_null("<none>")).pivot(
            on="reader", index=UNIT, values="predicted")
        names = sorted(c for c in wide.columns if c not in UNIT)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                both = wide.select(a, b).drop_nulls()  # texts both readers read
                rows.append({"format": fmt, "reader_a": a, "reader_b": b, "n_texts": both.height,
                             "kappa": cohen_kappa(both[a].to_list(), both[b].to_list())})
    return pl.DataFrame(rows, schema={"format": pl.String, "reader_a": pl.String,
                                      "reader_b": pl.String, "n_texts": pl.Int64,
                                      "kappa": pl.Float64})


@dataclass(frozen=True)
class RosterPanel:
    """What the probe's tables say about a roster: per-reader summary, verdict, agreement."""

    summary: pl.DataFrame  # reader_summary (persona rows and 'all', per reader and format)
    verdict: PanelVerdict
    agreement: pl.DataFrame  # reader_agreement (people too, on the texts they answered)
    accuracies: dict[str, float | None]  # None: people, a reference reader (panel_verdict)
    versions: list[str]  # adapter versions probed
    people: tuple[human_roles.PeopleCoverage, ...] = ()  # per format: answers, whether they count
    raters: human_roles.RaterAgreement = human_roles.RaterAgreement(math.nan, "", 0, 0)


def roster_panel(query, personas: Sequence[str], persona_set: str, min_contexts: int,
                 arm: str = "adapter", seed: int = 0) -> RosterPanel:
    """Read persona_probe, probe_readings, the readers' accuracies on `persona_set`'s
    references (probe_readers) and people's answers (human_role_answers) through
    `query(sql, params)` (the store's or the CLI's read-only DuckDB frame) and apply the verdict
    rule to `arm` vs base; people join as a reader per format once their answers are enough
    (`PEOPLE_MIN_TEXTS`), and the verdict's description says how far they are."""
    marks = ", ".join("?" * len(personas))
    where = f"arm IN ('base', ?) AND persona_id IN ({marks})"
    texts = query(f"SELECT * FROM persona_probe WHERE {where}", [arm, *personas])
    if texts.is_empty() or arm not in set(texts["arm"].to_list()):
        raise ValueError(f"no persona_probe rows for arm {arm!r}: materialise persona_adapters")
    readings = query(f"SELECT * FROM probe_readings WHERE {where}", [arm, *personas])
    readers = query("SELECT reader, accuracy FROM probe_readers WHERE persona_set = ?",
                    [persona_set])
    accuracies: dict[str, float | None] = dict(readers.select("reader", "accuracy").rows())
    answers = human_roles.matched_answers(
        query(f"SELECT * FROM human_role_answers WHERE {where}", [arm, *personas]), texts)
    formats = sorted(set(texts["format"].to_list()))
    people = tuple(human_roles.coverage(answers, personas, formats, arm, PEOPLE_MIN_TEXTS,
                                        min_contexts))
    joined = [c.format for c in people if c.joins]
    said = human_roles.people_readings(answers).select(readings.columns)
    if joined:
        accuracies[human_roles.READER] = None  # a reference reader: counts by definition
    counted = pl.concat([readings, said.filter(pl.col("format").is_in(joined))],
                        how="vertical_relaxed")
    as_adapter = pl.col("arm").replace({arm: "adapter"})
    texts, counted = texts.with_columns(arm=as_adapter), counted.with_columns(arm=as_adapter)
    summary = reader_summary(texts, counted, seed=seed)
    versions = sorted(set(texts.filter(pl.col("arm") == "adapter")["model_version"].to_list()))
    verdict = panel_verdict(summary, accuracies, personas, min_contexts)
    raters = human_roles.rater_agreement(answers)
    status = [c.describe() for c in people]
    verdict = dataclasses.replace(verdict, description=(
        f"{verdict.description}. {'; '.join(status)}; {raters.describe()}"))
    agreement = reader_agreement(pl.concat([readings, said], how="vertical_relaxed")
                                 .with_columns(arm=as_adapter))
    return RosterPanel(summary, verdict, agreement, accuracies, versions, people, raters)


def sets_verdict(verdicts: dict[str, PanelVerdict]) -> PanelVerdict:
    """The verdicts of several trained persona sets ({set: verdict}, each its own roster's) as
    one: it passes only when every set's passes; its figures are the most conservative set's
    (a failing one first, then the lowest CI bound), its description names every set's. One
    set: its verdict unchanged."""
    if not verdicts:
        raise ValueError("no persona set was probed")
    if len(verdicts) == 1:
        return next(iter(verdicts.values()))

    def rank(item: tuple[str, PanelVerdict]) -> tuple[bool, float]:
        v = item[1]
        return v.passed, v.lo if v.lo == v.lo else -math.inf

    name, worst = min(verdicts.items(), key=rank)
    return dataclasses.replace(
        worst, passed=all(v.passed for v in verdicts.values()),
        reader=f"{name}: {worst.reader}",
        established=tuple(p for v in verdicts.values() for p in v.established),
        worse=tuple(p for v in verdicts.values() for p in v.worse),
        invalid=tuple(sorted({f"{s}/{r}" for s, v in verdicts.items() for r in v.invalid})),
        per_reader={f"{s}/{r}": rv for s, v in verdicts.items() for r, rv in v.per_reader.items()},
        description="; ".join(f"{s} roster: {v.description}" for s, v in verdicts.items()))


def panel_text(result: RosterPanel, arm: str, persona_set: str) -> str:
    """`mascot probe`'s report of one roster: a row per reader and format (accuracy, whether it
    counts, pooled gain with CI and n, each persona's gain), the embedded judge's measures, the
    readers' agreement and the verdict line."""
    from mascot_dag.lib.markdown import text_table

    def ci(r: dict) -> str:
        return (f"{r['identifiable_gain'] * 100:+.1f} [{r['identifiable_lo'] * 100:+.1f}, "
                f"{r['identifiable_hi'] * 100:+.1f}]")

    s = result.summary
    valid = set(result.accuracies) - set(result.verdict.invalid)
    rows = []
    for (reader, fmt), part in s.group_by(["reader", "format"], maintain_order=True):
        by = {r["persona"]: r for r in part.to_dicts()}
        acc = result.accuracies.get(reader)
        rows.append({"reader": reader, "format": fmt,
                     "accuracy": "reference" if acc is None else f"{acc:.0%}",
                     "counts": "yes" if reader in valid else "no",
                     "pooled gain [95% CI]": ci(by["all"]),
                     "n units/contexts": f"{by['all']['n_units']}/{by['all']['n_contexts']}",
                     **{p: f"{by[p]['identifiable_gain'] * 100:+.1f}"
                        for p in sorted(by) if p != "all"}})
    judged = s.filter(pl.col("reader") == s["reader"][0]).select(
        "format", "persona", *(pl.col(f"{m}_gain").round(3)
                               for m in ("consistency", "relevance", "copied")),
        pl.col("identical_share").round(3))
    agreement = (text_table(result.agreement.with_columns(pl.col("kappa").round(3)))
                 if len(result.agreement) else "(one reader: no agreement to report)")
    return "\n".join([
        f"persona probe of the {persona_set} roster ({arm} vs base), identifiability gain in "
        "points, per reader:", text_table(pl.DataFrame(rows)), "",
        "embedded judge (1-5 gains; the training signal's neighbour, not a reader):",
        text_table(judged), "", "reader agreement on the probe texts (Cohen's kappa):",
        agreement, "", "people (`mascot rate`, /who: which companion said it?):",
        *[f"  {c.describe()}" for c in result.people],
        f"  {result.raters.describe()}", "", f"verdict: {result.verdict.description}"])



def unreadable_sets(stored: list[str], probed: list[str]) -> list[str]:
    """`mascot probe`'s line for each stored persona set that has no probe rows because it has
    no reference utterances ("SET roster: n/a: no reference utterances for SET ..."): said, never
    guessed at. A set with references but no rows was not trained in this profile: no line."""
    from mascot_dag.lib.stage1.readers import NoReferenceUtterances, load_reference_utterances

    lines = []
    for persona_set in dict.fromkeys(s for s in stored if s not in set(probed)):
        try:
            load_reference_utterances(persona_set)
        except NoReferenceUtterances as e:
            lines.append(f"{persona_set} roster: {e}")
    return lines
