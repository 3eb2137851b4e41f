"""The director measured fairly: trained vs base on the same states and seeds
(lib/stage2/director_eval.py)
and the director reward that judges a real N-turn block (lib/stage2/director_reward.py)."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import polars as pl
import pytest

from mascot_dag.lib.data.personas import load_personas, personas_of_set
from mascot_dag.lib.data.users import load_user_profiles
from mascot_dag.lib.dialogue.director import director_messages
from mascot_dag.lib.dialogue.spec import DialogueConfig, DialogueRecord, DialogueSpec
from mascot_dag.lib.stage2.director_eval import (
    METRICS,
    ROW_COLUMNS,
    ROW_SCHEMA,
    regressions,
    report_section,
    run_comparison,
    speaker_entropy,
    summarise,
    unit_row,
)
from mascot_dag.lib.stage2.director_reward import DirectorState, GroupBlockReward
from mascot_dag.lib.types import Context, Score

CARDS = load_personas()
SUPPORT = personas_of_set(CARDS, "support")
WORKPLACE = personas_of_set(CARDS, "workplace")
ED = Context(
    context_id="ed-1", source="empatheticdialogues", domain="emotional_support",
    situation="I failed my driving test for the third time.",
    text="Situation: I failed my driving test for the third time.\n"
    "Speaker: I failed again today and I feel so stupid.",
    turns=[{"speaker": "speaker", "text": "I failed again today and I feel so stupid."}],
)
MEETING = Context(
    context_id="qm-1", source="qmsum", domain="product", situation="remote control design",
    text="PM: We need to decide on the remote's buttons.\nUI: Fewer buttons are easier.",
    topic="remote control design",
    queries=[{"query": "What did the group decide about the buttons?", "answer": "fewer"}],
)


# ---- pure logic on constructed rows ------------------------------------------------------------

def _record(did, statuses, speakers, cid="c1", seed=0):
    turns = [{"dialogue_id": did, "turn_idx": 0, "role": "user", "speaker": "user", "text": "hi"}]
    directives = []
    for s, p in zip(statuses, speakers, strict=True):
        idx = len(turns)
        turns.append({"dialogue_id": did, "turn_idx": idx, "role": "agent", "speaker": p,
                      "text": "x"})
        directives.append({"dialogue_id": did, "turn_idx": idx, "speaker": p, "status": s})
    return DialogueRecord({"dialogue_id": did, "context_id": cid, "mode": "support",
                           "seed": seed}, turns, directives)


def _scores(*values):
    return [Score(criterion=f"c{i}", score=v, rationale="", status="ok" if v else "failed")
            for i, v in enumerate(values)]


def test_unit_row_rates_diversity_and_reward():
    rec = _record("d1", ["ok", "retried", "fallback", "ok"], ["anchor", "beacon", "anchor",
                                                              "catalyst"])
    # two blocks: mean ok score 3 -> 0.5 and 5 -> 1.0; a fully failed block is left out
    row = unit_row(rec, "trained", "mascot-director@v1",
                   [_scores(2, 4), _scores(5, 5), _scores(None, None)])
    assert (row["decisions"], row["ok_first"], row["retried"], row["fallback"]) == (4, 2, 1, 1)
    assert (row["valid_first"], row["retry_rate"], row["fallback_rate"]) == (0.5, 0.25, 0.25)
    assert row["distinct_speakers"] == 3.0
    assert row["speaker_entropy"] == pytest.approx(1.5)  # counts 2, 1, 1 of 4
    assert row["group_reward"] == pytest.approx(0.75) and row["blocks"] == 3
    assert json.loads(row["statuses"]) == ["ok", "retried", "fallback", "ok"]
    assert set(row) == set(ROW_COLUMNS)
    failed = unit_row(rec, "base", "base", [_scores(None)])
    assert math.isnan(failed["group_reward"])
    with pytest.raises(ValueError, match="d1: unknown directive status"):
        unit_row(_record("d1", ["maybe"], ["anchor"]), "base", "base", [])
    with pytest.raises(ValueError, match="arm must be one of"):
        unit_row(rec, "other", "base", [])
    assert speaker_entropy(["a", "a"]) == 0.0 and math.isnan(speaker_entropy([]))


def _rows():
    """3 contexts x 2 seeds: the trained arm is valid on the first try more often everywhere."""
    rows = []
    for c in range(3):
        for k in range(2):
            did = f"dircmp:s{k}:c{c}"
            base = _record(did, ["fallback", "ok"], ["anchor", "beacon"], f"c{c}", k)
            trained = _record(did, ["ok", "ok"], ["anchor", "catalyst"], f"c{c}", k)
            rows.append(unit_row(base, "base", "base", [_scores(2, 2)]))
            rows.append(unit_row(trained, "trained", "d@v1", [_scores(3, 3 + (c == 0))]))
    rows.append(unit_row(_record("dircmp:s0:lonely", ["ok"], ["anchor"], "c9"), "base", "base",
                         []))  # unpaired: no trained row, so it is not a unit
    return pl.DataFrame(rows, schema=ROW_SCHEMA)


def test_summary_pairs_units_and_clusters_by_context():
    table = summarise(_rows(), n_boot=500)
    assert table["metric"].to_list() == list(METRICS)
    s = {r["metric"]: SimpleNamespace(**r) for r in table.iter_rows(named=True)}
    v = s["valid_first"]
    assert (v.base, v.trained, v.delta) == (0.5, 1.0, 0.5)
    assert (v.n_units, v.n_contexts) == (6, 3)
    # every unit moved by the same amount, but 3 contexts are too few for a significance mark
    assert v.lo == v.hi == 0.5 and v.mark == ""
    assert s["fallback_rate"].delta == -0.5
    assert not s["fallback_rate"].higher_is_better
    g = s["group_reward"]
    assert g.delta == pytest.approx((0.5 * 4 + 0.625 * 2) / 6 - 0.25)
    assert 0 < g.lo <= g.delta <= g.hi
    assert s["speaker_entropy"].delta == 0.0 and s["speaker_entropy"].mark == ""
    md = "\n".join(report_section(_rows()))
    assert "trained vs base" in md and "| valid_first | ↑ | 0.500 | 1.000 | +0.500" in md
    assert "| 6 / 3 |" in md
    assert "n/a (no director_comparison rows" in "\n".join(report_section(None))
    # trained is better on valid_first and lower on fallback (lower is better): no regression
    assert regressions(table) == []
    worse = table.with_columns(
        pl.when(pl.col("metric") == "group_reward").then(pl.lit(-0.2)).otherwise(pl.col("lo"))
        .alias("lo"),
        pl.when(pl.col("metric") == "group_reward").then(pl.lit(-0.1)).otherwise(pl.col("hi"))
        .alias("hi"))
    assert regressions(worse) == []  # a CI below 0 on 3 contexts is not evidence
    worse = worse.with_columns(n_contexts=pl.lit(8, dtype=pl.Int64))
    (line,) = regressions(worse)
    assert line.startswith("group_reward:") and "[-0.200, -0.100]" in line and "6 units" in line


# ---- director-specific training settings ------------------------------------------------------

def test_director_training_settings_override_only_the_director():
    from mascot_dag.assets.collaboration import director_training
    from mascot_dag.lib.data.personas import load_personas
    from mascot_dag.resources.settings import LineageSettings

    cards = load_personas()
    shared = LineageSettings(director_steps=3)
    gs, lora = director_training(shared, 48, cards)
    assert (gs.learning_rate, gs.max_steps, lora.target_modules) == (3e-4, 3, ("all-linear",))
    own = LineageSettings(director_learning_rate=5e-5, director_lora_targets="q_proj, v_proj")
    gs, lora = director_training(own, 48, cards)
    assert (gs.learning_rate, lora.target_modules) == (5e-5, ("q_proj", "v_proj"))
    # structured directives: GRPO gets the directive regex (applied on TRL's vLLM path only)
    pattern = re.compile(gs.structured_regex)
    for pid in ("anchor", "devils_advocate"):  # one director serves both rosters
        assert pattern.fullmatch(json.dumps({"speaker": pid, "action": "ask", "tone": "calm"}))
    assert not pattern.fullmatch(json.dumps({"speaker": "nobody", "action": "a", "tone": "b"}))
    gs, _ = director_training(LineageSettings(director_structured=False), 48, cards)
    assert gs.structured_regex is None


# ---- real tiny model ----------------------------------------------------------------------------

class Recorder:
    """Records every request batch, then calls the real model."""

    def __init__(self, chat):
        self.chat, self.calls = chat, []

    def generate(self, requests):
        self.calls.append(list(requests))
        return self.chat.generate(requests)


class CountingJudge:
    """The real embedded judge; keeps the blocks it was asked to score."""

    def __init__(self, judge):
        self.judge, self.blocks = judge, []
        self.name = judge.name

    def score_blocks(self, items):
        self.blocks += [i.turns for i in items]
        return self.judge.score_blocks(items)


@pytest.fixture(scope="module")
def chat(base_model_path):
    from mascot_dag.lib.llm.transformers_backend import TransformersChat

    return TransformersChat(base_model_path, models_dir=".", batch_size=8)


@pytest.fixture(scope="module")
def judge():
    from mascot_dag.lib.judges.embedded import EmbeddedJudge

    return EmbeddedJudge()


@pytest.fixture(scope="module")
def director_lora(chat, base_model_path, tmp_path_factory):
    """A director adapter that differs from the base: a LoRA with random (not zero) B, so the
    comparison has two different directors without a training run."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base_model_path)
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    with torch.no_grad():  # a small random B: a different director that still writes JSON
        for name, w in peft.named_parameters():
            if "lora_B" in name:
                w.mul_(0.05)
    out = tmp_path_factory.mktemp("director_lora")
    peft.save_pretrained(out)
    chat.add_adapter("director-test", str(out))
    return "director-test"


