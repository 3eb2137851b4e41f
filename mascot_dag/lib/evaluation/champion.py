"""The overall evaluation score of a method and the champion decision built on it.

Overall score, exactly: take the `eval_scores` rows of the method whose level is 'agent' or
'collective' (judge scores; automatic metrics are excluded because their directions and scales
differ), drop failed judgments (value NULL), map each 1-5 value to 0-100 with `types.to_100`,
average per (level, criterion) over dialogues and judges, then take the unweighted mean of those
criterion means. Each criterion counts once, however many dialogues or judges scored it; with the
full rubric that is the mean of 9 criteria (5 agent-level + 4 collective).

The champion gate works on PAIRED per-context differences of that per-dialogue overall score,
because two methods run on the same contexts, users and seeds, and the context explains most of a
score: differencing removes it, and the bootstrap resamples contexts (clusters), not dialogues.

- Later runs: the current champion (the MLflow alias `champion` of the persona adapters and the
  director) runs again in the same evaluation as method `champion`; the candidate (`mascot`) is
  promoted only when the 95% cluster-bootstrap CI of (candidate - champion) lies entirely above
  `margin` points (0-100 scale). Comparing against a score stored by an earlier run would compare
  different contexts, seeds and judges, so noise alone could move the champion.
- First run (no champion alias yet): the candidate must significantly beat `zero_shot` the same
  way, so an untrained or broken MASCOT never becomes the first champion.
- Either way at least `min_contexts` paired contexts are required: a percentile bootstrap over 2
  contexts is just [min, max] of two differences, so two lucky positives would pass the CI rule.
- `criteria` (the `gate_criteria` setting) narrows the gate's overall to the named judge criteria
  (`consistency` or `agent/consistency`; empty: all). The mean of all nine can promote on
  relevance alone (the second study evaluation did: relevance +19.5, consistency and contribution
  not significant), so a profile that exists to measure persona alignment gates on the criteria
  the method is for. Reports keep the all-criteria overall; the decision names what it used.

Frames are polars.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import polars as pl

from mascot_dag.lib.evaluation.stats import paired_cluster_bootstrap
from mascot_dag.lib.types import AGENT_CRITERIA, COLLECTIVE_CRITERIA, to_100

JUDGE_LEVELS = ("agent", "collective")
CANDIDATE = "mascot"  # the method whose adapter versions the gate would promote
CHAMPION = "champion"  # eval method: the `champion` alias versions, run like `mascot`
FIRST_RUN_BASELINE = "zero_shot"  # what the first champion must significantly beat


# What MASCOT is for (distinct personas that each contribute; no echo), at both levels: the
# study and paper profiles gate on these
PERSONA_CRITERIA = ("agent/consistency", "agent/social_contribution", "collective/fidelity",
                    "collective/engagement_contribution")
JUDGE_CRITERIA = {**{c: "agent" for c in AGENT_CRITERIA},
                  **{c: "collective" for c in COLLECTIVE_CRITERIA}}


def check_gate_criteria(criteria) -> list[tuple[str, str]]:
    """(level, criterion) pairs of gate criteria names (`criterion` or `level/criterion`);
    ValueError names an unknown one and the known names (a typo must not gate on nothing)."""
    out = []
    for name in criteria:
        level, _, crit = name.rpartition("/")
        if crit not in JUDGE_CRITERIA or level not in ("", JUDGE_CRITERIA[crit]):
            known = ", ".join(f"{lv}/{c}" for c, lv in JUDGE_CRITERIA.items())
            raise ValueError(f"gate criterion {name!r} is not a judge criterion; known: {known}")
        out.append((JUDGE_CRITERIA[crit], crit))
    return out


def only_criteria(eval_scores, criteria) -> pl.DataFrame:
    """The rows of the named judge criteria (all rows when `criteria` is empty)."""
    pairs = check_gate_criteria(criteria)
    if not pairs or eval_scores.is_empty():
        return eval_scores
    keep = pl.any_horizontal([(pl.col("level") == lv) & (pl.col("criterion") == c)
                              for lv, c in pairs])
    return eval_scores.filter(keep)


def judge_rows_100(eval_scores: pl.DataFrame) -> pl.DataFrame:
    """The judge-score rows (levels agent/collective, value not NULL) with `value` on 0-100.

    Raises when a judge value lies outside 1-5: eval_scores stores judges' raw 1-5 scores, and a
    row already on 0-100 would otherwise be stretched silently.
    """
    value = pl.col("value").cast(pl.Float64).fill_nan(None)
    df = eval_scores.with_columns(value=value).filter(
        pl.col("level").is_in(JUDGE_LEVELS) & pl.col("value").is_not_null())
    bad = df.filter((pl.col("value") < 1.0) | (pl.col("value") > 5.0))
    if bad.height:
        r = bad.row(0, named=True)
        raise ValueError(
            f"eval_scores row (method={r['method']}, dialogue_id={r['dialogue_id']}, "
            f"judge={r['judge']}, criterion={r['criterion']}) has value {r['value']}; judge scores "
            "must be stored on the judges' 1-5 scale (reports convert them to 0-100)"
        )
    return df.with_columns(value=to_100(pl.col("value")))  # linear: an expression maps as a float


def criterion_means(eval_scores, method: str) -> pl.DataFrame:
    """Mean 0-100 `value` per (level, criterion) of one method (empty when it has no judge rows)."""
    df = judge_rows_100(eval_scores.filter(pl.col("method") == method))
    return df.group_by("level", "criterion").agg(pl.col("value").mean()).sort("level", "criterion")


def overall_score(eval_scores, method: str) -> float | None:
    """Unweighted mean of the method's per-criterion 0-100 means (see module doc); None if none."""
    means = criterion_means(eval_scores, method)
    return float(means["value"].mean()) if means.height else None


