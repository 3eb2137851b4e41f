"""Evaluation methods with the real tiny model (SmolLM2-135M): every method on the same specs."""

from __future__ import annotations

import json

import pytest

from mascot_dag.lib.data.personas import load_personas, personas_of_set, system_prompt
from mascot_dag.lib.data.users import load_user_profiles
from mascot_dag.lib.dialogue.engine import GENERIC_SYSTEM
from mascot_dag.lib.dialogue.rollout import build_specs
from mascot_dag.lib.dialogue.spec import DialogueConfig
from mascot_dag.lib.evaluation.esc import (
    ESC_ANALYSIS_TOKENS,
    ESC_ANALYST_SYSTEM,
    ESC_PROPOSER_SYSTEM,
    ESC_VOTE_TOKENS,
    multiagent_esc,
)
from mascot_dag.lib.evaluation.methods import (
    ALL_METHODS,
    ASSISTANT,
    COT_INSTRUCTION,
    METHODS,
    PROMPTING_BASELINES,
    SINGLE_AGENT,
    ZERO_SHOT_SYSTEM,
    baseline_system,
    extract_cot_response,
    method_plan,
    most_consistent,
    persona_baseline_system,
    run_method,
    sft_examples,
)
from mascot_dag.lib.types import Context

CARDS = load_personas()
ROSTERS = {
    "support": personas_of_set(CARDS, "support"),
    "workplace": personas_of_set(CARDS, "workplace"),
}
ED = Context(
    context_id="ed-1",
    source="empatheticdialogues",
    domain="emotional_support",
    situation="I failed my driving test for the third time.",
    text="Situation: I failed my driving test for the third time.\n"
    "Speaker: I failed again today and I feel so stupid.",
    turns=[{"speaker": "speaker", "text": "I failed again today and I feel so stupid."}],
)
MEETING = Context(
    context_id="qm-1",
    source="qmsum",
    domain="product",
    situation="remote control design",
    text="PM: We need to decide on the remote's buttons.\nUI: Fewer buttons are easier.",
    topic="remote control design",
    queries=[{"query": "What did the group decide about the buttons?", "answer": "fewer"}],
)
SPECS = build_specs([ED, MEETING], ROSTERS, load_user_profiles(), n_agent_turns=2, prefix="eval")
# Tiny budgets; agents_per_round=1 so the simulated user replies between the 2 agent turns.
CONFIG = DialogueConfig(
    max_new_tokens_agent=8, max_new_tokens_user=8, max_new_tokens_director=12, agents_per_round=1
)


class Recorder:
    """Records every request batch the backend receives, then calls the real model."""

    def __init__(self, chat):
        self.chat = chat
        self.calls: list[list] = []

    def generate(self, requests):
        self.calls.append(list(requests))
        return self.chat.generate(requests)


