"""The persona probe: does an adapter make its persona more recognisable than the base model?

A PAIRED design on held-out contexts: for every (context, persona, seed) the base model (persona
prompt, no adapter) and the adapter (same prompt, same sampling seed) answer the same request, so
each unit yields one difference per measure and the only thing that changes is the adapter. The
95% CI of each mean difference comes from a bootstrap that resamples CONTEXTS (a context's units
share the situation; `stats.paired_cluster_bootstrap`).

Each unit is asked in two formats: `training` (the group-dialogue request the adapters were
trained and evaluated on) and `chat` (the persona's system prompt and the user's message, what
`mascot serve` clients send), reported side by side.

Measures per unit (base and adapter):
- identifiable: a reader names the intended persona (0/1), once per reader of the panel
  (`lib.stage1.readers`; the verdict rule is `lib.stage1.panel`). The readers learn from
  reference utterances written for the probe, never from the cards or the judge's centroids
  (with a reward_reference_share, only from the readers' share: `readers.split_references`).
- consistency, relevance: the embedded judge's scores (1-5), reported beside the classifier
  because they ARE close to the training signal (a gain there alone proves little);
- copied: the reply shares a content 4-gram with its persona card (keyword stuffing);
- identical: the adapter's text equals the base model's (the adapter changed nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from mascot_dag.lib.evaluation.stats import paired_cluster_bootstrap

ARMS = ("base", "adapter")
MEASURES = ("identifiable", "consistency", "relevance", "copied")


@dataclass(frozen=True)
class ProbeUnit:
    """One paired unit: the same request answered by both arms."""

    context_id: str
    persona_id: str
    seed: int


def unit_table(units: Sequence[ProbeUnit], base_texts: Sequence[str],
               adapter_texts: Sequence[str]) -> pl.DataFrame:
    """Long table (context_id, persona_id, seed, arm, text), two rows per unit."""
    if not len(units) == len(base_texts) == len(adapter_texts):
        raise ValueError(f"{len(units)} units but {len(base_texts)} base and "
                         f"{len(adapter_texts)} adapter texts")
    rows = []
    for u, b, a in zip(units, base_texts, adapter_texts, strict=True):
        for arm, text in (("base", b), ("adapter", a)):
            rows.append({"context_id": u.context_id, "persona_id": u.persona_id,
                         "seed": u.seed, "arm": arm, "text": text})
    return pl.DataFrame(rows, schema={"context_id": pl.String, "persona_id": pl.String,
                                      "seed": pl.Int64, "arm": pl.String, "text": pl.String})


def summarise(table, seed: int = 0):
    """Per persona and overall ('all'): mean of every measure per arm, the paired difference
    (adapter - base) with its context-clustered 95% CI, n units / contexts, and the share of
    identical outputs. `table` (polars) has the unit_table columns
    plus one column per measure."""
    t = table
    key = ["context_id", "persona_id", "seed"]
    # One row per unit: each arm's measures side by side (a unit missing an arm keeps nulls).
    sides = [
        t.filter(pl.col("arm") == arm).unique(key, keep="first", maintain_order=True).select(
            *key, pl.col("text").alias(f"text_{arm}"),
            *[pl.col(m).cast(pl.Float64).fill_nan(None).alias(f"{m}_{arm}") for m in MEASURES])
        for arm in ARMS
    ]
    wide = sides[0].join(sides[1], on=key, how="full", coalesce=True).with_columns(
        identical=(pl.col("text_base").str.strip_chars()
                   == pl.col("text_adapter").str.strip_chars()).fill_null(False))
    rows = []
    personas = sorted(wide["persona_id"].unique().to_list())
    groups = [("all", wide)] + [(p, wide.filter(pl.col("persona_id") == p)) for p in personas]
    for persona, g in groups:
        row: dict = {"persona": persona, "n_units": g.height,
                     "n_contexts": g["context_id"].n_unique(),
                     "identical_share": _mean(g["identical"].cast(pl.Float64))}
        for m in MEASURES:
            base, adapted = g[f"{m}_base"], g[f"{m}_adapter"]
            ci = paired_cluster_bootstrap(g["context_id"].to_list(), (adapted - base).to_list(),
                                          seed=seed)
            row |= {f"{m}_base": _mean(base), f"{m}_adapter": _mean(adapted),
                    f"{m}_gain": ci["mean"], f"{m}_lo": ci["lo"], f"{m}_hi": ci["hi"]}
        rows.append(row)
    return pl.DataFrame(rows)


def _mean(values: pl.Series) -> float:
    m = values.mean()
    return float("nan") if m is None else float(m)


@dataclass(frozen=True)
class RosterVerdict:
    """Stage 1's gate over the whole roster (the `roster_fidelity_effect` check)."""

    passed: bool
    gain: float
    lo: float
    hi: float
    n_contexts: int
    n_units: int
    worse: tuple[str, ...]  # personas whose gain CI lies wholly below zero
    description: str


