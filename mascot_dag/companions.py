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
    from MLflow (LATEST or None: the latest versions; base model + persona prompt where a
    persona has none; "base": no adapter at all). `overrides` are DialogueConfig fields the user
    set (e.g. `max_new_tokens_agent` from `mascot chat`); None values keep the profile's."""
    from mascot_dag.profiles import resources_for

    resources = resources_for(profile)
    chat, tracking = profile_chat(resources, engine), resources["tracking"]
    if alias == BASE:  # the untrained group, to compare with (same prompts, seeds, config)
        adapters, versions, director, director_version = {}, {}, None, None
    else:
        adapters, versions = attach_personas(chat, tracking, persona_ids, registry_alias(alias))
        director, director_version = attach(chat, tracking, DIRECTOR_MODEL,
                                            registry_alias(alias))
    base = config_from_settings(resources["settings"],
                                **{k: v for k, v in overrides.items() if v is not None})
    _, config, _ = method_plan("mascot", [], base, adapters, director)
    return Companions(chat, config, versions, director_version)


# `--models`: which registered versions speak. The default (None) is the champion when the
# evaluation gate promoted one, else the latest trained versions: right after `make demo` (whose
# few evaluation contexts cannot pass the gate) the chat still speaks with what was trained, and
# every reply says it was not promoted.
LATEST = "latest, not promoted"
BASE = "base"  # `--models base`: no adapter, the base model with persona prompts


def resolve_models(models: str | None, profile: str | None = None) -> str:
    """The alias label of `--models`: `champion`, LATEST (for `latest`, or no champion yet when
    `models` is None), or the user's own alias."""
    from mascot_dag.profiles import resources_for
    from mascot_dag.registry import champion_exists

    if models == BASE:
        return BASE
    if models in (None, "", "auto"):
        tracking = resources_for(profile)["tracking"]
        return "champion" if champion_exists(tracking) else LATEST
    return LATEST if models in ("latest", LATEST) else models


def registry_alias(label: str | None) -> str | None:
    """The MLflow alias a label resolves with: None (the latest version) for LATEST."""
    return None if label in (None, LATEST, "latest") else label


def roster_of(name: str | None):
    """(cards, mode) of a persona set of the persona folder (None: the support roster); a
    ValueError naming the sets when there is no such set."""
    from mascot_dag.lib.data.personas import load_personas, mode_sets, personas_of_set, set_mode

    cards = load_personas()
    roles = mode_sets(cards)
    name = name or roles["support"]
    roster = personas_of_set(cards, name)
    if not roster:
        sets = ", ".join(dict.fromkeys(c.persona_set for c in cards))
        raise ValueError(f"--roster {name!r}: no such persona set (sets: {sets})")
    return roster, set_mode(cards, name)


def terminal_chat(lines, echo, roster_name: str | None, models: str | None,
                  engine: str | None, profile: str | None, turns: int = 0,
                  seed: int = 0, **overrides) -> None:
    """`mascot chat` in the terminal: `lines` the user's messages, `echo` prints. Every reply is
    labelled with the persona's model and version (or the base model + persona prompt)."""
    from mascot_dag.lib.dialogue.chat import MODEL_NOTE, ChatSession, version_label
    from mascot_dag.registry import DIRECTOR_MODEL, persona_model

    roster, mode = roster_of(roster_name)
    label = resolve_models(models, profile)
    group = load_companions([c.persona_id for c in roster], registry_alias(label), engine,
                            profile, **overrides)
    labels = {c.persona_id: version_label(persona_model(c.persona_id),
                                          group.versions.get(c.persona_id), label)
              for c in roster}
    director = (version_label(DIRECTOR_MODEL, group.director_version, label)
                if group.director_version else "base director")
    if label == BASE:
        echo(f"Roster {roster[0].persona_set} ({mode}), models: base: the base model with "
             "persona prompts, no adapter (--models base)")
    elif group.versions or group.director_version:
        echo(f"Roster {roster[0].persona_set} ({mode}), models: {label}; "
             f"{', '.join(labels.values())}; {director}")
    else:
        echo(f"Roster {roster[0].persona_set}: no trained versions ({label}) in MLflow: base "
             "model with persona prompts (run `make demo`).")
    session = ChatSession(roster, group.chat.generate, group.config, seed=seed, mode=mode,
                          labels=labels)
    echo(MODEL_NOTE)
    echo("Type a message (empty line or 'quit' to stop).")
    said = 0
    for line in lines:
        line = line.strip()
        if not line or line.lower() in {"quit", "exit"}:
            break
        for card, reply, d in session.say(line):
            directive = (f"({d['action']}; {d['tone']})" if d["valid"]
                         else f"(director: {d['status']}, no valid directive)")
            resampled = f" [resampled {d['resamples']}x]" if d["resamples"] else ""
            echo(f"[{card.name}] <{labels[card.persona_id]}> {directive}{resampled} {reply}")
        said += 1
        if turns and said >= turns:
            break


def served_adapters(models: str | None, profile: str | None = None) -> list[tuple[str, str]]:
    """`mascot serve`'s adapters when none is named: [(NAME=models:/<model>/<version>, label)]
    for every persona of the persona folder and the director with a version under `models`
    (None: the champion, else the latest versions, labelled not promoted)."""
    from mascot_dag.lib.data.personas import load_personas
    from mascot_dag.lib.dialogue.chat import version_label
    from mascot_dag.profiles import resources_for
    from mascot_dag.registry import DIRECTOR_MODEL, persona_model, resolve_version

    label = resolve_models(models, profile)
    if label == BASE:
        return []
    tracking = resources_for(profile)["tracking"]
    out = []
    for model in [*(persona_model(c.persona_id) for c in load_personas()), DIRECTOR_MODEL]:
        version = resolve_version(tracking, model, registry_alias(label))
        if version is not None:
            out.append((f"{model}=models:/{model}/{version}",
                        version_label(model, version, label)))
    return out