@pytest.fixture(scope="module")
def lora_path(base_model_path, tmp_path_factory) -> str:
    """A fresh random LoRA standing in for the trained SFT adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(base_model_path)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    out = tmp_path_factory.mktemp("lora") / "sft"
    get_peft_model(base, cfg).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def runs(base_model_path, lora_path):
    """Every method once on the same specs: {method: (records, recorder)}."""
    from mascot_dag.lib.llm.transformers_backend import TransformersChat

    chat = TransformersChat(
        base_model_path, models_dir=".", adapters={"sft-lora": lora_path}, batch_size=8
    )
    out = {}
    for m in ALL_METHODS:
        rec = Recorder(chat)
        out[m] = (run_method(m, SPECS, rec, CONFIG, sft_adapter="sft-lora"), rec)
    return out


def _agent_calls(rec):
    return [
        c
        for c in rec.calls
        if not any(
            "role-playing" in r.messages[0]["content"]
            or "Your situation" in r.messages[0]["content"]
            for r in c
        )
    ]


def test_every_method_runs_with_method_ids(runs):
    assert set(runs) == set(ALL_METHODS) and "zero_shot_single" not in METHODS
    for m, (records, _) in runs.items():
        assert [r.dialogue["dialogue_id"] for r in records] == [f"eval:{m}:ed-1", f"eval:{m}:qm-1"]
        for r in records:
            assert r.dialogue["method"] == m and r.dialogue["stage"] == "eval"
            agent = [t for t in r.turns if t["role"] == "agent"]
            assert len(agent) == 2, m
            assert all(t["dialogue_id"] == r.dialogue["dialogue_id"] for t in r.turns)
        # the same specs: same seeds and openings for every method
        assert [r.dialogue["seed"] for r in records] == [s.seed for s in SPECS]
        assert [r.turns[0]["text"] for r in records] == [
            r.turns[0]["text"] for r in runs["mascot"][0]
        ]


def test_single_voice_methods_speak_as_the_assistant_only(runs):
    assert set(SINGLE_AGENT) == {"multiagent_esc", "zero_shot_single"}
    for m in SINGLE_AGENT:
        records, rec = runs[m]
        speakers = {t["speaker"] for r in records for t in r.turns if t["role"] == "agent"}
        assert speakers == {"assistant"}, m
        assert not any(r.directives for r in records)
        # the backend never sees the generic placeholder prompt: the wrapper rewrote it
        assert not any(r.messages[0]["content"] == GENERIC_SYSTEM for c in rec.calls for r in c)
    single = _agent_calls(runs["zero_shot_single"][1])
    assert {r.messages[0]["content"] for c in single for r in c} == {ZERO_SHOT_SYSTEM}
    support_ids = {c.persona_id for c in ROSTERS["support"]}
    mascot_speakers = {t["speaker"] for t in runs["mascot"][0][0].turns if t["role"] == "agent"}
    assert mascot_speakers <= support_ids and mascot_speakers


def _roster(record):
    return ROSTERS["support" if record.dialogue["mode"] == "support" else "workplace"]


def test_prompting_baselines_speak_as_the_roster_in_round_robin(runs):
    """Turn k of a prompting baseline is spoken by roster[k % n] with that persona's prompt."""
    assert set(PROMPTING_BASELINES) == set(METHODS) - {
        "multiagent_esc",
        "mascot",
        "mascot_p",
        "mascot_c",
    }
    for m in PROMPTING_BASELINES:
        records, rec = runs[m]
        for r in records:
            roster = _roster(r)
            agent = [t["speaker"] for t in r.turns if t["role"] == "agent"]
            assert agent == [roster[k % len(roster)].persona_id for k in range(len(agent))], m
            assert not r.directives
            models = json.loads(r.dialogue["models"])
            assert models["speaker_policy"] == "round_robin" and models["persona_grounding"]
        # every agent request the backend saw carries the speaking persona's baseline prompt
        expected = {
            persona_baseline_system(c, m, _roster(r))
            for r in records
            for c in _roster(r)
            if c.persona_id in {t["speaker"] for t in r.turns}
        }
        seen = {r.messages[0]["content"] for c in _agent_calls(rec) for r in c}
        assert seen == expected, m
        assert not any(r.messages[0]["content"] == GENERIC_SYSTEM for c in rec.calls for r in c)


def test_prompting_baselines_use_their_prompting_style(runs):
    roster = ROSTERS["support"]
    anchor = roster[0]
    zs = persona_baseline_system(anchor, "zero_shot", roster)
    assert zs == system_prompt(anchor, "zero_shot", roster)
    fs = persona_baseline_system(anchor, "few_shot", roster)
    assert anchor.examples[0] in fs and anchor.examples[0] not in zs
    for m in ("zero_shot_cot", "few_shot_cot"):
        cot = persona_baseline_system(anchor, m, roster)
        assert cot.endswith(COT_INSTRUCTION) and cot.startswith(f"You are {anchor.name},")
    assert anchor.examples[0] in persona_baseline_system(anchor, "few_shot_cot")
    assert anchor.examples[0] not in persona_baseline_system(anchor, "zero_shot_cot")
    cot_budgets = {
        r.sampling.max_new_tokens for c in _agent_calls(runs["zero_shot_cot"][1]) for r in c
    }
    assert cot_budgets == {2 * CONFIG.max_new_tokens_agent}
    plain = {r.sampling.max_new_tokens for c in _agent_calls(runs["few_shot"][1]) for r in c}
    assert plain == {CONFIG.max_new_tokens_agent}


def test_user_simulator_requests_pass_through_unchanged(runs):
    base_users = [c for c in runs["mascot"][1].calls if c not in _agent_calls(runs["mascot"][1])]
    zs_users = [
        c for c in runs["zero_shot"][1].calls if c not in _agent_calls(runs["zero_shot"][1])
    ]
    assert len(zs_users) == 1 and len(zs_users[0]) == 1  # support dialogue only, after turn 1
    assert zs_users[0][0].messages[0] == base_users[0][0].messages[0]


def test_sft_sets_the_adapter_on_agent_requests_only(runs):
    records, rec = runs["sft"]
    agent = [r for c in _agent_calls(rec) for r in c]
    assert agent and all(r.adapter == "sft-lora" for r in agent)
    # the roster's zero-shot persona prompts, through the SFT adapter
    zero_shot = {system_prompt(c, "zero_shot", _roster(d)) for d in records for c in _roster(d)}
    assert {r.messages[0]["content"] for r in agent} <= zero_shot
    users = [r for c in rec.calls for r in c if r not in agent]
    assert users and all(r.adapter is None for r in users)
    assert {t["model_used"] for r in records for t in r.turns if t["role"] == "agent"} == {
        "sft-lora"
    }
    with pytest.raises(ValueError, match="sft_adapter"):
        method_plan("sft", SPECS, CONFIG)
    # the other methods never load the SFT adapter, even when it is handed to them
    zs_agent = [r for c in _agent_calls(runs["zero_shot"][1]) for r in c]
    assert zs_agent and all(r.adapter is None for r in zs_agent)