# Shrunk for CPU: 2 agent turns of 12 tokens; the director keeps 48 (a directive is ~30 tokens).
FAST = dict(max_new_tokens_agent=12, max_new_tokens_user=12, max_new_tokens_director=48,
            prompt_style="zero_shot", agents_per_round=1)


@pytest.mark.slow
def test_comparison_on_two_states_is_paired(chat, judge, director_lora):
    profile = load_user_profiles()[0]
    # one agent turn per unit: each unit is one director decision on its opening state
    specs = [DialogueSpec("dircmp:s0:ed-1", ED, "support", SUPPORT, profile, 7, 1),
             DialogueSpec("dircmp:s0:qm-1", MEETING, "meeting", WORKPLACE, None, 8, 1)]
    rec = Recorder(chat)
    rows = run_comparison(specs, rec, DialogueConfig(**FAST), director_lora, judge, block_size=2)
    assert len(rows) == 4 and set(rows["arm"]) == {"base", "trained"}
    assert set(rows.filter(pl.col("arm") == "trained")["director"]) == {director_lora}
    for _, g in rows.group_by("dialogue_id"):
        assert len(g) == 2 and g["seed"].n_unique() == 1 and g["context_id"].n_unique() == 1
    assert ((rows["ok_first"] + rows["retried"] + rows["fallback"]) == rows["decisions"]).all()
    assert (rows["decisions"] == 1).all()  # one decision per agent turn
    assert rows["group_reward"].is_between(0, 1).all() and (rows["blocks"] >= 1).all()
    # the first director call of each arm: the same states and seeds, only the adapter differs
    # (director calls are the ones carrying the directive schema: structured by default)
    first = [c for c in rec.calls if c and c[0].json_schema is not None]
    base_call = first[0]
    trained_call = next(c for c in first if c[0].adapter == director_lora)
    assert [r.messages for r in base_call] == [r.messages for r in trained_call]
    assert [r.sampling.seed for r in base_call] == [r.sampling.seed for r in trained_call]
    assert {r.adapter for r in base_call} == {None}
    s = summarise(rows, n_boot=200)
    assert (s["n_units"] == 2).all() and (s["n_contexts"] == 2).all()
    assert (s["lo"] <= s["delta"] + 1e-9).all() and (s["delta"] <= s["hi"] + 1e-9).all()