def dialogue_overall(eval_scores: pl.DataFrame) -> pl.DataFrame:
    """Per-dialogue overall scores (method, dialogue_id, overall), same recipe within a dialogue:
    mean over judges per (level, criterion), then the mean of those. Used for bootstrap CIs."""
    return (judge_rows_100(eval_scores)
            .group_by("method", "dialogue_id", "level", "criterion").agg(pl.col("value").mean())
            .group_by("method", "dialogue_id").agg(overall=pl.col("value").mean())
            .sort("method", "dialogue_id"))


def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.2f}"


@dataclass(frozen=True)
class Decision:
    """The gate's verdict and the numbers it rests on (all scores and differences on 0-100)."""

    promote: bool
    reason: str
    candidate: float | None = None  # candidate's overall score (all its dialogues)
    current: float | None = None  # comparator's overall score (all its dialogues)
    rule: str = ""  # "vs_champion" | "first_run_vs_zero_shot"
    comparator: str | None = None  # eval method compared against
    diff: float | None = None  # mean paired difference candidate - comparator
    ci_lo: float | None = None
    ci_hi: float | None = None
    n_contexts: int = 0  # paired contexts (clusters) the difference is averaged over
    p_two_sided: float | None = None
    margin: float = 0.0
    min_contexts: int = 0
    criteria: tuple[str, ...] = ()  # judge criteria the overall is over; () = all


def context_of(dialogue_id: str, method: str) -> str:
    """The context of an eval dialogue id `<prefix>:<method>:<context_id>` (pairing key).

    Ids of another shape are returned whole, so they pair with nothing rather than wrongly.
    """
    marker = f":{method}:"
    at = dialogue_id.find(marker)
    return dialogue_id[at + len(marker):] if at >= 0 else dialogue_id


def with_context(per, dialogues=None):
    """`per` (method, dialogue_id, ...) plus a context_id column: from `dialogues` (the table's
    dialogue_id -> context_id) where it knows the dialogue, else parsed from the id."""
    known = {}
    if dialogues is not None and {"dialogue_id", "context_id"} <= set(dialogues.columns):
        known = dict(zip(dialogues["dialogue_id"].to_list(), dialogues["context_id"].to_list(),
                         strict=True))
    ids = [known.get(d) or context_of(d, m)
           for d, m in zip(per["dialogue_id"].to_list(), per["method"].to_list(), strict=True)]
    return per.with_columns(context_id=pl.Series(ids, dtype=pl.String))


