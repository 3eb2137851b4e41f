"""Stage 1 data (group `feedback`): candidates -> agent-level judgments -> preference pairs.

All three are partitioned by persona, with a single-run backfill policy: a backfill of every
persona ("Materialize all") is ONE run of all three over the persona range (Dagster groups
persona_judgments with every candidate partition it reads because both have the policy), so the
models load once instead of once per persona and partition group; materialised alone (the
`stage1_job`, one partition) an asset handles just that persona. Candidates are sampled on the
prompt the agents serve in (`lib.dialogue.opening_agent_messages`) from the supervised policy
pi_SFT (`policy_sft`), with the candidate prompt style (few-shot by default). With
`cross_persona_pairs`, persona p's judgments score the candidates of EVERY persona for the train
contexts AS p, so its pairs can put another persona's voice on the rejected side
(lib/stage1/preferences.py).
"""

import dagster as dg
import polars as pl

from mascot_dag.assets.common import (
    DUCKDB_POOL,
    PERSONA_BACKFILL,
    TRANSIENT_RETRY,
    cluster_tags,
    input_errors_fail_at_once,
    materialized,
    persona_partitions,
    persona_rows,
    quiet_backfill_policy_beta,
    table_metadata,
)
from mascot_dag.assets.queries import NoModeContexts, persona_roster, train_contexts
from mascot_dag.lib.dialogue.engine import opening_agent_messages
from mascot_dag.lib.evaluation.stats import describe
from mascot_dag.lib.judges.agreement import agreement, agreement_markdown
from mascot_dag.lib.judges.base import ResponseItem
from mascot_dag.lib.judges.panel import training_judgments
from mascot_dag.lib.llm.cache import CachedChat
from mascot_dag.lib.stage1.preferences import candidate_id, candidate_seed, make_pairs, mean_scores
from mascot_dag.lib.storage.tables import score_rows
from mascot_dag.lib.types import ChatRequest, SamplingParams
from mascot_dag.registry import adapter_runs
from mascot_dag.resources.judge import JudgePanelResource
from mascot_dag.resources.llm import ChatModelResource
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore
from mascot_dag.resources.tracking import MLflowResource

# the `judgments` rows persona_judgments writes (score NULL where a judge failed)
JUDGMENT_SCHEMA = {"target_id": pl.String, "persona_id": pl.String, "judge": pl.String,
                   "criterion": pl.String, "score": pl.Float64, "rationale": pl.String,
                   "status": pl.String, "raw_output": pl.String}

def policy_adapter(chat: ChatModelResource, tracking, settings: LineageSettings) -> str | None:
    """The chat adapter name of pi_SFT (loaded into the backend), or None for policy_init=base."""
    if settings.policy_init == "base":
        return None
    from mascot_dag.registry import attach_policy_sft

    return attach_policy_sft(chat, tracking, "policy_init='sft' (or set policy_init='base')")


quiet_backfill_policy_beta()