def test_mascot_variants(runs):
    assert all(r.directives for r in runs["mascot"][0])
    assert all(r.directives for r in runs["mascot_p"][0])
    assert not any(r.directives for r in runs["mascot_c"][0])
    c_calls = runs["mascot_c"][1].calls
    assert not any("director" in r.messages[0]["content"].lower() for c in c_calls for r in c)
    # mascot_c: agent + user + agent calls only (no director call)
    assert len(c_calls) == 3
    assert json.loads(runs["mascot_c"][0][0].dialogue["models"])["speaker_policy"] == "random"
    p_models = json.loads(runs["mascot_p"][0][0].dialogue["models"])
    assert p_models["persona_grounding"] is False and p_models["speaker_policy"] == "director"
    specs, cfg, _ = method_plan("mascot", SPECS, CONFIG, {"anchor": "a1"}, "dir")
    assert specs == SPECS and cfg.persona_adapters == {"anchor": "a1"}
    assert cfg.director_adapter == "dir" and cfg.speaker_policy == "director"
    _, cfg_c, _ = method_plan("mascot_c", SPECS, CONFIG, {"anchor": "a1"}, "dir")
    assert cfg_c.director_adapter is None and cfg_c.persona_adapters == {"anchor": "a1"}
    _, cfg_p, _ = method_plan("mascot_p", SPECS, CONFIG, {"anchor": "a1"}, "dir")
    assert cfg_p.persona_adapters == {} and cfg_p.director_adapter == "dir"
    single, _, _ = method_plan("zero_shot_single", SPECS, CONFIG)
    assert all(s.roster == [ASSISTANT] for s in single) and SPECS[0].roster != [ASSISTANT]
    roster_specs, cfg_zs, _ = method_plan("zero_shot", SPECS, CONFIG)
    assert roster_specs == SPECS and cfg_zs.speaker_policy == "round_robin"
    with pytest.raises(ValueError, match="unknown method"):
        method_plan("zero_shot_multi", SPECS, CONFIG)


def _esc_stage(call) -> str:
    systems = {r.messages[0]["content"] for r in call}
    assert len(systems) == 1, "one stage per batched call"
    system = systems.pop()
    if system == ESC_ANALYST_SYSTEM:
        return "A"
    if system == ESC_PROPOSER_SYSTEM:
        return "D" if "experts proposed" in call[0].messages[1]["content"] else "V"
    assert system == ZERO_SHOT_SYSTEM
    return "F"


def test_multiagent_esc_batches_each_stage_across_dialogues(runs):
    calls = _agent_calls(runs["multiagent_esc"][1])
    stages = "".join(_esc_stage(c) for c in calls)
    # per agent step: analysis, votes, a debate only without a majority, final (both dialogues'
    # openings are complex messages, so step 1 runs the whole pipeline for both)
    import re

    assert re.fullmatch(r"AVD?F(AVD?F|F)", stages), stages
    first = calls[0]
    assert len(first) == 6 and all(r.sampling.max_new_tokens == ESC_ANALYSIS_TOKENS for r in first)
    assert len({r.sampling.seed for r in first}) == 6
    votes = calls[1]
    assert len(votes) == 6 and all(r.sampling.max_new_tokens == ESC_VOTE_TOKENS for r in votes)
    assert all("Reflection of feelings" in r.messages[1]["content"] for r in votes)
    final = calls[stages.index("F")]
    assert len(final) == 2
    assert all("Strategy chosen by the experts" in r.messages[1]["content"] for r in final)
    assert all(r.sampling.max_new_tokens == CONFIG.max_new_tokens_agent for r in final)


