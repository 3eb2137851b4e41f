"""Stage 1's persona adapters (group `persona_alignment`): warm start + GRPO per persona; pi_SFT
and the reward model are in reward_model.py, the probe that checks the adapters in probe.py.

One LoRA adapter carries a persona through every step: pi_SFT (SFT on the training listener turns,
the paper's supervised base policy) -> persona warm start (SFT on this persona's best-judged
candidates; `warm_start_steps`, 0 = off) -> GRPO on reward model + format reward (+ the novelty
reward against the other agents' earlier turns when `group_history_turns` > 0, see
lib/stage1/group_history.py). Each step continues the previous adapter's weights, and the adapter
serves
as one.

All log params, curves and adapters to MLflow and register model versions; checkpoints sit in
MASCOT_HOME/checkpoints/<asset>/<fingerprint of data+settings>, so an interrupted run resumes.
"""

import functools
import time
from dataclasses import dataclass, replace

import dagster as dg
import polars as pl

from mascot_dag.assets.common import (
    PERSONA_BACKFILL,
    STAGE1_EXPERIMENT,
    TRANSIENT_RETRY,
    base_model_path,
    cluster_tags,
    fingerprint,
    input_errors_fail_at_once,
    markdown_table,
    materialized,
    nan_if_none,
    persona_partitions,
    progress,
    quiet_backfill_policy_beta,
)
from mascot_dag.assets.queries import (
    NoModeContexts,
    all_contexts,
    persona_roster,
    persona_set_contexts,
    train_contexts,
)
from mascot_dag.lib.dialogue.engine import opening_agent_messages
from mascot_dag.lib.evaluation.stats import MIN_CLUSTERS_FOR_SIGNIFICANCE
from mascot_dag.lib.judges.panel import MEAN, training_judgments
from mascot_dag.lib.stage1 import probe
from mascot_dag.lib.stage1.group_history import candidate_pools
from mascot_dag.lib.stage1.group_history import group_prompts as build_group_prompts
from mascot_dag.lib.stage1.panel import persona_verdict
from mascot_dag.lib.stage1.preferences import (
    best_per_context,
    mean_scores,
    persona_tag,
    reward_messages,
)
from mascot_dag.lib.stage1.readers import NoReferenceUtterances
from mascot_dag.lib.storage.home import Home
from mascot_dag.lib.training.common import lora_relative_change
from mascot_dag.lib.training.config import grpo_settings, lora_settings, sft_settings
from mascot_dag.registry import POLICY_SFT_MODEL, fetch, persona_model
from mascot_dag.registry import REWARD_MODEL as REWARD_MODEL_NAME
from mascot_dag.resources.judge import JudgePanelResource
from mascot_dag.resources.llm import ChatModelResource
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore
from mascot_dag.resources.tracking import MLflowResource

quiet_backfill_policy_beta()


@functools.lru_cache(maxsize=1)
def _reward_scorer(base: str, rm_dir: str):
    """One loaded reward model per process and version: the demo trains every persona's adapter
    in the same process, one partition run after another, against the same RM version."""
    from mascot_dag.lib.training.reward_model import RewardScorer

    return RewardScorer(base, rm_dir)


quiet_backfill_policy_beta()



def group_prompts(store: DuckDBStore, settings: LineageSettings, card, roster,
                  ctxs) -> tuple[list[list[dict]], list[str]]:
    """The GRPO prompts of one persona and their `earlier_turns` column
    (lib.group_history.group_prompts), the other personas' candidates read from the store (its
    own roster's: group-history turns come from the same set)."""
    pools = {}
    if settings.group_history_turns > 0:
        ids = [c.persona_id for c in roster]
        pools = candidate_pools(store.frame(
            "SELECT context_id, persona_id, text FROM candidates WHERE persona_id IN "
            f"({', '.join('?' * len(ids))}) ORDER BY context_id, persona_id, sample_idx",
            ids).rows())
    return build_group_prompts(card, roster, ctxs, settings.prompt_style,
                               settings.group_history_turns, settings.seed, pools)


def warm_start_examples(store: DuckDBStore, settings: LineageSettings, card, roster,
                        training_rule: str = MEAN) -> list[dict]:
    """SFT targets of the persona warm start: per train context, the candidate (of any persona's
    prompt) that the training judge scored best AS this persona, under the prompt the adapter
    serves in."""
    persona = card.persona_id
    ids = [c.persona_id for c in roster]  # its own set's candidates
    cands = store.frame("SELECT candidate_id, context_id, persona_id, text FROM candidates "
                        f"WHERE persona_id IN ({', '.join('?' * len(ids))})", ids)
    judg = training_judgments(store.frame("SELECT * FROM judgments WHERE persona_id = ?",
                                          [persona]), training_rule)
    best = best_per_context(cands, mean_scores(judg, settings.persona_score_weight), persona)
    text = dict(cands.select("candidate_id", "text").rows())
    ctx = all_contexts(store)
    return [
        {"messages": [*opening_agent_messages(card, ctx[cid], roster, settings.prompt_style),
                      {"role": "assistant", "content": text[r]}]}
        for r, cid in best.select("candidate_id", "context_id").rows() if text[r].strip()
    ]


