"""Stage 2 (group `collaboration`): director-led group dialogues, group judgments, director GRPO."""

import json
from dataclasses import replace

import dagster as dg
import polars as pl

from mascot_dag.assets.common import (
    DUCKDB_POOL,
    TRANSIENT_RETRY,
    base_model_path,
    cluster_tags,
    fingerprint,
    materialized,
    progress,
    table_metadata,
    user_profiles,
)
from mascot_dag.assets.queries import (
    all_contexts,
    dialogue_metadata,
    dialogue_records,
    pick_contexts,
    roster_ids,
    rosters,
    write_dialogues,
)
from mascot_dag.lib.dialogue.director import directive_pattern
from mascot_dag.lib.dialogue.engine import run_dialogues
from mascot_dag.lib.dialogue.rollout import build_specs, records_from_frames
from mascot_dag.lib.dialogue.spec import config_from_settings
from mascot_dag.lib.judges.agreement import agreement, agreement_markdown
from mascot_dag.lib.judges.panel import judge_dialogue_blocks
from mascot_dag.lib.storage.home import Home
from mascot_dag.registry import DIRECTOR_MODEL, attach_personas
from mascot_dag.resources.judge import JudgePanelResource
from mascot_dag.resources.llm import ChatModelResource
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore
from mascot_dag.resources.tracking import MLflowResource

EXPERIMENT = "stage2_collaboration"
ROLLOUT_PREFIX = "rollout"


# persona_roster_probe: Stage 1's gate (its blocking check stops Stage 2 when the roster did not
# become more identifiable)
@dg.asset(op_tags=cluster_tags("group_rollouts"),
          group_name="collaboration", deps=["persona_adapters", "persona_roster_probe", "contexts",
                                            "persona_cards"],
          kinds={"duckdb", "pytorch"}, pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY)
def group_rollouts(
    store: DuckDBStore, chat: ChatModelResource, tracking: MLflowResource, settings: LineageSettings
) -> dg.MaterializeResult:
    """Director + aligned agents (+ simulated MBTI users in support mode) on train contexts."""
    roster = rosters(store)
    specs = build_specs(pick_contexts(store, "train", settings.rollout_dialogues), roster,
                        user_profiles(), settings.agent_turns, ROLLOUT_PREFIX, settings.seed)
    adapters, versions = attach_personas(chat, tracking, roster_ids(roster))
    config = config_from_settings(settings, persona_adapters=adapters)
    records = run_dialogues(specs, chat.backend(), config, stage="rollout", method="mascot")
    d, t, x = write_dialogues(store, records, ROLLOUT_PREFIX)
    return materialized(metadata=dialogue_metadata(
        d, t, x, persona_adapter_versions=versions,
        fallback_rate=float((x["status"] == "fallback").mean()) if len(x) else 0.0))


@dg.asset(op_tags=cluster_tags("group_judgments"),
          group_name="collaboration", deps=[group_rollouts], kinds={"duckdb"},
          pool=DUCKDB_POOL, retry_policy=TRANSIENT_RETRY)
def group_judgments(
    store: DuckDBStore, judges: JudgePanelResource, settings: LineageSettings
) -> dg.MaterializeResult:
    """Collective rubric (4 criteria, 1-5) per N-turn block of every rollout dialogue, by every
    judge of the panel."""
    ctx = {cid: c.text for cid, c in all_contexts(store).items()}
    df = judge_dialogue_blocks(judges.judges(), dialogue_records(store, ROLLOUT_PREFIX), ctx,
                               rosters(store), settings.block_size)
    store.replace("group_judgments", df, "dialogue_id LIKE ?", [f"{ROLLOUT_PREFIX}:%"])
    means = (df.filter(pl.col("status") == "ok").group_by("judge", "criterion")
             .agg(pl.col("score").mean()).sort("judge", "criterion"))
    failure = df.group_by("judge").agg((pl.col("status") == "failed").mean()).sort("judge")
    return materialized(metadata=table_metadata(
        df.select("dialogue_id", "block_idx", "criterion", "score"),
        blocks=df.select("dialogue_id", "block_idx").unique().height,
        mean_by_criterion={f"{j}/{c}": round(v, 3) for j, c, v in means.rows() if v is not None},
        failure_rate=float((df["status"] == "failed").mean()) if len(df) else 0.0,
        failure_rate_by_judge=dict(failure.rows()),
        judge_agreement=dg.MetadataValue.md(agreement_markdown(
            agreement(df, ["dialogue_id", "block_idx"], value="score"))),
    ))


def director_training(settings: LineageSettings, max_completion_length: int, cards: list):
    """(GRPOSettings, LoraSettings) of the director: the persona GRPO's, with director_steps and
    the director's own learning rate / LoRA targets where set (None = shared with the personas).
    The directive budget is the one it has in dialogues; `cards` (every roster it directs, from
    the store) are the speakers its structured-output regex allows."""
    from mascot_dag.lib.training.config import grpo_settings, lora_settings

    gs = replace(grpo_settings(settings, max_completion_length), max_steps=settings.director_steps)
    if settings.director_learning_rate is not None:
        gs = replace(gs, learning_rate=settings.director_learning_rate)
    if settings.director_structured:
        gs = replace(gs, structured_regex=directive_pattern(cards))
    lora = lora_settings(settings)
    if settings.director_lora_targets:
        targets = tuple(t.strip() for t in settings.director_lora_targets.split(",") if t.strip())
        lora = replace(lora, target_modules=targets)
    return gs, lora


