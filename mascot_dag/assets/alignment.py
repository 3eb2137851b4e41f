"""Stage 1 training (group `persona_alignment`): the persona reward model and GRPO LoRA adapters.

Both log params, curves and adapters to MLflow and register model versions; checkpoints sit in
MASCOT_HOME/checkpoints/<asset>/<fingerprint of data+settings>, so an interrupted run resumes.
"""

import functools

import dagster as dg
import pandas as pd

from mascot_dag.assets.common import (
    base_model_path,
    fingerprint,
    persona_partitions,
    registered_name,
)
from mascot_dag.assets.feedback import load_roster, train_contexts
from mascot_dag.assets.registry import REWARD_MODEL as REWARD_MODEL_NAME
from mascot_dag.assets.registry import latest_version
from mascot_dag.lib.home import Home
from mascot_dag.lib.judges.base import ResponseItem
from mascot_dag.lib.preferences import candidate_messages, persona_tag, reward_messages
from mascot_dag.lib.tables import context_from_row
from mascot_dag.lib.types import ChatRequest, SamplingParams
from mascot_dag.resources.judge import EmbeddedJudgeResource
from mascot_dag.resources.llm import ChatModelResource
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore
from mascot_dag.resources.tracking import MLflowResource

EXPERIMENT = "stage1_persona_alignment"


def lora_settings(settings: LineageSettings):
    from mascot_dag.lib.training.config import LoraSettings

    return LoraSettings(r=settings.lora_r, alpha=2 * settings.lora_r)


def grpo_settings(settings: LineageSettings, max_completion_length: int):
    """GRPO settings shared by the persona adapters and the director (LoRA, CPU or bf16)."""
    from mascot_dag.lib.training.config import GRPOSettings

    return GRPOSettings(
        max_steps=settings.grpo_steps, batch_size=settings.grpo_generations,
        num_generations=settings.grpo_generations, max_completion_length=max_completion_length,
        learning_rate=settings.grpo_learning_rate, save_steps=1, seed=settings.seed,
        use_cpu=settings.use_cpu, bf16=not settings.use_cpu,
    )


def _system_prompts(store: DuckDBStore, style: str) -> dict[str, str]:
    df = store.query("SELECT persona_id, system_prompt FROM persona_prompts WHERE style = ?", [style])
    return dict(zip(df.persona_id, df.system_prompt, strict=True))


def preference_examples(store: DuckDBStore, persona_set: str) -> list[dict]:
    """preference_pairs joined to texts -> [{"prompt": RM messages, "chosen", "rejected"}]."""
    df = store.query(
        "SELECT p.pair_id, p.persona_id, p.context_id, c.text AS chosen, r.text AS rejected "
        "FROM preference_pairs p JOIN candidates c ON c.candidate_id = p.chosen_id "
        "JOIN candidates r ON r.candidate_id = p.rejected_id ORDER BY p.pair_id"
    )
    ctx = {
        r["context_id"]: context_from_row(r)
        for r in store.query("SELECT * FROM contexts").to_dict("records")
    }
    # The short tag the reward model reads (see lib.preferences.reward_messages).
    tags = {c.persona_id: persona_tag(c) for c in load_roster(store, persona_set)}
    return [
        {"pair_id": r.pair_id,
         "prompt": reward_messages(tags[r.persona_id], ctx[r.context_id]),
         "chosen": r.chosen, "rejected": r.rejected}
        for r in df.itertuples()
    ]


@functools.lru_cache(maxsize=1)
def _reward_scorer(base: str, rm_dir: str):
    """One loaded reward model per process and version: the demo trains every persona's adapter
    in the same process, one partition run after another, against the same RM version."""
    from mascot_dag.lib.training.reward_model import RewardScorer

    return RewardScorer(base, rm_dir)


def log_curves(tracking: MLflowResource, curves: dict[str, list]) -> None:
    for name, points in curves.items():
        if points:
            tracking.log_curve(name, points)


