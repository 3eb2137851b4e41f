"""Sizes and knobs of the lineage. A profile (mascot_dag/profiles.py) fills them in."""

from __future__ import annotations

import dagster as dg
from pydantic import Field, field_validator, model_validator


class LineageSettings(dg.ConfigurableResource):
    """How big each stage is. The defaults ARE the embedded profile: the whole lineage in under
    15 minutes on 2 CPU cores. On CPU time is roughly proportional to tokens processed (prefill
    ~350 tokens/s, one decode step ~0.1-0.25 s for SmolLM2-135M), so these sizes are token budgets:
    4 train contexts x K=4, 24-token turns, zero-shot persona prompts, GRPO groups of 2, one
    dialogue per mode with 2 agent turns (the user replies between them), one eval context per
    mode. docs/experiments/2026-12-02-demo-stage-times.md has the
    measured stage times."""

    seed: int = Field(default=0, description="Base seed of every sampled generation and split.")
    eval_ratio: float = Field(default=0.25, description="Share of contexts in the eval split.")
    train_persona_set: str = Field(
        default="support",
        description="The one persona set Stage 1 aligns while train_persona_sets is empty "
        "(support | workplace, or a set of the user's folder; a folder without it: its first "
        "set).",
    )
    train_persona_sets: list[str] = Field(
        default=[],
        description="Persona sets Stage 1 aligns, each on the training contexts of the mode it "
        "speaks in (the set `workplace` in meetings, every other set in support contexts) with "
        "its own roster: ['all'] = every set of the persona folder (the study, paper and "
        "cluster profiles, so meeting-mode MASCOT speaks with aligned adapters); set names = "
        "those sets; [] = the one set train_persona_set names (embedded and tiny: a demo's and "
        "the tests' time budget, Stage 1 costs time per persona). The persona partitions are "
        "these sets' persona ids, read when the definitions load (MASCOT_PROFILE, MASCOT_SET). "
        "A profile's sizes (MASCOT_SIZES) bring their own value.",
    )
    prompt_style: str = Field(
        default="zero_shot",
        description="Persona prompt style of the agents (zero_shot | few_shot). zero_shot by "
        "default: on CPU a forward pass costs time per token and the few-shot examples add ~120 "
        "tokens to every persona prompt; the aligned adapters are what carry the persona.",
    )
    max_train_contexts: int = Field(
        default=8, description="Train contexts sampled per persona in Stage 1 (0 = all)."
    )
    k_candidates: int = Field(default=3, description="K: candidates per (context, persona).")
    max_new_tokens: int = Field(default=24, description="Tokens per candidate / agent turn.")
    temperature: float = Field(default=0.9, description="Sampling temperature for candidates.")
    preference_delta: float = Field(
        default=0.5, description="Minimum mean-score gap (1-5 scale) for a preference pair."
    )
    # ---- Stage 1: supervised base policy (pi_SFT) and candidates --------------------------------
    policy_init: str = Field(
        default="sft",
        description="Where Stage 1 starts: 'sft' = pi_SFT, a LoRA SFT on the training listener "
        "turns (the paper's supervised base policy; candidates are sampled from it and every "
        "persona adapter starts from its weights), or 'base' = the base model.",
    )
    policy_sft_steps: int = Field(default=6, description="SFT steps of pi_SFT.")
    policy_sft_learning_rate: float = Field(default=2e-4, description="pi_SFT learning rate.")
    candidate_prompt_style: str = Field(
        default="few_shot",
        description="Persona prompt style the K candidates are sampled with (zero_shot | "
        "few_shot). The adapters learn on `prompt_style`, the prompt they serve in, so a richer "
        "sampling prompt is distilled into the weights (context distillation).",
    )
    persona_score_weight: float = Field(
        default=0.5,
        description="Weight of the judge's consistency (persona fidelity) in the score that ranks "
        "candidates for pairs and the warm start; the other four criteria share the rest.",
    )
    cross_persona_pairs: bool = Field(
        default=True,
        description="Pool the candidates of ALL personas' prompts for a context and judge each as "
        "this persona: another persona's reply becomes a rejected side, so the reward model has a "
        "reason to read the persona tag.",
    )
    max_pairs_per_context: int = Field(
        default=6, description="Pairs kept per (context, persona): the largest margins."
    )
    # ---- Stage 1: reward model -----------------------------------------------------------------
    reward_steps: int = Field(default=16, description="RewardTrainer optimisation steps.")
    reward_batch_size: int = Field(default=8, description="RewardTrainer batch size.")
    reward_learning_rate: float = Field(default=2e-4, description="Reward-model learning rate.")
    reward_scheduler: str = Field(
        default="cosine", description="LR schedule of the reward model (transformers name)."
    )
    reward_heldout_fraction: float = Field(
        default=0.25, description="Share of train CONTEXTS whose pairs are held out."
    )
    reward_blocking: bool = Field(
        default=False,
        description="Fail the run (blocking check) when the held-out accuracy CI's lower bound "
        "is not above 0.5; the study profile sets it.",
    )
    # ---- Stage 1: persona warm start and GRPO --------------------------------------------------
    warm_start_steps: int = Field(
        default=0,
        description="Persona warm start: SFT steps on this persona's best-judged candidates "
        "before GRPO (0 = off). Reported separately by the probe.",
    )
    warm_start_learning_rate: float = Field(default=2e-4, description="Warm-start learning rate.")
    grpo_steps: int = Field(default=4, description="GRPO steps per persona adapter.")
    grpo_generations: int = Field(
        default=4, description="GRPO group size (>= 4 keeps advantages graded, not +-0.71)."
    )
    grpo_completion_tokens: int = Field(default=24, description="GRPO max completion length.")
    grpo_learning_rate: float = Field(default=3e-4, description="GRPO learning rate (LoRA).")
    grpo_scheduler: str = Field(default="constant", description="GRPO LR schedule.")
    grpo_beta: float = Field(
        default=0.0,
        description="KL coefficient against the base (0 skips the reference pass: faster on CPU).",
    )
    top_p: float = Field(
        default=0.95, description="Nucleus sampling of candidates, GRPO and the probe alike."
    )
    reward_model_weight: float = Field(default=1.0, description="Weight of the reward-model score.")
    judge_reward_weight: float = Field(
        default=0.0, ge=0.0,
        description="Weight of the training judge's persona consistency (1-5) as a direct GRPO "
        "reward beside the reward model (lib.rewards.JudgeReward says why).")
    format_reward_weight: float = Field(default=0.5, description="Weight of the format reward.")
    group_history_turns: int = Field(
        default=0, ge=0,
        description="Group-aware Stage 1: GRPO prompts show 0..N earlier turns of the OTHER "
        "personas (their Stage 1 candidates for the context) before this persona's turn, in "
        "turn over the train contexts; 0 = the opening request only.",
    )
    novelty_reward_weight: float = Field(
        default=0.0, ge=0.0,
        description="Weight of the novelty reward (1 - lexical overlap with the most similar "
        "earlier agent turn of the prompt); needs group_history_turns > 0.",
    )
    novelty_ignores_context: bool = Field(
        default=False,
        description="The novelty reward does not count words of the context (what every agent "
        "sees) as repeated: naming the user's topic is not an echo, repeating what another "
        "agent added is. Measured on the study Stage 1: no relevance regained, less "
        "engagement gain (docs/experiments/2026-12-04-group-aware-stage1.md, arm C); "
        "off by default.",
    )
    lora_r: int = Field(default=8, description="LoRA rank for every adapter.")
    lora_targets: str = Field(
        default="all-linear",
        description="LoRA target modules: 'all-linear' or comma-separated names (q_proj,v_proj).",
    )
    # ---- Stage 1: persona probe ----------------------------------------------------------------
    probe_contexts: int = Field(default=16, description="Held-out contexts of the persona probe.")
    probe_seeds: int = Field(default=1, description="Sampling seeds per (context, persona).")
    probe_warm_start: bool = Field(
        default=False,
        description="Also probe the warm-start adapter (before GRPO), so the warm start's share "
        "of the effect is reported apart from GRPO's (one more generation pass).",
    )
    probe_formats: list[str] = Field(
        default=["training", "chat"],
        description="Formats each probe unit is asked in: 'training' (the group-dialogue request "
        "the adapters trained on) and 'chat' (persona system prompt + the user's message, what "
        "`mascot serve` clients send). The verdict is the most conservative over all of them.",
    )
    probe_blocking: bool = Field(
        default=False,
        description="Stage 1's gate blocks Stage 2 and the evaluation (study) when, under the "
        "probe panel's rule (lib/stage1/panel.py), some valid reader's pooled identifiability "
        "gain CI includes zero or one persona is made significantly worse under some reader "
        "(persona_roster_probe); per-persona results stay warnings.",
    )
    reward_reference_share: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="Share of each persona's reference utterances (personas/probe/<set>.yaml) "
        "that the reward may learn from (lib.stage1.readers.split_references, a stable hash of "
        "the text); the probe's readers are fitted and validated on the rest only, so the two "
        "never overlap. 0: the readers get every reference, the reward none.",
    )
    persona_exemplars: str = Field(
        default="card",
        description="What the embedded judge's persona centroids average: 'card' (description, "
        "behaviours, examples), 'references' (the card's examples + the persona's reward "
        "share of the reference utterances; needs reward_reference_share > 0) or 'exemplars' "
        "(the card's examples + utterances written for the reward, personas/exemplars/<set>.yaml, "
        "never one of the readers' references). A set without the file falls back to the card "
        "with a warning. The LLM judge is unaffected.",
    )
    use_cpu: bool = Field(default=True, description="Train on CPU (no bf16).")
    rollout_dialogues: int = Field(default=1, description="Stage 2 dialogues per mode.")
    agent_turns: int = Field(default=2, description="Agent turns per dialogue.")
    agents_per_round: int = Field(
        default=1,
        description="Support mode: agent turns between two simulated-user replies (a round).",
    )
    block_size: int = Field(default=4, description="N: turns per judged block.")
    director_steps: int = Field(default=2, description="GRPO steps for the director.")
    director_reward_horizon: int = Field(
        default=1,
        description="Turns the director's GRPO reward rolls forward from a directive before the "
        "group judge scores the block: 1 = the directive's turn after N-1 old turns (cheap: "
        "embedded/tiny), block_size = a real N-turn block (study/paper). See "
        "docs/decisions/0029-director-reward-horizon.md.",
    )
    director_structured: bool = Field(
        default=True,
        description="The director answers through structured outputs (a JSON schema whose "
        "speaker is an enum of the allowed roster ids): every directive valid on the first try. "
        "False = the prompt alone, as GRPO samples it "
        "(docs/decisions/0021-structured-directives.md).",
    )
    director_learning_rate: float | None = Field(
        default=None, description="Director GRPO learning rate (None = grpo_learning_rate)."
    )
    director_lora_targets: str | None = Field(
        default=None, description="Director LoRA target modules (None = lora_targets)."
    )
    director_compare_contexts: int = Field(
        default=1, description="Held-out contexts per mode in director_comparison (0 = all)."
    )
    director_compare_seeds: int = Field(
        default=2, description="Seeds per context in director_comparison (paired units)."
    )
    eval_contexts: int = Field(default=1, description="Eval contexts per mode (0 = all).")
    ood_valences: list[str] = Field(
        default=[],
        description="Out-of-domain condition: ED valences (positive | negative | neutral) or ED "
        "emotion labels whose contexts are never trained on (split 'ood') and are evaluated as "
        "the OOD condition (eval_contexts per mode more). Empty: no OOD condition.",
    )
    ood_domains: list[str] = Field(
        default=[],
        description="Out-of-domain condition: QMSum domains (academic | committee | product) held "
        "out the same way.",
    )
    gate_margin: float = Field(
        default=0.0,
        description="Champion gate: the paired CI of (candidate - comparator) overall score, "
        "0-100 points, must lie entirely above this margin.",
    )
    gate_min_contexts: int = Field(
        default=8,
        description="Champion gate: fewest paired eval contexts a promotion may rest on.",
    )
    gate_criteria: list[str] = Field(
        default=[],
        description="Champion gate: the judge criteria its overall score averages (`consistency` "
        "or `agent/consistency`, ...); empty: all nine. The study and paper profiles gate on "
        "the persona criteria the method is for, so relevance alone cannot promote.",
    )

    @model_validator(mode="after")
    def _novelty_needs_history(self) -> LineageSettings:
        if self.novelty_reward_weight > 0 and self.group_history_turns == 0:
            raise ValueError("novelty_reward_weight > 0 needs group_history_turns > 0: without "
                             "earlier agent turns in the prompts there is nothing to be novel to")
        return self

    @field_validator("train_persona_sets")
    @classmethod
    def _all_alone(cls, v: list[str]) -> list[str]:
        if "all" in v and v != ["all"]:
            raise ValueError(f"train_persona_sets {v}: 'all' stands alone (every set), or name "
                             "the sets")
        return v

    @model_validator(mode="after")
    def _exemplars_need_a_reward_share(self) -> LineageSettings:
        from mascot_dag.lib.judges.exemplars import EXEMPLARS

        if self.persona_exemplars not in EXEMPLARS:
            raise ValueError(f"persona_exemplars {self.persona_exemplars!r}: one of {EXEMPLARS}")
        if self.persona_exemplars == "references" and self.reward_reference_share <= 0:
            raise ValueError("persona_exemplars='references' needs reward_reference_share > 0: "
                             "with 0 every reference utterance is the readers' and none the "
                             "reward's")
        return self

    @field_validator("gate_criteria")
    @classmethod
    def _known_gate_criteria(cls, v: list[str]) -> list[str]:
        from mascot_dag.lib.evaluation.champion import check_gate_criteria

        check_gate_criteria(v)  # a typo fails at configuration, not after hours of evaluation
        return v

    @field_validator("probe_formats")
    @classmethod
    def _known_probe_formats(cls, v: list[str]) -> list[str]:
        from mascot_dag.lib.stage1.probe import FORMATS

        unknown = [f for f in v if f not in FORMATS]
        if unknown or not v:
            raise ValueError(f"probe_formats {v}: each must be one of {list(FORMATS)}, "
                             "at least one")
        return v