@dg.asset(op_tags=cluster_tags("director_adapter"),
          group_name="collaboration", deps=[group_judgments], kinds={"pytorch", "mlflow"},
          retry_policy=TRANSIENT_RETRY)
def director_adapter(
    context: dg.AssetExecutionContext,
    store: DuckDBStore,
    chat: ChatModelResource,
    judges: JudgePanelResource,
    tracking: MLflowResource,
    settings: LineageSettings,
) -> dg.MaterializeResult:
    """GRPO LoRA for the director: each sampled directive is rolled out `director_reward_horizon`
    turns and rewarded by the group judge on the resulting block, plus a format reward for valid
    directives."""
    from mascot_dag.lib.stage2.director_reward import (
        DirectiveFormatReward,
        GroupBlockReward,
        director_states,
    )
    from mascot_dag.lib.training.common import lora_relative_change
    from mascot_dag.lib.training.grpo import train_grpo_adapter

    like = [f"{ROLLOUT_PREFIX}:%"]
    dialogues = store.frame("SELECT * FROM dialogues WHERE dialogue_id LIKE ?", like)
    turns = store.frame("SELECT * FROM turns WHERE dialogue_id LIKE ?", like)
    records = records_from_frames(dialogues, turns, turns.clear())
    roster = rosters(store)
    specs = {s.dialogue_id: s for s in build_specs(
        pick_contexts(store, "train", settings.rollout_dialogues), roster, user_profiles(),
        settings.agent_turns, ROLLOUT_PREFIX, settings.seed)}
    records = [r for r in records if r.dialogue["dialogue_id"] in specs]
    states = director_states(records, specs)
    if not states:
        raise ValueError("no director decision points in the rollouts: materialise group_rollouts")
    adapters, versions = attach_personas(chat, tracking, roster_ids(roster))
    config = config_from_settings(settings, persona_adapters=adapters)
    horizon = settings.director_reward_horizon
    # the group reward is the panel's training judge (settings: judges.training_judge)
    rewards = [GroupBlockReward(states, chat.backend().generate, judges.training(), config,
                                settings.block_size, horizon),
               DirectiveFormatReward(states, config.no_repeat)]
    weights = [1.0, settings.format_reward_weight]
    gs, lora = director_training(settings, config.max_new_tokens_director,
                                 roster["support"] + roster["workplace"])
    base = base_model_path(chat)
    prompts = [s.messages for s in states]
    out = Home.from_env().checkpoints / "director_adapter" / fingerprint(
        base, prompts, versions, gs, lora, horizon)
    name = tracking.run_name("director", "GRPO", lora_r=lora.r, steps=gs.max_steps,
                             extra=[f"{len(states)} decision points"], base=base)
    with tracking.start_run(EXPERIMENT, name, {"asset": "director_adapter"},
                            description=tracking.training_note(gs.max_steps)) as run:
        tracking.log_params({"base_model": base, "states": len(states), **gs.__dict__,
                             "group_judge": rewards[0].judge.name,
                             "persona_adapter_versions": versions, "lora": lora.__dict__,
                             "reward_weights": weights, "director_reward_horizon": horizon})
        result = train_grpo_adapter(base, prompts, rewards, weights, gs, lora, out,
                                    callbacks=[progress(context, "GRPO director")])
        tracking.log_curves({"reward": result.reward_curve, "kl": result.kl_curve,
                              "loss": result.loss_curve, **result.reward_func_curves})
        tracking.log_adapter(result.adapter_dir)
        # how far the steps moved the weights: ~1e-4 changes no sampled directive (see
        # lora_relative_change), so a director "trained" that little is the base director
        moved = lora_relative_change(result.adapter_dir, base)
        tracking.log_curve("lora_delta_relative", [(result.steps, moved)])
        version = tracking.register_version(DIRECTOR_MODEL, run,
                                            tags={"persona_versions": json.dumps(versions)})
    nan = float("nan")
    return materialized(metadata={
        "mlflow_run_id": run.info.run_id,
        "model_version": f"{DIRECTOR_MODEL}/{version}",
        "decision_points": len(states),
        "trainable_percent": result.trainable_percent,
        "lora_delta_relative": moved,
        "steps": result.steps,
        "mean_reward_start": result.reward_start if result.reward_start is not None else nan,
        "mean_reward_end": result.reward_end if result.reward_end is not None else nan,
        "seconds_per_step": result.seconds_per_step or nan,
    })


@dg.asset_check(asset=group_rollouts, blocking=True,
                description="Every agent turn of the Stage 2 rollouts has its director's "
                            "directive (the director's reward is computed per directive); "
                            "blocks the director's training.")
def group_rollouts_directive_every_agent_turn_check(store: DuckDBStore) -> dg.AssetCheckResult:
    missing = store.frame(
        "SELECT count(*) AS n FROM turns t LEFT JOIN directives d USING (dialogue_id, turn_idx) "
        "WHERE t.role = 'agent' AND t.dialogue_id LIKE 'rollout:%' AND d.speaker IS NULL"
    )["n"].item()
    return dg.AssetCheckResult(passed=int(missing) == 0,
                               metadata={"agent_turns_without_directive": int(missing)})