@dg.asset(
    op_tags=cluster_tags("persona_adapters"),
    group_name="persona_alignment",
    partitions_def=persona_partitions,
    deps=["persona_reward_model", "policy_sft"],
    # a backfill of every persona is one run: the process, the chat model and the reward model
    # load once for the roster (assets/common.PERSONA_BACKFILL)
    backfill_policy=PERSONA_BACKFILL,
    kinds={"pytorch", "mlflow"},
    # Not in the `duckdb` pool: the pool holds a slot for the whole step, and this step trains
    # for minutes before one short write (the probe's persona_probe rows, one transaction).
    # Holding the slot serialised the personas' training on a cluster; the write is kept apart
    # by DuckDB's single-writer lock, which `lib/db.connect` waits on (docs/DESIGN.md "Past one
    # machine").
    retry_policy=TRANSIENT_RETRY,
    check_specs=[dg.AssetCheckSpec(
        "fidelity_effect", asset="persona_adapters",
        description="Each persona's own probe under the panel's rule (a warning: one persona's "
                    "CI is too wide to block on; persona_roster_probe's pooled check is the "
                    "gate).")],
)
def persona_adapters(
    context: dg.AssetExecutionContext,
    store: DuckDBStore,
    chat: ChatModelResource,
    judges: JudgePanelResource,
    tracking: MLflowResource,
    settings: LineageSettings,
) -> dg.MaterializeResult:
    """Each persona's LoRA adapter (one per partition of the run): pi_SFT -> warm start (SFT) ->
    GRPO on reward model + format reward, then the paired persona probe on held-out contexts
    (the `fidelity_effect` check: one result per run, a line per persona). Each persona trains
    beside its own set's roster on the contexts of the mode that set speaks in."""
    rosters = {p: persona_roster(store, p) for p in context.partition_keys}
    with input_errors_fail_at_once(NoModeContexts):  # a trained set with no contexts of its mode
        ctxs_of = {p: train_contexts(store, settings, r[0].persona_set)
                   for p, r in rosters.items()}
    rm_version = tracking.latest_version(REWARD_MODEL_NAME)
    if rm_version is None:
        raise ValueError(f"no {REWARD_MODEL_NAME} in MLflow: materialise persona_reward_model")
    base = base_model_path(chat)
    scorer = _reward_scorer(base, str(fetch(tracking, REWARD_MODEL_NAME, rm_version)))
    init = None
    if settings.policy_init == "sft":
        sft_version = tracking.latest_version(POLICY_SFT_MODEL)
        if sft_version is None:
            raise ValueError(f"no {POLICY_SFT_MODEL} in MLflow: materialise policy_sft")
        init = fetch(tracking, POLICY_SFT_MODEL, sft_version)
    trained = {}
    for persona in context.partition_keys:
        roster = rosters[persona]
        card = next(c for c in roster if c.persona_id == persona)
        trained[persona] = train_persona_adapter(
            context, store, chat, judges, tracking, settings,
            AdapterInputs(card, roster, ctxs_of[persona], base, rm_version, scorer, init))
    if len(trained) == 1:  # one partition: the persona's own metadata and check, unprefixed
        ((_, (metadata, check)),) = trained.items()
        return materialized(metadata=metadata, check_results=[check])
    checks = {p: check for p, (_, check) in trained.items()}
    return materialized(
        metadata={f"{p}/{k}": v for p, (meta, _) in trained.items() for k, v in meta.items()},
        check_results=[dg.AssetCheckResult(
            check_name="fidelity_effect",
            passed=all(c.passed for c in checks.values()),
            severity=dg.AssetCheckSeverity.WARN,
            description="\n".join(f"{p}: {c.description}" for p, c in checks.items()),
            metadata={f"{p}/{k}": v for p, c in checks.items() for k, v in c.metadata.items()},
        )],
    )


@dataclass(frozen=True)
class AdapterInputs:
    """What every persona adapter of a run shares: roster, train contexts, base model, the
    reward model's version and loaded scorer, and pi_SFT's adapter to start from (or None)."""

    card: object
    roster: list
    ctxs: list
    base: str
    rm_version: str
    scorer: object
    init: object


