"""Stage 1 at the demo's OWN settings (no test-only learning rate): GRPO from pi_SFT-style init
moves the adapter enough to change sampled outputs, and the paired probe sees it.

The reward here is the embedded judge's persona fidelity margin plus the format reward: the
signal the reward model is trained to reproduce (the lineage test covers the trained RM). It
keeps the test to one training run of the profile's own steps, learning rate, schedule, group
size and LoRA targets.
"""

from __future__ import annotations

import polars as pl
import pytest

from mascot_dag.assets.contexts import DEMO_ED
from mascot_dag.lib.data.empathetic import load_empathetic_dialogues
from mascot_dag.lib.data.personas import load_personas, personas_of_set
from mascot_dag.lib.data.split import assign_split
from mascot_dag.lib.dialogue.engine import opening_agent_messages
from mascot_dag.lib.judges.base import ResponseItem
from mascot_dag.lib.stage1 import probe
from mascot_dag.lib.stage1.rewards import completion_text, format_reward
from mascot_dag.lib.types import ChatRequest, SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def judge():
    from mascot_dag.lib.judges.embedded import EmbeddedJudge

    return EmbeddedJudge()


class JudgeFidelity:
    """Embedded-judge consistency (1-5) of each completion as the persona."""

    __name__ = "judge_fidelity"

    def __init__(self, judge, card, roster, contexts):
        self.judge, self.card, self.roster, self.contexts = judge, card, roster, contexts

    def __call__(self, completions, context_text=None, **kwargs):
        items = [ResponseItem(ctx, self.card, self.roster, completion_text(c), [])
                 for c, ctx in zip(completions, context_text, strict=True)]
        return [next(s.score for s in ss if s.criterion == "consistency")
                for ss in self.judge.score_responses(items)]


def test_grpo_at_demo_settings_changes_outputs_and_the_probe_sees_it(
    base_model_path, judge, tmp_path
):
    from mascot_dag.lib.llm.transformers_backend import TransformersChat
    from mascot_dag.lib.training.common import lora_relative_change
    from mascot_dag.lib.training.config import grpo_settings, lora_settings
    from mascot_dag.lib.training.grpo import train_grpo_adapter
    from mascot_dag.profiles import settings_for

    demo = settings_for("embedded")
    roster = personas_of_set(load_personas(), "support")
    card = next(c for c in roster if c.persona_id == "catalyst")
    contexts = load_empathetic_dialogues(DEMO_ED).contexts
    train = [c for c in contexts if assign_split(c.context_id, demo.eval_ratio) == "train"]
    held = [c for c in contexts if assign_split(c.context_id, demo.eval_ratio) == "eval"][:6]
    train = train[: demo.max_train_contexts]
    prompts = [opening_agent_messages(card, c, roster, demo.prompt_style) for c in train]
    gs = grpo_settings(demo, demo.grpo_completion_tokens)
    lora = lora_settings(demo)
    # the profile's own optimisation settings, not a test-only learning rate
    assert gs.learning_rate == demo.grpo_learning_rate and gs.max_steps == demo.grpo_steps
    assert gs.num_generations >= 4
    rewards = [JudgeFidelity(judge, card, roster, train),
               format_reward(other_names=[c.name for c in roster if c is not card])]
    result = train_grpo_adapter(
        base_model_path, prompts, rewards, [1.0, demo.format_reward_weight], gs, lora,
        tmp_path / "grpo", columns={"context_text": [c.text for c in train]})
    assert result.steps == demo.grpo_steps
    moved = lora_relative_change(result.adapter_dir, base_model_path)
    assert moved > 3e-4, f"adapter moved the weights by only {moved:.2e} (relative)"

    chat = TransformersChat(base_model_path, tmp_path / "models", batch_size=8)
    chat.add_adapter("catalyst", str(result.adapter_dir))
    units, reqs = [], []
    for c in held:
        for s in range(2):
            units.append(probe.ProbeUnit(c.context_id, card.persona_id, s))
            reqs.append((tuple(opening_agent_messages(card, c, roster, demo.prompt_style)),
                         SamplingParams(demo.max_new_tokens, demo.temperature, demo.top_p, 11 + s)))
    base = [r.text for r in chat.generate([ChatRequest(m, sp) for m, sp in reqs])]
    adapted = [r.text for r in chat.generate([ChatRequest(m, sp, "catalyst") for m, sp in reqs])]
    table = probe.unit_table(units, base, adapted)
    ctx = {c.context_id: c.text for c in held}
    scores = judge.score_responses(
        [ResponseItem(ctx[cid], card, roster, text, [])
         for cid, text in table.select("context_id", "text").rows()])

    def criterion(name: str) -> pl.Series:
        return pl.Series([next(s.score for s in ss if s.criterion == name) for ss in scores],
                         dtype=pl.Float64)

    from mascot_dag.lib.stage1.readers import LexicalReader, load_reference_utterances

    clf = LexicalReader(load_reference_utterances("support"))
    identifiable = [float(p == "catalyst") for p in clf.predict(table["text"].to_list())]
    table = table.with_columns(consistency=criterion("consistency"),
                               relevance=criterion("response_relevance"), copied=pl.lit(0.0),
                               identifiable=pl.Series(identifiable))
    summary = probe.summarise(table).filter(pl.col("persona") == "all").row(0, named=True)
    # the adapter changed what is sampled with the same prompts and seeds
    assert summary["identical_share"] < 0.5, summary
    # and the probe's measure of the trained signal moved the right way on this fixed set
    assert summary["consistency_gain"] > 0, summary