@dg.asset(
    op_tags=cluster_tags("candidate_responses"),
    group_name="feedback",
    partitions_def=persona_partitions,
    deps=["contexts", "persona_prompts", "policy_sft"],
    backfill_policy=PERSONA_BACKFILL,
    kinds={"duckdb", "pytorch"},
    pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY,
)
def candidate_responses(
    context: dg.AssetExecutionContext,
    store: DuckDBStore,
    chat: ChatModelResource,
    tracking: MLflowResource,
    settings: LineageSettings,
) -> dg.MaterializeResult:
    """K sampled responses per (train context, persona) from pi_SFT (cached in DuckDB), for each
    persona of the run (one batch: the seeds are per persona and sample, not per batch), on the
    train contexts of the mode its set speaks in (meetings for the workplace set), beside its own
    set's roster."""
    personas = context.partition_keys
    rosters = {p: persona_roster(store, p) for p in personas}
    with input_errors_fail_at_once(NoModeContexts):  # a trained set with no contexts of its mode
        ctxs_of = {p: train_contexts(store, settings, rosters[p][0].persona_set)
                   for p in personas}
    adapter = policy_adapter(chat, tracking, settings)
    requests, meta = [], []
    for persona in personas:
        roster = rosters[persona]
        index = [c.persona_id for c in roster].index(persona)
        card = roster[index]
        for c in ctxs_of[persona]:
            messages = tuple(opening_agent_messages(card, c, roster,
                                                    settings.candidate_prompt_style))
            for k in range(settings.k_candidates):
                seed = candidate_seed(settings.seed, index, k)
                sampling = SamplingParams(settings.max_new_tokens, settings.temperature,
                                          settings.top_p, seed)
                requests.append(ChatRequest(messages, sampling, adapter))
                meta.append((persona, c.context_id, k, seed))
    cached = CachedChat(chat.backend(), store.db_path, chat.model_name,
                        adapter_runs(tracking, [adapter]))
    results = cached.generate(requests)
    df = pl.DataFrame(
        [
            {"candidate_id": candidate_id(cid, persona, k), "context_id": cid,
             "persona_id": persona,
             "sample_idx": k, "prompt_style": settings.candidate_prompt_style,
             "model": f"{chat.model_name}+{adapter}" if adapter else chat.model_name,
             "text": r.text, "completion_tokens": r.completion_tokens, "seed": seed}
            for (persona, cid, k, seed), r in zip(meta, results, strict=True)
        ],
        infer_schema_length=None,
    )
    store.replace("candidates", df, *persona_rows(personas))
    used = {c.context_id: c.source for p in personas for c in ctxs_of[p]}
    return materialized(
        metadata=table_metadata(
            df.select("candidate_id", "text", "completion_tokens"),
            personas=list(personas),
            contexts=len(used),
            # which mode's contexts each set was sampled on (qmsum: meetings)
            contexts_by_source={src: list(used.values()).count(src)
                                for src in sorted(set(used.values()))},
            policy=adapter or "base",
            cache_hits=cached.hits,
            cache_misses=cached.misses,
            mean_completion_tokens=float(df["completion_tokens"].mean()),
            empty_texts=int((df["text"].str.strip_chars() == "").sum()),
        )
    )

@dg.asset(
    op_tags=cluster_tags("persona_judgments"),
    group_name="feedback",
    partitions_def=persona_partitions,
    # every persona's candidates: with cross_persona_pairs this persona judges all of them
    deps=[dg.AssetDep(candidate_responses, partition_mapping=dg.AllPartitionMapping())],
    backfill_policy=PERSONA_BACKFILL,
    kinds={"duckdb"},
    pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY,
)
def persona_judgments(
    context: dg.AssetExecutionContext,
    store: DuckDBStore,
    judges: JudgePanelResource,
    settings: LineageSettings,
) -> dg.MaterializeResult:
    """Agent-level rubric scores (5 criteria, 1-5) of the candidates judged AS each persona of
    the run (with cross_persona_pairs: every persona's candidates) by every judge of the panel,
    long format, one row per judge."""
    personas = context.partition_keys
    items, targets = [], []  # one judging call per judge for the whole run
    for persona in personas:
        roster = persona_roster(store, persona)  # its own set: the pool holds its roster only
        judged = [c.persona_id for c in roster] if settings.cross_persona_pairs else [persona]
        cands = store.frame(
            "SELECT c.candidate_id, c.text, x.text AS context_text FROM candidates c "
            f"JOIN contexts x USING (context_id) WHERE c.persona_id IN "
            f"({', '.join('?' * len(judged))}) ORDER BY c.candidate_id", judged)
        if cands.is_empty():
            raise ValueError(
                f"no candidates for persona {persona}: materialise candidate_responses")
        card = next(c for c in roster if c.persona_id == persona)
        items += [ResponseItem(ctx_text, card, roster, text, [])
                  for ctx_text, text in cands.select("context_text", "text").iter_rows()]
        targets += [(cid, persona) for cid in cands["candidate_id"]]
    rows = []
    for j in judges.judges():
        for (cid, persona), scores in zip(targets, j.score_responses(items), strict=True):
            rows += score_rows(scores, target_id=cid, persona_id=persona, judge=j.name)
    df = pl.DataFrame(rows, schema=JUDGMENT_SCHEMA)
    # every judge's rows of these personas at once: a judge dropped from the panel leaves none
    store.replace("judgments", df, *persona_rows(personas))
    failure = df.group_by("judge").agg((pl.col("status") == "failed").mean()).sort("judge")
    means = (df.filter(pl.col("status") == "ok").group_by("judge", "criterion")
             .agg(pl.col("score").mean()).sort("judge", "criterion"))
    return materialized(
        metadata=table_metadata(
            df.select("target_id", "judge", "criterion", "score", "rationale"),
            personas=list(personas),
            judges=sorted(df["judge"].unique().to_list()),
            training_judge=judges.training_judge,
            failure_rate_by_judge=dict(failure.rows()),
            mean_score_by_criterion={f"{j}/{c}": round(v, 3) for j, c, v in means.rows()
                                     if v is not None},
            judge_agreement=dg.MetadataValue.md(agreement_markdown(
                agreement(df, ["target_id", "persona_id"], value="score"))),
        )
    )