def train_persona_adapter(context, store: DuckDBStore, chat: ChatModelResource,
                          judges: JudgePanelResource, tracking: MLflowResource,
                          settings: LineageSettings, inputs: AdapterInputs):
    """One persona's adapter, registered, and its probe: (metadata, fidelity_effect result)."""
    from mascot_dag.lib.stage1.rewards import (
        format_reward,
        judge_consistency_reward,
        novelty_reward,
        reward_model_reward,
    )
    from mascot_dag.lib.training.grpo import train_grpo_adapter
    from mascot_dag.lib.training.sft import fitting_max_length, train_sft_adapter

    card, roster, ctxs, base = inputs.card, inputs.roster, inputs.ctxs, inputs.base
    rm_version, init = inputs.rm_version, inputs.init
    persona = card.persona_id
    # The adapter learns on the requests it serves in (lib.dialogue.agent_messages): the opening,
    # and with group_history_turns also after other agents' turns (lib/stage1/group_history.py).
    prompts, earlier = group_prompts(store, settings, card, roster, ctxs)
    # The reward model reads its own short form of each prompt (a dataset column TRL passes on).
    reward_prompts = [reward_messages(persona_tag(card), c) for c in ctxs]
    home = Home.from_env()
    others = [c.name for c in roster if c.persona_id != persona]
    rewards = [reward_model_reward(inputs.scorer), format_reward(other_names=others)]
    weights = [settings.reward_model_weight, settings.format_reward_weight]
    columns = {"reward_prompt": reward_prompts}
    if settings.judge_reward_weight > 0:
        rewards.append(judge_consistency_reward(judges.training(), card, roster))
        weights.append(settings.judge_reward_weight)
        columns["context_text"] = [c.text for c in ctxs]
    if settings.novelty_reward_weight > 0:
        rewards.append(novelty_reward())
        weights.append(settings.novelty_reward_weight)
        columns["earlier_turns"] = earlier
        if settings.novelty_ignores_context:
            columns["shared_context"] = [c.text for c in ctxs]
    lora = lora_settings(settings)
    ckpt = home.checkpoints / "persona_adapters" / persona
    name = persona_model(persona)
    timings = {}
    warm_start = ([f"after {settings.warm_start_steps} SFT warm-start steps"]
                  if settings.warm_start_steps > 0 else [])
    run_name = tracking.run_name(persona, "GRPO", lora_r=lora.r, steps=settings.grpo_steps,
                                 extra=[f"{len(prompts)} prompts", *warm_start], base=base)
    with tracking.start_run(STAGE1_EXPERIMENT, run_name,
                            {"asset": "persona_adapters", "persona": persona},
                            description=tracking.training_note(settings.grpo_steps)) as run:
        warm_dir = None
        if settings.warm_start_steps > 0:
            t0 = time.monotonic()
            examples = warm_start_examples(store, settings, card, roster, judges.training_judge)
            ws = sft_settings(settings, settings.warm_start_steps,
                              settings.warm_start_learning_rate)
            # whole examples: a meeting's prompt is longer than the default max_length
            ws = replace(ws, max_length=fitting_max_length(base, examples, ws.max_length))
            warm = train_sft_adapter(
                base, examples, ws, lora,
                ckpt / "warm_start" / fingerprint(base, examples, ws, lora, str(init)),
                init_adapter=init, callbacks=[progress(context, f"warm start {persona}")])
            tracking.log_curves({"warm_start_loss": warm.loss_curve})
            warm_dir = init = warm.adapter_dir
            timings["warm_start_s"] = time.monotonic() - t0
        gs = grpo_settings(settings, settings.grpo_completion_tokens)
        t0 = time.monotonic()
        tracking.log_params({"base_model": base, "persona": persona, "prompts": len(prompts),
                             "reward_model_version": rm_version, "reward_weights": weights,
                             "reward_funcs": [r.__name__ for r in rewards],
                             "group_history_turns": settings.group_history_turns,
                             "novelty_ignores_context": settings.novelty_ignores_context,
                             "prompts_with_group_history": sum(e != "[]" for e in earlier),
                             "policy_init": settings.policy_init,
                             "warm_start_steps": settings.warm_start_steps,
                             **gs.__dict__, "lora": lora.__dict__})
        result = train_grpo_adapter(
            base, prompts, rewards, weights, gs, lora,
            # the reward inputs (dataset columns) are part of what a checkpoint was trained on
            ckpt / "grpo" / fingerprint(base, prompts, rm_version, gs, lora, weights, str(init),
                                        sorted(columns)),
            columns=columns, init_adapter=init,
            callbacks=[progress(context, f"GRPO {persona}")])
        timings["grpo_s"] = time.monotonic() - t0
        tracking.log_curves({"reward": result.reward_curve, "kl": result.kl_curve,
                               "loss": result.loss_curve, **result.reward_func_curves})
        moved = lora_relative_change(result.adapter_dir, base)
        tracking.log_adapter(result.adapter_dir)
        version = tracking.register_version(name, run, tags={"persona": persona,
                                                             "reward_model_version": rm_version})
        t0 = time.monotonic()
        arms = {"adapter": (result.adapter_dir, f"{name}@v{version}")}
        if warm_dir is not None and settings.probe_warm_start:
            arms["warm_start"] = (warm_dir, f"{name}@v{version}-warm")
        backend = chat.backend()
        for adapter_dir, adapter_name in arms.values():
            backend.add_adapter(adapter_name, str(adapter_dir))
        try:
            panel = judges.probe_panel(card.persona_set, roster, settings.seed,
                                       settings.reward_reference_share)
        except NoReferenceUtterances as e:  # a user's set without probe/<set>.yaml: no reader
            timings["probe_s"] = 0.0
            return _unprobed(run.info.run_id, f"{name}/{version}", result, moved, timings,
                             f"{persona}: {e}")
        with input_errors_fail_at_once(NoModeContexts):
            ctxs = persona_set_contexts(store, settings, "eval", settings.probe_contexts,
                                        card.persona_set)
        rows, readings, summary = probe.probe_persona(
            backend.generate, judges.training(), card, roster, ctxs,
            {arm: adapter_name for arm, (_, adapter_name) in arms.items()}, f"{name}/{version}",
            settings, panel)
        accuracies = {reader.name: acc for reader, acc in panel}
        # texts, readings and the readers' validity change together: a reader's rows never
        # outlive the texts they read
        store.replace_many([
            ("persona_probe", rows, "persona_id = ?", [persona]),
            ("probe_readings", readings, "persona_id = ?", [persona]),
            ("probe_readers", pl.DataFrame({
                "persona_set": card.persona_set, "reader": list(accuracies),
                "accuracy": list(accuracies.values())}),
             "persona_set = ?", [card.persona_set]),
        ])
        timings["probe_s"] = time.monotonic() - t0
        verdict = persona_verdict(summary, accuracies, persona, MIN_CLUSTERS_FOR_SIGNIFICANCE)
        tracking.log_params({"probe_readers": ", ".join(
            f"{r}={a:.3f}" for r, a in accuracies.items())})
        tracking.log_metrics({f"probe_{r['reader']}_{r['format']}_identifiable_gain":
                              r["identifiable_gain"] for r in summary.filter(
                                  pl.col("persona") == persona).to_dicts()})
    effect = {"identifiable_gain": verdict.gain, "identifiable_lo": verdict.lo,
              "identifiable_hi": verdict.hi, "n_contexts": verdict.n_contexts,
              "n_units": verdict.n_units}
    return (
        {
            "mlflow_run_id": run.info.run_id,
            "model_version": f"{name}/{version}",
            "trainable_percent": result.trainable_percent,
            "steps": result.steps,
            "lora_delta_relative": moved,
            "mean_reward_start": nan_if_none(result.reward_start),
            "mean_reward_end": nan_if_none(result.reward_end),
            "seconds_per_step": result.seconds_per_step or float("nan"),
            "resumed_from": result.resumed_from or "",
            **{k: float(v) for k, v in timings.items()},
            "probe": dg.MetadataValue.md(markdown_table(
                summary.with_columns(pl.selectors.float().round(3)))),
            **{f"probe_{k}": v for k, v in effect.items()},
        },
        dg.AssetCheckResult(
                check_name="fidelity_effect",
                passed=verdict.passed,
                # one persona's CI is too wide to block on (a coin toss at the study's size);
                # persona_roster_probe's pooled check is the gate (lib/stage1/panel.py)
                severity=dg.AssetCheckSeverity.WARN,
                description=f"{persona}: {verdict.description}",
                metadata={**effect, "reader": verdict.reader},
            ),
    )


def _unprobed(run_id: str, version: str, result, moved: float, timings: dict,
              why: str) -> tuple[dict, dg.AssetCheckResult]:
    """The adapter's metadata and check when its set has no reference utterances: the probe
    has no reader to ask, so the check says n/a instead of a verdict made up by guessing."""
    return (
        {"mlflow_run_id": run_id, "model_version": version,
         "trainable_percent": result.trainable_percent, "steps": result.steps,
         "lora_delta_relative": moved, "mean_reward_start": nan_if_none(result.reward_start),
         "mean_reward_end": nan_if_none(result.reward_end),
         "seconds_per_step": result.seconds_per_step or float("nan"),
         "resumed_from": result.resumed_from or "",
         **{k: float(v) for k, v in timings.items()}, "probe": why},
        dg.AssetCheckResult(check_name="fidelity_effect", passed=True,
                            severity=dg.AssetCheckSeverity.WARN, description=why),
    )