@dg.asset(
    group_name="persona_alignment",
    deps=["persona_preference_pairs"],
    kinds={"pytorch", "mlflow"},
    check_specs=[dg.AssetCheckSpec("heldout_accuracy_vs_chance", asset="persona_reward_model")],
)
def persona_reward_model(
    context: dg.AssetExecutionContext,
    store: DuckDBStore,
    chat: ChatModelResource,
    tracking: MLflowResource,
    settings: LineageSettings,
) -> dg.MaterializeResult:
    """Pairwise (Bradley-Terry) reward model with LoRA on the base model, held-out accuracy."""
    from mascot_dag.lib.training.config import RewardModelSettings
    from mascot_dag.lib.training.reward_model import train_reward_model

    pairs = preference_examples(store, settings.train_persona_set)
    if len(pairs) < 2:
        raise ValueError(
            f"only {len(pairs)} preference pairs: sample more candidates (k_candidates, "
            "max_train_contexts) or lower preference_delta"
        )
    rm = RewardModelSettings(
        max_steps=settings.reward_steps, batch_size=settings.reward_batch_size,
        save_steps=max(1, settings.reward_steps // 2), seed=settings.seed,
        train_accuracy_pairs=16,  # two forward passes per pair; the held-out side is the measure
        use_cpu=settings.use_cpu, bf16=not settings.use_cpu,
    )
    lora = lora_settings(settings)
    base = base_model_path(chat)
    out = Home.from_env().checkpoints / "persona_reward_model" / fingerprint(
        base, [(p["pair_id"], p["prompt"]) for p in pairs], rm, lora)
    with tracking.start_run(EXPERIMENT, "persona-reward-model",
                            {"asset": "persona_reward_model"}) as run:
        tracking.log_params({"base_model": base, "pairs": len(pairs), **rm.__dict__,
                             "lora": lora.__dict__})
        result = train_reward_model(base, pairs, rm, lora, out)
        log_curves(tracking, {"loss": result.loss_curve})
        metrics = {"heldout_accuracy": result.heldout_accuracy,
                   "train_accuracy": result.train_accuracy,
                   "trainable_percent": result.trainable_percent}
        log_curves(tracking, {k: [(result.steps, v)] for k, v in metrics.items() if v is not None})
        tracking.log_adapter(result.adapter_dir)
        version = tracking.register_version(
            REWARD_MODEL_NAME, run, tags={"pairs": str(len(pairs))})
    acc = result.heldout_accuracy
    return dg.MaterializeResult(
        metadata={
            "mlflow_run_id": run.info.run_id,
            "model_version": f"{REWARD_MODEL_NAME}/{version}",
            "pairs_train": result.n_train,
            "pairs_heldout": result.n_heldout,
            "heldout_accuracy": acc if acc is not None else float("nan"),
            "train_accuracy": result.train_accuracy if result.train_accuracy is not None else float("nan"),
            "trainable_percent": result.trainable_percent,
            "steps": result.steps,
            "seconds_per_step": result.seconds_per_step or float("nan"),
            "final_loss": result.loss_curve[-1][1] if result.loss_curve else float("nan"),
            "resumed_from": result.resumed_from or "",
        },
        check_results=[
            dg.AssetCheckResult(
                check_name="heldout_accuracy_vs_chance",
                passed=acc is not None and acc > 0.5,
                severity=dg.AssetCheckSeverity.WARN,
                description=(f"held-out pairwise accuracy {acc:.3f} vs chance 0.5 on "
                             f"{result.n_heldout} pairs" if acc is not None else "no held-out pairs"),
                metadata={"heldout_accuracy": acc if acc is not None else float("nan"),
                          "chance": 0.5, "heldout_pairs": result.n_heldout},
            )
        ],
    )


@dg.asset(
    group_name="persona_alignment",
    partitions_def=persona_partitions,
    deps=[persona_reward_model],
    kinds={"pytorch", "mlflow"},
    check_specs=[dg.AssetCheckSpec("fidelity_effect", asset="persona_adapters")],
)
def persona_adapters(
    context: dg.AssetExecutionContext,
    store: DuckDBStore,
    chat: ChatModelResource,
    judge: EmbeddedJudgeResource,
    tracking: MLflowResource,
    settings: LineageSettings,
) -> dg.MaterializeResult:
    """GRPO LoRA adapter of one persona; reward = reward-model score + format reward."""
    from mascot_dag.lib.rewards import format_reward, reward_model_reward
    from mascot_dag.lib.training.grpo import train_grpo_adapter
    persona = context.partition_key
    roster = load_roster(store, settings.train_persona_set)
    card = next(c for c in roster if c.persona_id == persona)
    system = _system_prompts(store, settings.prompt_style)[persona]
    ctxs = train_contexts(store, settings)
    prompts = [candidate_messages(system, c) for c in ctxs]
    # The reward model reads its own short form of each prompt (a dataset column TRL passes on).
    reward_prompts = [reward_messages(persona_tag(card), c) for c in ctxs]
    home = Home.from_env()
    rm_version = latest_version(tracking, REWARD_MODEL_NAME)
    if rm_version is None:
        raise ValueError(f"no {REWARD_MODEL_NAME} in MLflow: materialise persona_reward_model")
    base = base_model_path(chat)
    rm_dir = tracking.download_adapter(f"models:/{REWARD_MODEL_NAME}/{rm_version}",
                                       home.checkpoints / "downloads" / f"rm-{rm_version}")
    scorer = _reward_scorer(base, str(rm_dir))
    others = [c.name for c in roster if c.persona_id != persona]
    rewards = [reward_model_reward(scorer), format_reward(other_names=others)]
    weights = [settings.reward_model_weight, settings.format_reward_weight]
    gs = grpo_settings(settings, settings.grpo_completion_tokens)
    lora = lora_settings(settings)
    out = home.checkpoints / "persona_adapters" / persona / fingerprint(
        base, prompts, rm_version, gs, lora, weights)
    name = registered_name("mascot-persona", persona)
    with tracking.start_run(EXPERIMENT, f"grpo-{persona}", {"persona": persona}) as run:
        tracking.log_params({"base_model": base, "persona": persona, "prompts": len(prompts),
                             "reward_model_version": rm_version, "reward_weights": weights,
                             **gs.__dict__, "lora": lora.__dict__})
        result = train_grpo_adapter(base, prompts, rewards, weights, gs, lora, out,
                                    columns={"reward_prompt": reward_prompts})
        log_curves(tracking, {"reward": result.reward_curve, "kl": result.kl_curve,
                               "loss": result.loss_curve, **result.reward_func_curves})
        tracking.log_adapter(result.adapter_dir)
        version = tracking.register_version(name, run, tags={"persona": persona,
                                                             "reward_model_version": rm_version})
    effect = fidelity_effect(store, chat, judge, settings, card, roster, system, result.adapter_dir,
                             f"{persona}-v{version}")
    return dg.MaterializeResult(
        metadata={
            "mlflow_run_id": run.info.run_id,
            "model_version": f"{name}/{version}",
            "trainable_percent": result.trainable_percent,
            "steps": result.steps,
            "mean_reward_start": result.reward_start if result.reward_start is not None else float("nan"),
            "mean_reward_end": result.reward_end if result.reward_end is not None else float("nan"),
            "seconds_per_step": result.seconds_per_step or float("nan"),
            "resumed_from": result.resumed_from or "",
            **{f"fidelity_{k}": v for k, v in effect.items()},
        },
        check_results=[
            dg.AssetCheckResult(
                check_name="fidelity_effect",
                passed=effect["adapter"] >= effect["base"],
                severity=dg.AssetCheckSeverity.WARN,
                description=(f"embedded-judge persona fidelity on {effect['n']:.0f} eval contexts: "
                             f"adapter {effect['adapter']:.3f} vs base {effect['base']:.3f}"),
                metadata=effect,
            )
        ],
    )


def fidelity_effect(store, chat, judge, settings, card, roster, system, adapter_dir, adapter_name):
    """Generate with the adapter and with the base model on the same held-out contexts (same
    seeds) and compare the embedded judge's mean persona fidelity (consistency, 1-5)."""
    source = "empatheticdialogues" if settings.train_persona_set == "support" else "qmsum"
    limit = f"LIMIT {int(settings.eval_contexts) * 2}" if settings.eval_contexts else ""
    rows = store.query(
        f"SELECT * FROM contexts WHERE split = 'eval' AND source = ? ORDER BY md5(context_id) {limit}",
        [source],
    ).to_dict("records")
    ctxs = [context_from_row(r) for r in rows]
    backend = chat.backend()
    backend.add_adapter(adapter_name, str(adapter_dir))
    sampling = SamplingParams(settings.max_new_tokens, 0.7, 0.95, settings.seed)
    reqs = [ChatRequest(tuple(candidate_messages(system, c)), sampling, a)
            for a in (None, adapter_name) for c in ctxs]
    texts = [r.text for r in backend.generate(reqs)]
    items = [ResponseItem(c.text, card, roster, t, []) for c, t in zip(ctxs * 2, texts, strict=True)]
    scores = judge.judge().score_responses(items)
    fid = pd.Series([next(s.score for s in ss if s.criterion == "consistency") for ss in scores],
                    dtype=float)
    n = len(ctxs)
    base, adapted = float(fid[:n].mean()), float(fid[n:].mean())
    return {"base": base, "adapter": adapted, "difference": adapted - base, "n": float(n)}