PAIR_SCHEMA = {"context_id": pl.String, "candidate": pl.Float64, "comparator": pl.Float64,
               "diff": pl.Float64}


def pair_methods(per: pl.DataFrame, candidate: str, comparator: str,
                 value: str = "overall") -> pl.DataFrame:
    """Per-context `value` of two methods on the contexts both have (from `with_context` rows).

    Columns: context_id, candidate, comparator, diff (candidate - comparator), sorted by context.
    A context with several dialogues of one method (e.g. several seeds) is averaged first.
    """
    v = pl.col(value).cast(pl.Float64).fill_nan(None)
    by = (per.filter(pl.col("method").is_in([candidate, comparator]))
          .with_columns(v).drop_nulls(value)
          .group_by("method", "context_id").agg(v.mean()))

    def side(method: str, name: str) -> pl.DataFrame:
        return by.filter(pl.col("method") == method).select("context_id", pl.col(value).alias(name))

    both = side(candidate, "candidate").join(side(comparator, "comparator"), on="context_id")
    return (both.with_columns(diff=pl.col("candidate") - pl.col("comparator"))
            .sort("context_id").select(list(PAIR_SCHEMA)).cast(PAIR_SCHEMA))


def paired_overall(eval_scores: pl.DataFrame, candidate: str, comparator: str) -> pl.DataFrame:
    """`pair_methods` of the per-dialogue overall scores (context from the dialogue id)."""
    if eval_scores.is_empty():
        return pl.DataFrame(schema=PAIR_SCHEMA)
    per = dialogue_overall(eval_scores.filter(pl.col("method").is_in([candidate, comparator])))
    return pair_methods(with_context(per), candidate, comparator, "overall")


def paired_difference(
    eval_scores, candidate: str, comparator: str, n_boot: int = 2000, seed: int = 0
) -> dict[str, float]:
    """`stats.paired_cluster_bootstrap` of the per-context overall differences (one unit per
    context, clustered by context): {mean, lo, hi, n_units, n_clusters, p_two_sided}."""
    pairs = paired_overall(eval_scores, candidate, comparator)
    return paired_cluster_bootstrap(pairs["context_id"].to_list(), pairs["diff"].to_list(),
                                    n=n_boot, seed=seed)


