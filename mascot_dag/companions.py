"""The trained companion group as a profile serves it, for `mascot chat` (terminal and page).

One way to build a dialogue request: the chat starts from the profile's settings
(`lib.dialogue.config_from_settings`, as Stage 2 and the evaluation do) and runs the evaluated
MASCOT method's config (`lib.methods.method_plan("mascot", ...)`), on the profile's generation
resource, with the registry's versions under an alias. So what a user talks to is the set-up the
champion gate evaluated: the same prompt style, token budgets, directive format and backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mascot_dag.lib.dialogue.spec import DialogueConfig, config_from_settings
from mascot_dag.lib.evaluation.methods import method_plan
from mascot_dag.registry import DIRECTOR_MODEL, attach, attach_personas
from mascot_dag.resources.llm import ENGINES, ChatModelResource


@dataclass
class Companions:
    """The generation resource, the evaluated config with the alias's adapters, and which
    registered versions speak ({persona_id: version}; the director's version or None)."""

    chat: ChatModelResource
    config: DialogueConfig
    versions: dict[str, str] = field(default_factory=dict)
    director_version: str | None = None


def profile_chat(resources: dict, engine: str | None = None) -> ChatModelResource:
    """The profile's generation resource; `engine` (vllm | transformers) runs the same model
    on that local engine instead (`mascot chat --engine`)."""
    from mascot_dag.resources.llm import TransformersChatResource, VLLMChatResource

    chat = resources["chat"]
    if engine is None:
        return chat
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
    cls = VLLMChatResource if engine == "vllm" else TransformersChatResource
    model = getattr(chat, "model", None)
    return cls(model=model) if model else cls()


def load_companions(
    persona_ids: list[str],
    alias: str | None = "champion",
    engine: str | None = None,
    profile: str | None = None,
    **overrides,
) -> Companions:
    """The companions of profile `profile` (MASCOT_PROFILE when None) with the `alias` versions
    from MLflow (base model + persona prompt where a persona has none). `overrides` are
    DialogueConfig fields the user set (e.g. `max_new_tokens_agent` from `mascot chat`); None
    values keep the profile's."""
    from mascot_dag.profiles import resources_for

    resources = resources_for(profile)
    chat, tracking = profile_chat(resources, engine), resources["tracking"]
    adapters, versions = attach_personas(chat, tracking, persona_ids, alias)
    director, director_version = attach(chat, tracking, DIRECTOR_MODEL, alias)
    base = config_from_settings(resources["settings"],
                                **{k: v for k, v in overrides.items() if v is not None})
    _, config, _ = method_plan("mascot", [], base, adapters, director)
    return Companions(chat, config, versions, director_version)