def roster_verdict(summary: pl.DataFrame, personas: Sequence[str],
                   min_contexts: int) -> RosterVerdict:
    """Pass when the POOLED identifiability gain (row 'all' of `summarise`) has a CI above zero on
    >= `min_contexts` contexts and no persona's gain CI lies wholly below zero.

    Why pooled: at 32 contexts a persona's CI is about +-15 points wide, so a true +10 point gain
    passes a per-persona test about half the time; which personas passed changed between identical
    study runs (docs/decisions/0046-stage1-gate-pools-the-roster.md). A gate whose verdict
    is a coin toss blocks
    the evaluation by chance. The per-persona results stay visible (the `fidelity_effect` check,
    as a warning); a persona made significantly WORSE still blocks, since pooling must not hide
    one adapter that damages its voice. Every persona of `personas` must have probe rows."""
    got = set(summary["persona"].to_list()) - {"all"}
    missing = [p for p in personas if p not in got]
    if missing:
        raise ValueError(f"persona_probe has no rows for persona(s) {missing}: materialise "
                         "persona_adapters for them first")
    rows = {r["persona"]: r for r in summary.to_dicts()}
    pooled = rows["all"]
    worse = tuple(p for p in personas if rows[p]["identifiable_hi"] < 0)
    n_ctx = int(pooled["n_contexts"])
    ok_pooled = pooled["identifiable_lo"] > 0 and n_ctx >= min_contexts
    per = ", ".join(f"{p} {rows[p]['identifiable_gain'] * 100:+.1f} "
                    f"[{rows[p]['identifiable_lo'] * 100:+.1f}, "
                    f"{rows[p]['identifiable_hi'] * 100:+.1f}]" for p in personas)
    description = (
        f"pooled identifiability gain (independent classifier) "
        f"{pooled['identifiable_gain'] * 100:+.1f} pts [{pooled['identifiable_lo'] * 100:+.1f}, "
        f"{pooled['identifiable_hi'] * 100:+.1f}] on {n_ctx} held-out contexts "
        f"({int(pooled['n_units'])} paired units); per persona: {per}. Passes when the pooled CI "
        f"excludes zero on >= {min_contexts} contexts and no persona's CI lies below zero"
        + (f"; significantly worse: {', '.join(worse)}" if worse else ""))
    return RosterVerdict(bool(ok_pooled and not worse), float(pooled["identifiable_gain"]),
                         float(pooled["identifiable_lo"]), float(pooled["identifiable_hi"]),
                         n_ctx, int(pooled["n_units"]), worse, description)


FORMATS = ("training", "chat")


UNIT = ["persona_id", "context_id", "seed", "arm", "format"]


def reader_summary(texts: pl.DataFrame, readings: pl.DataFrame, seed: int = 0) -> pl.DataFrame:
    """`probe.summarise` per (reader, format): one row per persona and 'all', with `reader` and
    `format` columns. `texts`: persona_probe rows (arms base and adapter); `readings`:
    probe_readings rows of those texts."""
    parts = []
    for (reader, fmt), part in readings.group_by(["reader", "format"], maintain_order=True):
        t = texts.filter(pl.col("format") == fmt).join(
            part.select(*UNIT, "identifiable"), on=UNIT, how="inner")
        if t.is_empty():
            continue
        parts.append(summarise(t, seed=seed).with_columns(
            reader=pl.lit(str(reader)), format=pl.lit(str(fmt))))
    if not parts:
        raise ValueError("no probe readings match the probe's texts: materialise persona_adapters")
    return pl.concat(parts, how="diagonal_relaxed").sort("reader", "format", maintain_order=True)


def probe_messages(card, context, roster, prompt_style: str, fmt: str) -> tuple:
    """The request of one probe unit in a format (module doc)."""
    from mascot_dag.lib.data.personas import system_prompt
    from mascot_dag.lib.dialogue.engine import (
        context_mode,
        opening_agent_messages,
        opening_history,
    )

    if fmt == "training":
        return tuple(opening_agent_messages(card, context, roster, prompt_style))
    if fmt == "chat":  # the opening the context's mode gives (a meeting: the moderator's query)
        said = opening_history(context, context_mode(context))[0]["text"]
        return ({"role": "system", "content": system_prompt(card, prompt_style, roster)},
                {"role": "user", "content": said})
    raise ValueError(f"unknown probe format {fmt!r}; known: {FORMATS}")


