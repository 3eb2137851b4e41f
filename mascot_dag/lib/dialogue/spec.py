"""What a dialogue is made of: its spec (context, mode, roster, user, seed, length), the config a
method runs it with, and the record it leaves. `config_from_settings` is the one way to build a
config from a profile's settings (Stage 2, evaluation and chat start from it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from mascot_dag.lib.data.personas import PROMPT_STYLES, PersonaCard
from mascot_dag.lib.data.users import UserProfile
from mascot_dag.lib.types import ChatRequest, ChatResult, Context

ChatFn = Callable[[list[ChatRequest]], list[ChatResult]]


@dataclass
class DialogueSpec:
    dialogue_id: str
    context: Context
    mode: Literal["support", "meeting"]
    roster: list[PersonaCard]
    user_profile: UserProfile | None
    seed: int
    n_agent_turns: int

    def __post_init__(self) -> None:
        if self.mode not in ("support", "meeting"):
            raise ValueError(f"{self.dialogue_id}: mode must be support|meeting, got {self.mode!r}")
        if not self.roster:
            raise ValueError(f"{self.dialogue_id}: empty roster")
        if self.n_agent_turns < 1:
            raise ValueError(f"{self.dialogue_id}: n_agent_turns must be >= 1")


@dataclass
class DialogueConfig:
    speaker_policy: Literal["director", "random", "round_robin"] = "director"
    persona_grounding: bool = True  # False = ablation MASCOT-P (generic assistant prompts)
    persona_adapters: dict[str, str | None] = field(default_factory=dict)
    director_adapter: str | None = None
    prompt_style: str = "few_shot"
    no_repeat: bool = True  # nobody speaks twice in a row (director retries, then falls back)
    agents_per_round: int = 2  # support mode: the user replies after every round of agents
    max_new_tokens_agent: int = 48
    # a directive JSON is ~25-45 tokens (base model: mean 30, max 46)
    max_new_tokens_director: int = 48
    # structured outputs for the director (lib.director.directive_schema): the backend can only
    # write a directive naming an allowed speaker; False = the prompt alone (the GRPO view)
    structured_director: bool = True
    max_new_tokens_user: int = 40
    temperature: float = 0.7
    director_temperature: float | None = None  # None = temperature

    def __post_init__(self) -> None:
        if self.speaker_policy not in ("director", "random", "round_robin"):
            raise ValueError(
                f"speaker_policy must be director|random|round_robin, got {self.speaker_policy!r}"
            )
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}")
        if self.agents_per_round < 1:
            raise ValueError("agents_per_round must be >= 1")


def config_from_settings(settings, **overrides) -> DialogueConfig:
    """The dialogue config of a profile's settings (`resources.settings.LineageSettings`, or
    any object with its fields). Stage 2, the director comparison, the evaluation and the chat
    (terminal and page, `mascot_dag.companions`) all start from this one, so a chat turn is
    requested exactly as the evaluation requests it: the same prompt style, token budgets and
    directive format."""
    base = dict(
        max_new_tokens_agent=settings.max_new_tokens,
        max_new_tokens_user=max(16, settings.max_new_tokens - 8),
        prompt_style=settings.prompt_style,
        agents_per_round=settings.agents_per_round,
        structured_director=settings.director_structured,
    )
    return DialogueConfig(**{**base, **overrides})


@dataclass
class DialogueRecord:
    dialogue: dict[str, Any]  # a `dialogues` row
    turns: list[dict[str, Any]]  # `turns` rows
    directives: list[dict[str, Any]]  # `directives` rows (director policy only)