def _opt(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def gate_decision(
    eval_scores,
    champion_exists: bool | None = None,
    margin: float = 0.0,
    min_contexts: int = 8,
    n_boot: int = 2000,
    seed: int = 0,
    criteria=(),
    persona_evidence: tuple[bool, str] | None = None,
) -> Decision:
    """Promote `mascot` only when its paired CI against the comparator lies above `margin`.

    champion_exists: whether the MLflow alias `champion` is set (None: inferred from `champion`
    rows in eval_scores). When it exists but was not scored in this run, nothing is promoted:
    a gate without its comparator must fail closed. criteria: the judge criteria the overall is
    over (module doc; empty: all). persona_evidence: (passed, why) of the probe panel's verdict
    on the candidate's adapters (lib/stage1/panel.py); when given, a candidate the judges would
    promote on persona criteria is kept out unless the panel confirms the persona effect: the
    judges' persona scores are the training signal's neighbours, the panel's readers are not.
    """
    if margin < 0:
        raise ValueError(f"margin must be >= 0 points, got {margin}")
    if min_contexts < 1:
        raise ValueError(f"min_contexts must be >= 1, got {min_contexts}")
    eval_scores = only_criteria(eval_scores, criteria)
    methods = set(eval_scores["method"].to_list()) if "method" in eval_scores.columns else set()
    if champion_exists is None:
        champion_exists = CHAMPION in methods
    comparator = CHAMPION if champion_exists else FIRST_RUN_BASELINE
    rule = "vs_champion" if champion_exists else "first_run_vs_zero_shot"
    cand_all = overall_score(eval_scores, CANDIDATE) if CANDIDATE in methods else None
    comp_all = overall_score(eval_scores, comparator) if comparator in methods else None
    r = paired_difference(eval_scores, CANDIDATE, comparator, n_boot=n_boot, seed=seed)
    n = int(r["n_clusters"])
    base = Decision(False, "", cand_all, comp_all, rule, comparator, _opt(r["mean"]),
                    _opt(r["lo"]), _opt(r["hi"]), n, _opt(r["p_two_sided"]), margin, min_contexts,
                    tuple(criteria))
    over = f"over {', '.join(criteria)}" if criteria else "over all judge criteria"
    stats = (f"{CANDIDATE} - {comparator} = {_fmt(base.diff)} points ({over}), 95% "
             f"cluster-bootstrap CI [{_fmt(base.ci_lo)}, {_fmt(base.ci_hi)}], n = {n} paired "
             f"contexts, margin {margin:g}, min contexts {min_contexts}")
    if n == 0:
        why = (f"no paired contexts of {CANDIDATE} and {comparator} with judge scores"
               + (" (the champion exists but was not evaluated in this run)"
                  if champion_exists else ""))
        return dataclasses.replace(base, reason=f"not promoted: {why}; {stats}")
    if n < min_contexts:
        return dataclasses.replace(
            base, reason=f"not promoted: {n} paired contexts < {min_contexts} (too few for a "
                         f"trustworthy CI); {stats}")
    if base.ci_lo is not None and base.ci_lo > margin:
        if persona_evidence is not None and not persona_evidence[0]:
            return dataclasses.replace(
                base, reason=f"not promoted: the judges' CI lies above the margin, but the probe "
                             f"panel does not confirm the persona effect ({persona_evidence[1]}); "
                             f"{stats}")
        what = "beats the current champion" if champion_exists else (
            "first champion: significantly beats zero_shot")
        return dataclasses.replace(base, promote=True, reason=f"promoted ({what}): {stats}")
    what = "kept current champion" if champion_exists else "no first champion"
    return dataclasses.replace(
        base, reason=f"not promoted ({what}): the CI lower bound is not above the margin; {stats}")


def gate_tracking(decision: Decision) -> tuple[dict[str, Any], dict[str, float], dict[str, str]]:
    """(params, metrics, tags) for the eval run in MLflow; undefined numbers are left out,
    because MLflow metrics must be numbers and a missing CI is not a CI of 0."""
    params = {"gate.rule": decision.rule, "gate.comparator": decision.comparator or "none",
              "gate.margin": decision.margin, "gate.min_contexts": decision.min_contexts,
              "gate.criteria": ",".join(decision.criteria) or "all",
              "decision": decision.reason[:500]}  # MLflow caps a param value at 500 chars
    metrics = {"gate.promote": float(decision.promote),
               "gate.n_contexts": float(decision.n_contexts)}
    for k in ("diff", "ci_lo", "ci_hi", "p_two_sided", "candidate", "current"):
        v = getattr(decision, k)
        if v is not None and not math.isnan(v):
            metrics[f"gate.{k}"] = float(v)
    tags = {"champion_decision": "promote" if decision.promote else "keep",
            "champion_rule": decision.rule}
    return params, metrics, tags


def relabel_method(records: list, old: str, new: str) -> list:
    """Dialogue records run as method `old` renamed to method `new` (ids, rows, turns, directives).

    The champion runs through the `mascot` recipe (methods.run_method knows no `champion`), and
    its rows must not overwrite the candidate's: `eval:mascot:<cid>` -> `eval:champion:<cid>`.
    """
    out = []
    for r in records:
        did, cid = r.dialogue["dialogue_id"], r.dialogue["context_id"]
        suffix = f":{old}:{cid}"
        if not did.endswith(suffix):
            raise ValueError(f"{did}: expected a dialogue id ending in {suffix!r}")
        new_id = f"{did.removesuffix(suffix)}:{new}:{cid}"
        out.append(dataclasses.replace(
            r, dialogue={**r.dialogue, "dialogue_id": new_id, "method": new},
            turns=[{**t, "dialogue_id": new_id} for t in r.turns],
            directives=[{**d, "dialogue_id": new_id} for d in r.directives]))
    return out