def read_texts(panel, table: pl.DataFrame) -> pl.DataFrame:
    """probe_readings rows: every reader of `panel` [(reader, accuracy)] names the persona of
    every text of `table` (persona_probe rows)."""
    texts = table["text"].to_list()
    parts = []
    for reader, _ in panel:
        predicted = reader.predict(texts)
        parts.append(table.select("persona_id", "context_id", "seed", "arm", "format").with_columns(
            reader=pl.lit(reader.name),
            predicted=pl.Series(predicted, dtype=pl.String),
        ).with_columns(
            identifiable=(pl.col("predicted") == pl.col("persona_id")).fill_null(False)
            .cast(pl.Float64)))
    return pl.concat(parts)


def probe_persona(generate, judge, card, roster, ctxs, arms: dict[str, str], model_version: str,
                  settings, panel) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The paired probe of one persona: base vs each arm's adapter ({arm: adapter name loaded
    in the backend that `generate` calls}) on the same held-out requests and seeds, on `ctxs`,
    in every format of `settings.probe_formats`. `judge` is the panel's training judge (its
    consistency and relevance sit beside the readers); `panel` [(reader, accuracy)] the readers
    (`readers.fitted_panel`, plus the judge reader where there is one); `settings` the
    profile's (prompt style, sampling, probe seeds).
    Returns (the persona_probe rows, the probe_readings rows, the summary table per reader)."""
    from mascot_dag.lib.judges.base import ResponseItem
    from mascot_dag.lib.judges.features import card_grams, copied_grams
    from mascot_dag.lib.types import ChatRequest, SamplingParams

    tables = []
    for fmt in settings.probe_formats:
        units, requests = [], []
        for c in ctxs:
            messages = probe_messages(card, c, roster, settings.prompt_style, fmt)
            for s in range(settings.probe_seeds):
                units.append(ProbeUnit(c.context_id, card.persona_id, s))
                requests.append((messages, SamplingParams(
                    settings.max_new_tokens, settings.temperature, settings.top_p,
                    settings.seed * 7919 + 101 + s)))
        texts = {arm: [r.text for r in generate(
            [ChatRequest(m, sp, adapter) for m, sp in requests])]
            for arm, adapter in {"base": None, **arms}.items()}
        for i, arm in enumerate(arms):
            t = unit_table(units, texts["base"], texts[arm])
            t = t.with_columns(arm=pl.col("arm").replace({"adapter": arm}), format=pl.lit(fmt))
            tables.append(t if i == 0 else t.filter(pl.col("arm") == arm))
    table = pl.concat(tables)
    ctx = {c.context_id: c for c in ctxs}
    scores = judge.score_responses(
        [ResponseItem(ctx[cid].text, card, roster, text, [])
         for cid, text in table.select("context_id", "text").rows()])
    crit = [{s.criterion: s.score for s in ss} for ss in scores]
    grams = card_grams(card)
    replies = table["text"].to_list()
    table = table.with_columns(
        consistency=pl.Series([c.get("consistency") for c in crit], dtype=pl.Float64),
        relevance=pl.Series([c.get("response_relevance") for c in crit], dtype=pl.Float64),
        copied=pl.Series([float(copied_grams(t, grams) > 0) for t in replies], dtype=pl.Float64),
        model_version=pl.when(pl.col("arm") == "base").then(pl.lit("base"))
        .otherwise(pl.lit(model_version)),
    )
    readings = read_texts(panel, table)
    summaries = []
    for arm in arms:
        part = table.filter(pl.col("arm").is_in(["base", arm])).with_columns(
            arm=pl.col("arm").replace({arm: "adapter"}))
        reads = readings.filter(pl.col("arm").is_in(["base", arm])).with_columns(
            arm=pl.col("arm").replace({arm: "adapter"}))
        summ = reader_summary(part, reads, seed=settings.seed).filter(
            pl.col("persona") == card.persona_id)
        if arm != "adapter":
            summ = summ.with_columns(persona=pl.lit(f"{card.persona_id}:{arm}"))
        summaries.append(summ)
    rows = table.select("persona_id", "context_id", "seed", "arm", "format", "model_version",
                        "text", "consistency", "relevance", "copied")
    return rows, readings, pl.concat(summaries)