def _state(spec: DialogueSpec) -> DirectorState:
    speaker, text = ("user", ED.turns[0]["text"]) if spec.mode == "support" else (
        "moderator", MEETING.queries[0]["query"])
    turns = [{"dialogue_id": spec.dialogue_id, "turn_idx": 0, "role": "user",
              "speaker": speaker, "text": text}]
    msgs = director_messages(spec.context.text, spec.roster,
                             [{"speaker": speaker, "text": text}], spec.mode)
    return DirectorState(spec, turns, None, msgs)


def _directive(speaker: str) -> str:
    return json.dumps({"speaker": speaker, "action": "name the feeling", "tone": "warm"})


@pytest.mark.slow
def test_n_turn_reward_judges_n_turns(chat, judge):
    profile = load_user_profiles()[0]
    ed = _state(DialogueSpec("rollout:ed-1", ED, "support", SUPPORT, profile, 3, 2))
    qm = _state(DialogueSpec("rollout:qm-1", MEETING, "meeting", WORKPLACE, None, 4, 2))
    config = DialogueConfig(**FAST)
    counting = CountingJudge(judge)
    reward = GroupBlockReward([ed, qm], chat.generate, counting, config, block_size=3, horizon=3)
    completions = [_directive("catalyst"), "not a directive", _directive("devils_advocate")]
    rewards = reward(completions, [ed.messages, ed.messages, qm.messages])
    assert rewards[1] == 0.0 and all(0 < r <= 1 for r in (rewards[0], rewards[2]))
    assert len(counting.blocks) == 2 and all(len(b) == 3 for b in counting.blocks)
    support, meeting = counting.blocks
    # the block starts with the directive's turn; none of the state's old turns is in it
    assert support[0]["speaker"] == "catalyst" and meeting[0]["speaker"] == "devils_advocate"
    # support, agents_per_round=1: agent, user, agent (fallback rule, no repeat)
    assert [t["speaker"] == "user" for t in support] == [False, True, False]
    assert support[2]["speaker"] not in ("catalyst", "user")
    assert all(t["speaker"] != "user" for t in meeting)  # meetings: agents only
    assert meeting[1]["speaker"] != meeting[0]["speaker"]
    # horizon 1 (the cheap setting): one new turn after block_size - 1 old ones
    counting.blocks.clear()
    cheap = GroupBlockReward([ed], chat.generate, counting, config, block_size=3, horizon=1)
    cheap([_directive("beacon")], [ed.messages])
    (block,) = counting.blocks
    assert len(block) == 2  # the state has one old turn: it pads, then the new turn
    assert block[0]["text"] == ED.turns[0]["text"] and block[1]["speaker"] == "beacon"


def test_evaluation_report_has_the_director_section(tmp_path):
    from mascot_dag.lib.evaluation.report import ReportInputs, build_report

    data = ReportInputs(pl.DataFrame(), pl.DataFrame(), paper_results=None,
                        director_comparison=_rows())
    md = build_report(data, tmp_path).markdown.read_text(encoding="utf-8")
    assert "## Director: trained vs base" in md and "| group_reward | ↑ |" in md