@dg.asset(
    op_tags=cluster_tags("persona_preference_pairs"),
    group_name="feedback",
    partitions_def=persona_partitions,
    deps=[persona_judgments],
    backfill_policy=PERSONA_BACKFILL,
    kinds={"duckdb"},
    pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY,
)
def persona_preference_pairs(
    context: dg.AssetExecutionContext, store: DuckDBStore, judges: JudgePanelResource,
    settings: LineageSettings,
) -> dg.MaterializeResult:
    """Chosen/rejected pairs of one context for each persona of the run, persona-weighted score
    gap >= delta (lib/stage1/preferences.py: the pool holds every persona's candidates with
    cross_persona_pairs), ranked on the panel's training judge (lib/judges/panel.py)."""
    personas = context.partition_keys
    per_persona, cross_rejected = [], 0
    for persona in personas:
        # the pool: its own set's candidates (cross_persona_pairs), else its own
        pool = ([c.persona_id for c in persona_roster(store, persona)]
                if settings.cross_persona_pairs else [persona])
        cands = store.frame(
            "SELECT candidate_id, context_id, persona_id FROM candidates WHERE persona_id IN "
            f"({', '.join('?' * len(pool))})", pool)
        judg = training_judgments(store.frame("SELECT * FROM judgments WHERE persona_id = ?",
                                              [persona]), judges.training_judge)
        scores = mean_scores(judg, settings.persona_score_weight)
        pairs = make_pairs(cands, scores, settings.preference_delta, persona=persona,
                           max_per_context=settings.max_pairs_per_context)
        if pairs.is_empty():
            context.log.warning(
                f"{persona}: no candidate pair differs by >= {settings.preference_delta}")
        cross_rejected += int(
            (~pairs["rejected_id"].str.contains(f"|{persona}|", literal=True)).sum())
        per_persona.append(pairs)
    pairs = pl.concat(per_persona)
    store.replace("preference_pairs", pairs, *persona_rows(personas))
    margins = {k: round(v, 3) for k, v in describe(pairs["margin"].to_list()).items()}
    return materialized(
        metadata=table_metadata(
            pairs.select("pair_id", "chosen_id", "rejected_id", "margin"),
            personas=list(personas),
            pairs=len(pairs),
            delta=settings.preference_delta,
            training_judge=judges.training_judge,
            margin_distribution={k: float(v) for k, v in margins.items()},
            # (persona, context) pools that gave a pair: per persona, contexts with pairs
            contexts_with_pairs=pairs.select("persona_id", "context_id").n_unique(),
            cross_persona_rejected=cross_rejected,
        )
    )

@dg.asset_check(asset=persona_preference_pairs, blocking=True,
                description="Every preference pair's score margin is at least "
                            "preference_delta and chosen differs from rejected; blocks the "
                            "reward model's training.")
def persona_preference_pairs_margin_check(
    context: dg.AssetCheckExecutionContext, store: DuckDBStore, settings: LineageSettings
) -> dg.AssetCheckResult:
    bad = store.frame(
        "SELECT count(*) AS n FROM preference_pairs WHERE margin < ? OR chosen_id = rejected_id",
        [settings.preference_delta - 1e-9],
    )["n"].item()
    return dg.AssetCheckResult(passed=int(bad) == 0, metadata={"pairs_below_delta": int(bad)})