def test_multiagent_esc_gate_answers_simple_messages_directly(base_model_path):
    """One real call path per branch: a 'thanks' gets one direct reply, a problem the pipeline."""
    from mascot_dag.lib.evaluation.methods import ASK_SUFFIX, _transcript
    from mascot_dag.lib.llm.transformers_backend import TransformersChat
    from mascot_dag.lib.types import ChatRequest, SamplingParams

    def req(last: str, seed: int) -> ChatRequest:
        user = f"Context:\nA hard week.\n\nConversation so far:\nUser: {last}\n\n{ASK_SUFFIX}"
        return ChatRequest(({"role": "system", "content": GENERIC_SYSTEM},
                            {"role": "user", "content": user}),
                           SamplingParams(max_new_tokens=6, seed=seed))

    rec = Recorder(TransformersChat(base_model_path, models_dir=".", batch_size=8))
    out = multiagent_esc(rec.generate, [req("Thanks, that helps!", 1),
                                        req("My manager yelled at me in front of everyone.", 2)],
                         _transcript, ZERO_SHOT_SYSTEM, ASK_SUFFIX)
    stages = [_esc_stage(c) for c in rec.calls]
    assert stages[:2] == ["A", "V"] and stages[-1] == "F"
    assert len(rec.calls[0]) == 3  # only the complex message is analysed
    final = rec.calls[-1]
    assert "Strategy chosen" not in final[0].messages[1]["content"]
    assert "Strategy chosen" in final[1].messages[1]["content"]
    assert all(o.text.strip() for o in out)
    # the complex reply carries the cost of every call made for it
    assert out[1].completion_tokens > out[0].completion_tokens


def test_self_consistency_batches_samples(runs):
    calls = _agent_calls(runs["self_consistency"][1])
    assert [len(c) for c in calls] == [6, 6]
    assert len({r.sampling.seed for r in calls[0]}) == 6


def test_most_consistent_picks_the_most_agreeing_sample():
    texts = ["the cat sat on the mat", "a dog ran in the park", "the cat sat on a mat"]
    assert most_consistent(texts) in (0, 2)
    assert most_consistent(["x y", "x y z", "x y"]) == 0  # tie between 0 and 2 -> lowest index
    assert most_consistent(["alpha beta", "gamma delta", "alpha beta gamma"]) == 2
    assert most_consistent(["only"]) == 0
    with pytest.raises(ValueError):
        most_consistent([])


def test_extract_cot_response():
    assert extract_cot_response("Thoughts: they are sad.\nResponse: I'm sorry.") == "I'm sorry."
    assert extract_cot_response("thoughts: sad. response:  Hang in there!") == "Hang in there!"
    assert extract_cot_response("Thoughts: They feel bad. That must hurt.") == "That must hurt."
    assert extract_cot_response("Thoughts: they feel bad") == "they feel bad"
    assert extract_cot_response("Just a reply") == "Just a reply"
    assert extract_cot_response("Thoughts: sad. Be kind. Response:") == "Be kind."


def test_sft_examples_from_listener_turns():
    ctx = Context(
        context_id="ed-x",
        source="empatheticdialogues",
        domain="emotional_support",
        situation="s",
        text="t",
        turns=[
            {"speaker": "speaker", "text": "I lost my keys."},
            {"speaker": "listener", "text": "Oh no, where did you last see them?"},
            {"speaker": "speaker", "text": "  "},
            {"speaker": "speaker", "text": "At the gym."},
            {"speaker": "listener", "text": "Maybe call the front desk."},
            {"speaker": "listener", "text": ""},
        ],
    )
    ex = sft_examples([ctx, MEETING])
    assert len(ex) == 2
    first, second = ex[0]["messages"], ex[1]["messages"]
    assert first[0] == {"role": "system", "content": baseline_system("zero_shot")}
    assert [m["role"] for m in first] == ["system", "user", "assistant"]
    assert first[-1]["content"] == "Oh no, where did you last see them?"
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user", "assistant"]
    assert second[3]["content"] == "At the gym."
    assert second[-1]["content"] == "Maybe call the front desk."


def test_an_interrupted_evaluation_resumes_from_the_generation_cache(base_model_path, tmp_path):
    """eval_dialogues generates through the DuckDB cache: a rerun after a stop replays what was
    generated (no model call for it) and gives the same dialogues; only the rest is generated."""
    from mascot_dag.lib.llm.cache import CachedChat
    from mascot_dag.lib.llm.transformers_backend import TransformersChat

    chat = TransformersChat(base_model_path, models_dir=".", batch_size=8)
    db = tmp_path / "m.duckdb"
    for method in ("mascot", "multiagent_esc"):  # director JSON requests; staged pipelines
        stopped = Recorder(chat)
        # "stopped" after the first context: only its dialogue was generated
        run_method(method, SPECS[:1], CachedChat(stopped, db, "smollm2"), CONFIG)
        resumed, again = Recorder(chat), Recorder(chat)
        first = CachedChat(resumed, db, "smollm2")
        full = run_method(method, SPECS, first, CONFIG)
        # every request of the stopped context's dialogue is served from the cache
        assert first.hits == sum(len(c) for c in stopped.calls) > 0 and first.misses > 0
        replay = CachedChat(again, db, "smollm2")
        assert run_method(method, SPECS, replay, CONFIG) == full
        assert again.calls == [] and replay.misses == 0 and replay.hits == first.hits + first.misses
