"""One way to build a dialogue request: `mascot chat` and the chat page talk to the set-up the
evaluation ran (mascot_dag.companions), on the profile's own generation resource."""

from __future__ import annotations

import dataclasses

import pytest

from mascot_dag.lib.data.personas import load_personas, personas_of_set

SUPPORT = personas_of_set(load_personas(), "support")


def recorder(generate, seen: list):
    def record(reqs):
        seen.extend(reqs)
        return generate(reqs)

    return record


@pytest.mark.slow
def test_a_chat_turn_is_requested_as_the_evaluation_requests_it(home, monkeypatch,
                                                                 base_model_path):
    """The tiny profile (zero-shot persona prompts, its own token budgets, the transformers
    resource): a chat round's director and agent requests, as built, equal those of the
    evaluation's MASCOT method on the same state (the chat's context, seed and turns)."""
    from mascot_dag.companions import load_companions
    from mascot_dag.lib.dialogue.chat import ChatSession
    from mascot_dag.lib.dialogue.spec import DialogueConfig, config_from_settings
    from mascot_dag.lib.evaluation.methods import run_method
    from mascot_dag.profiles import resources_for

    monkeypatch.setenv("MASCOT_PROFILE", "tiny")
    resources = resources_for()
    settings = resources["settings"]
    group = load_companions([c.persona_id for c in SUPPORT])
    assert type(group.chat) is type(resources["chat"])
    # the bug this replaced: the chat's own DialogueConfig kept the few-shot default while the
    # adapters trained and were evaluated zero-shot
    assert group.config.prompt_style == settings.prompt_style != DialogueConfig().prompt_style
    assert group.config.max_new_tokens_agent == settings.max_new_tokens

    chat_requests, eval_requests = [], []
    session = ChatSession(SUPPORT, recorder(group.chat.generate, chat_requests), group.config,
                          seed=11)
    session.say("I failed my driving test again and I feel stupid.")
    rounds = group.config.agents_per_round
    spec = dataclasses.replace(session.state.spec, n_agent_turns=rounds, dialogue_id="eval:chat")
    run_method("mascot", [spec], recorder(group.chat.generate, eval_requests),
               config_from_settings(settings), group.config.persona_adapters,
               group.config.director_adapter)
    assert len(chat_requests) >= 2 * rounds  # a directive, then the agent, per agent turn
    # the chat's guards may resample a reply (same request, another seed): the first samples
    # are what the evaluation requests
    first = [r for i, r in enumerate(chat_requests)
             if not (i and r.messages == chat_requests[i - 1].messages)]
    assert first == eval_requests


def test_the_chat_follows_the_profile_and_its_overrides(home, monkeypatch):
    """No model loads here: a fresh home has no registered version to attach."""
    from mascot_dag.companions import load_companions, profile_chat
    from mascot_dag.profiles import resources_for
    from mascot_dag.resources.llm import TransformersChatResource, VLLMChatResource

    monkeypatch.setenv("MASCOT_PROFILE", "study")
    group = load_companions([c.persona_id for c in SUPPORT], agents_per_round=1,
                            max_new_tokens_agent=None)
    settings = resources_for()["settings"]
    assert group.config.agents_per_round == 1  # set by the user
    assert group.config.max_new_tokens_agent == settings.max_new_tokens  # None keeps the profile's
    assert group.config.structured_director == settings.director_structured
    assert not group.versions and group.director_version is None
    assert group.config.persona_adapters == {} and group.config.director_adapter is None

    chat = TransformersChatResource(model="some/model")
    assert profile_chat({"chat": chat}) is chat
    moved = profile_chat({"chat": chat}, "vllm")
    assert type(moved) is VLLMChatResource and moved.model == "some/model"
    with pytest.raises(ValueError, match="engine 'onnx'"):
        profile_chat({"chat": chat}, "onnx")
