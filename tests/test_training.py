"""Training wrappers (reward model, GRPO, SFT), reward functions and MLflow tracking.

Real components: the embedded SmolLM2-135M, TRL 1.16 on CPU, a real MLflow sqlite store. Every
training setting is shrunk to keep this file well under ~150 s on 2 cores; each shrink is commented.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest

from mascot_dag.lib.stage1.rewards import (
    combined,
    completion_text,
    format_reward,
    novelty_reward,
    reward_model_reward,
)
from mascot_dag.lib.training.config import (
    GRPOSettings,
    LoraSettings,
    RewardModelSettings,
    SFTSettings,
)

# Short texts on purpose: CPU cost is proportional to tokens (~0.27 GFLOP per token per pass).
SYSTEM = {"role": "system", "content": "You are The Anchor, a calm validator."}
SITUATIONS = [
    "I failed my driving test again.",
    "My best friend moved to another city.",
    "I was passed over for a promotion.",
    "My dog has been sick all week.",
    "I can't sleep before my exams.",
    "My parents keep arguing at home.",
    "I feel lonely since I started my new job.",
    "I forgot my sister's birthday.",
    "My project at work got cancelled.",
    "I had a panic attack on the bus.",
]
LORA = LoraSettings()  # r=8 on q_proj, v_proj: the configuration the lineage trains


def prompt(text: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": text}]


def pairs(n: int = len(SITUATIONS)) -> list[dict]:
    return [
        {
            "prompt": prompt(s),
            "chosen": "That sounds painful; it makes sense you feel this way.",
            "rejected": "As an AI language model, I cannot help.",
        }
        for s in SITUATIONS[:n]
    ]


@pytest.fixture(autouse=True, scope="module")
def two_threads():
    import torch

    # The test machines have 2 cores shared with other jobs; more threads only thrash.
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


def snapshot_callback():
    """A callback that copies the trainable parameters at the start and at the end of training."""
    from transformers import TrainerCallback

    class Snapshot(TrainerCallback):
        before: dict = {}
        after: dict = {}
        steps_run = 0

        def _copy(self, model):
            return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.before = self._copy(model)

        def on_step_end(self, args, state, control, **kwargs):
            self.steps_run += 1

        def on_train_end(self, args, state, control, model=None, **kwargs):
            self.after = self._copy(model)

        def changed(self, fragment: str) -> list[str]:
            import torch

            names = [n for n in self.before if fragment in n]
            assert names, f"no trainable parameter named *{fragment}*: {list(self.before)[:5]}"
            return [n for n in names if not torch.equal(self.before[n], self.after[n])]

    return Snapshot()


# ---------------------------------------------------------------- reward functions (no model)


def as_message(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


GOOD = "That sounds really hard. It makes sense that you feel shaken; I'm here with you."


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD, 1.0),
        ("As an AI language model, I cannot feel, but that sounds hard.", 0.8),  # role break
        ("The Catalyst: what evidence do you have that you failed?", 0.8),  # another agent's turn
        (GOOD + "\nUser: thanks, that helps a lot.", 0.8),  # writes the user's next line
        ("That sounds really hard and I think that you", 0.8),  # cut off mid-clause
        ("Your next turn will be to write your next turn.", 0.8),  # talks about the turn
        ("Ok.", round(0.2 * 3 / 20 + 0.8, 6)),  # too short: partial length credit
        ("x" * 800, round(0.2 * 400 / 800 + 0.6, 6)),  # too long, and cut off
        ("It hurts. And I think that you", round(0.2 * 9 / 30 + 0.8, 6)),  # 9 of 30 chars done
        ("so so so so so so so so so so.", 0.8),  # one word repeated: no length credit
        ("   ", 0.0),  # empty
        ("The Catalyst: As an AI, I can't", 0.4),  # three failures
    ],
)
def test_format_reward_cases(text, expected):
    reward = format_reward(min_chars=20, max_chars=400, other_names=["The Catalyst", "Beacon"])
    assert reward([as_message(text)]) == [pytest.approx(expected)]
    assert reward([text]) == reward([as_message(text)])  # plain strings score the same


def test_format_reward_is_named_and_picklable():
    reward = format_reward(other_names=["The Catalyst"])
    assert reward.__name__ == "format_reward"  # TRL logs rewards/format_reward/mean
    clone = pickle.loads(pickle.dumps(reward))
    texts = [as_message(GOOD), as_message("The Catalyst: and what would you tell a friend?")]
    assert clone(texts) == reward(texts) == [1.0, 0.8]


def test_combined_weights_and_none():
    def only_long(completions, **kwargs):
        return [1.0 if len(completion_text(c)) > 30 else None for c in completions]

    r = combined([format_reward(), only_long], [0.5, 2.0], name="composite")
    assert r.__name__ == "composite"
    assert r([GOOD, "Ok, fine then."]) == [pytest.approx(2.5), pytest.approx(0.5 * (0.14 + 0.8))]
    with pytest.raises(ValueError, match="one weight per reward"):
        combined([format_reward()], [1.0, 2.0])


def test_settings_reject_bad_values():
    with pytest.raises(ValueError, match="multiple of num_generations"):
        GRPOSettings(batch_size=3, num_generations=2)
    with pytest.raises(ValueError, match="bf16=False on CPU"):
        SFTSettings(bf16=True, use_cpu=True)
    with pytest.raises(ValueError, match="heldout_fraction"):
        RewardModelSettings(heldout_fraction=1.0)
    assert LoraSettings(target_modules=["q_proj"]).target_modules == ("q_proj",)


# ---------------------------------------------------------------- reward model


def test_split_pairs_is_deterministic_and_order_free():
    from mascot_dag.lib.training.reward_model import split_pairs

    train, held = split_pairs(pairs(), 0.2, seed=0)
    assert len(held) == 2 and len(train) == 8
    assert not {p["prompt"][1]["content"] for p in held} & {
        p["prompt"][1]["content"] for p in train
    }
    _, held_reversed = split_pairs(pairs()[::-1], 0.2, seed=0)
    assert sorted(map(str, held_reversed)) == sorted(map(str, held))
    assert split_pairs(pairs(), 0.0, seed=0) == (pairs(), [])


def test_rm_split_by_context_never_shares_a_candidate_between_train_and_heldout():
    """Pairs of one context share candidates; the held-out side must test generalisation to new
    contexts, so a candidate (and a context) is never on both sides."""
    from mascot_dag.lib.training.reward_model import split_pairs

    rows = []
    for ctx in range(12):
        cands = [f"ctx{ctx}|{p}|{k}" for p in ("anchor", "catalyst") for k in range(3)]
        for i, chosen in enumerate(cands):
            for rejected in cands[i + 1:]:
                rows.append({"group": f"ctx{ctx}", "chosen": chosen, "rejected": rejected,
                             "prompt": [{"role": "user", "content": f"situation {ctx}"}]})
    train, held = split_pairs(rows, 0.25, seed=0)
    assert held and train and len(train) + len(held) == len(rows)
    train_cands = {c for p in train for c in (p["chosen"], p["rejected"])}
    held_cands = {c for p in held for c in (p["chosen"], p["rejected"])}
    assert not train_cands & held_cands
    assert len({p["group"] for p in held}) == 3  # 25% of 12 contexts, whole
    # a pair-level split of the same rows WOULD share candidates: the test can fail
    no_groups = [{k: v for k, v in p.items() if k != "group"} for p in rows]
    t2, h2 = split_pairs(no_groups, 0.25, seed=0)
    assert {c for p in t2 for c in (p["chosen"], p["rejected"])} & {
        c for p in h2 for c in (p["chosen"], p["rejected"])}


@pytest.mark.slow
def test_reward_model_trains_and_scores(base_model_path, tmp_path):
    from mascot_dag.lib.training.reward_model import RewardScorer, train_reward_model

    snap = snapshot_callback()
    settings = RewardModelSettings(
        max_steps=2,  # shrunk from 50: enough to move the weights
        batch_size=2,  # shrunk from 8 pairs
        learning_rate=1e-3,  # large so that 2 steps visibly move the score head
        heldout_fraction=0.2,  # 1 of the 5 pairs
        max_length=128,  # shrunk from 384; the test pairs are ~40 tokens
        save_steps=100,  # no mid-run checkpoint needed here
        train_accuracy_pairs=2,  # shrunk from 256: scoring costs a forward pass per response
    )
    result = train_reward_model(
        base_model_path, pairs(5), settings, LORA, tmp_path / "rm", callbacks=[snap]
    )

    assert result.steps == 2 and [s for s, _ in result.loss_curve] == [1, 2]
    assert (result.n_train, result.n_heldout) == (4, 1)
    assert result.heldout_accuracy is not None and 0.0 <= result.heldout_accuracy <= 1.0
    assert result.train_accuracy is not None and 0.0 <= result.train_accuracy <= 1.0
    assert 0.0 < result.trainable_percent < 1.0  # LoRA + the score head only
    assert snap.changed("lora_B"), "LoRA weights did not change"
    assert snap.changed("score"), "the score head did not train (modules_to_save)"
    assert result.seconds_per_step and result.seconds_per_step > 0

    # The saved adapter carries the trained head: a fresh scorer reproduces the held-out margins.
    scorer = RewardScorer(base_model_path, result.adapter_dir, max_length=128)
    held_acc, margins = scorer.accuracy(_heldout(settings))
    assert held_acc == result.heldout_accuracy
    assert margins == pytest.approx(result.heldout_margins, abs=1e-4)

    reward = reward_model_reward(scorer, weight=2.0)
    assert reward.__name__ == "reward_model"
    p = [prompt(SITUATIONS[0])] * 2
    c = [as_message("I'm here."), as_message("whatever")]
    assert reward(c, prompts=p) == pytest.approx([2 * s for s in scorer.score(p, c)])
    with pytest.raises(ValueError, match="needs the prompts"):
        reward(c)
    # A `reward_prompt` column (the RM's own short prompt form) wins over the policy prompt.
    short = [prompt(SITUATIONS[1])] * 2
    assert reward(c, prompts=p, reward_prompt=short) == pytest.approx(
        [2 * s for s in scorer.score(short, c)]
    )
    assert scorer.score(short, c) != pytest.approx(scorer.score(p, c))


def _heldout(settings: RewardModelSettings) -> list[dict]:
    from mascot_dag.lib.training.reward_model import split_pairs

    return split_pairs(pairs(5), settings.heldout_fraction, settings.seed)[1]


# ---------------------------------------------------------------- GRPO


def hash_reward(completions, **kwargs):
    """A reward that differs between any two different texts, so every group has a gradient."""
    return [
        int(hashlib.sha256(completion_text(c).encode()).hexdigest()[:6], 16) / 0xFFFFFF
        for c in completions
    ]


def grpo_settings(**overrides) -> GRPOSettings:
    base = dict(
        max_steps=2,  # shrunk from 20
        batch_size=2,  # shrunk from 4: one prompt x 2 generations per step
        num_generations=2,  # the smallest group GRPO accepts
        max_completion_length=8,  # shrunk from 32 tokens: generation dominates a CPU step
        learning_rate=1e-3,  # large so that 2 steps visibly move the LoRA weights
        beta=0.04,  # > 0 so that the KL curve is logged
        temperature=1.0,
        save_steps=100,
    )
    return GRPOSettings(**{**base, **overrides})


class ColumnSeen:
    """A zero reward that records the `tag` dataset column TRL hands to reward functions."""

    __name__ = "column_seen"

    def __init__(self) -> None:
        self.seen: list = []

    def __call__(self, completions, tag=None, **kwargs):
        self.seen += list(tag or [])
        return [0.0] * len(completions)


def test_grpo_columns_are_validated():
    from mascot_dag.lib.training.grpo import _clean_prompts

    rows = _clean_prompts([prompt("a"), prompt("b")], {"tag": ["x", "y"]})
    assert [r["tag"] for r in rows] == ["x", "y"] and rows[0]["prompt"] == prompt("a")
    with pytest.raises(ValueError, match="'tag' needs one value per prompt"):
        _clean_prompts([prompt("a"), prompt("b")], {"tag": ["x"]})
    with pytest.raises(ValueError, match="reserved"):
        _clean_prompts([prompt("a")], {"prompt": ["x"]})
    with pytest.raises(ValueError, match="column 'rp' #0: every message needs"):
        _clean_prompts([prompt("a")], {"rp": [[{"text": "no role"}]]})


@pytest.mark.slow
def test_grpo_trains_and_resumes_after_interruption(base_model_path, tmp_path):
    """One GRPO run interrupted after step 1 (StopAfterSteps), then resumed to max_steps=2.

    A single two-step run covers both properties: the resumed step must change the LoRA weights
    and log rewards/KL, and it must start from the checkpoint instead of from scratch.
    """
    from mascot_dag.lib.training.callbacks import ProgressLog
    from mascot_dag.lib.training.grpo import StopAfterSteps, train_grpo_adapter

    seen = ColumnSeen()
    args = (
        base_model_path,
        [prompt(s) for s in SITUATIONS[:2]],
        [format_reward(other_names=["The Catalyst"]), hash_reward, seen, novelty_reward()],
        [1.0, 1.0, 0.0, 0.5],
        grpo_settings(save_steps=1),  # checkpoint every step so that the interruption loses nothing
        LORA,
        tmp_path / "grpo",
    )
    # the novelty reward reads its column; the first prompt shows no earlier turn (None there)
    columns = {"tag": ["first", "second"],
               "earlier_turns": ["[]", json.dumps(["I hear you, that sounds hard."])],
               "shared_context": ["I failed my driving test.", "My dog is sick."]}
    first = train_grpo_adapter(*args, callbacks=[StopAfterSteps(1)], columns=columns)
    assert first.steps == 1 and not first.completed and first.resumed_from is None
    assert (tmp_path / "grpo" / "checkpoints" / "checkpoint-1").is_dir()

    snap = snapshot_callback()
    lines: list[str] = []
    second = train_grpo_adapter(*args, callbacks=[snap, ProgressLog(lines.append, "GRPO t")],
                                columns=columns)
    # one progress line for the one step this run did, timed from its own start
    assert len(lines) == 1 and lines[0].startswith("GRPO t: step 2/2, "), lines
    assert "nan s/step" not in lines[0] and "reward" in lines[0], lines
    assert second.resumed_from is not None and second.resumed_from.endswith("checkpoint-1")
    assert snap.steps_run == 1, "the resumed run should only do the missing step"
    assert second.steps == 2 and second.completed
    state = json.loads(
        (tmp_path / "grpo" / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text()
    )
    assert state["global_step"] == 2
    assert snap.changed("lora_B"), "GRPO did not change the LoRA weights"

    # The curves span both runs: step 1 comes from the checkpoint's history.
    assert [s for s, _ in second.reward_curve] == [1, 2]
    assert [s for s, _ in second.kl_curve] == [1, 2]
    assert set(second.reward_func_curves) == {"format_reward", "hash_reward", "column_seen",
                                              "novelty_reward"}
    # Each step scores one prompt's 2 generations; the column travels with its prompt.
    assert len(seen.seen) == 4 and set(seen.seen) <= {"first", "second"}
    assert second.reward_start == first.reward_end
    assert 0.0 < second.trainable_percent < 1.0
    assert second.seconds_per_step and second.seconds_per_step > 0
    assert (second.adapter_dir / "adapter_config.json").exists()


# ---------------------------------------------------------------- SFT


@pytest.mark.slow
def test_sft_changes_lora(base_model_path, tmp_path):
    from mascot_dag.lib.training.sft import train_sft_adapter

    examples = [
        {"messages": [*prompt(s), {"role": "assistant", "content": "That sounds hard; I'm here."}]}
        for s in SITUATIONS[:4]
    ]
    snap = snapshot_callback()
    settings = SFTSettings(
        max_steps=2,  # shrunk from 20
        batch_size=2,  # shrunk from 4
        learning_rate=1e-3,  # large so that 2 steps visibly move the LoRA weights
        max_length=128,  # shrunk from 384
        save_steps=100,
    )
    result = train_sft_adapter(
        base_model_path, examples, settings, LORA, tmp_path / "sft", callbacks=[snap]
    )
    assert result.steps == 2 and [s for s, _ in result.loss_curve] == [1, 2]
    assert all(loss > 0 for _, loss in result.loss_curve)
    assert snap.changed("lora_B"), "SFT did not change the LoRA weights"
    assert (result.adapter_dir / "adapter_model.safetensors").exists()
    with pytest.raises(ValueError, match="must end with the assistant reply"):
        train_sft_adapter(base_model_path, [{"messages": prompt("hi")}], settings, LORA, tmp_path)


# ---------------------------------------------------------------- MLflow


def make_adapter(base_model_path: str, dst: Path, seed: int) -> dict:
    """A LoRA adapter with random (non-zero) B matrices; returns its weights for comparison."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_model_path)
    peft_model = get_peft_model(model, LORA.to_peft("CAUSAL_LM"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
    peft_model.save_pretrained(str(dst))
    AutoTokenizer.from_pretrained(base_model_path).save_pretrained(str(dst))
    return {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_B" in n}


@pytest.mark.slow
def test_mlflow_registry_roundtrip(base_model_path, tmp_path, home):
    import torch
    from mlflow import MlflowClient
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mascot_dag.resources.tracking import MLflowResource

    assert MLflowResource().uri == f"sqlite:///{home.resolve()}/mlflow.db"  # default: MASCOT_HOME
    mlf = MLflowResource(
        tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=str(tmp_path / "artifacts")
    )
    mlf.configure()
    name = "mascot-persona-anchor"
    weights, versions = [], []
    for seed in (1, 2):
        adapter = tmp_path / f"adapter-{seed}"
        weights.append(make_adapter(base_model_path, adapter, seed))
        with mlf.start_run("persona_alignment", f"anchor-{seed}", {"persona": "anchor"}) as run:
            mlf.log_params({"seed": seed, "lora": {"r": 8}})
            assert mlf.log_curve("reward", [(1, 0.1), (2, 0.3), (3, float("nan"))]) == 2
            mlf.log_adapter(adapter)
        versions.append(mlf.register_version(name, run, tags={"persona": "anchor"}))
    assert versions == ["1", "2"]
    assert mlf.latest_version(name) == "2"
    assert mlf.latest_version("mascot-persona-nobody") is None
    assert mlf.version_run_params(name, "1")["seed"] == "1"
    assert mlf.version_run_params(name, "2")["lora"] == '{"r": 8}'
    history = MlflowClient().get_metric_history(run.info.run_id, "reward")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.3)]
    assert Path(run.info.artifact_uri.removeprefix("file://")).is_relative_to(tmp_path)

    assert mlf.get_alias_version(name, "champion") is None
    mlf.set_alias(name, "champion", versions[1])
    assert mlf.get_alias_version(name, "champion") == "2"

    def lora_b(adapter_dir: Path) -> dict:
        base = AutoModelForCausalLM.from_pretrained(base_model_path)
        model = PeftModel.from_pretrained(base, str(adapter_dir))
        return model, {n: p for n, p in model.named_parameters() if "lora_B" in n}

    v1_dir = mlf.download_adapter(f"models:/{name}/1", tmp_path / "dl-v1")
    model, loaded = lora_b(v1_dir)
    some = sorted(weights[0])[0]
    assert torch.equal(loaded[some], weights[0][some])
    assert not torch.equal(loaded[some], weights[1][some])

    tok = AutoTokenizer.from_pretrained(str(v1_dir))
    ids = tok.apply_chat_template(
        prompt("I failed my exam."),
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    new_tokens = out[0, ids["input_ids"].shape[1] :]
    assert len(new_tokens) >= 1 and tok.decode(new_tokens, skip_special_tokens=True).strip()

    champion_dir = mlf.download_adapter(f"models:/{name}@champion", tmp_path / "dl-champion")
    _, loaded = lora_b(champion_dir)
    assert torch.equal(loaded[some], weights[1][some])


def test_judge_reward_rewards_the_persona_the_judge_recognises():
    """The judge's consistency as a GRPO reward (judge_reward_weight): for Action Guide a concrete
    plan outscores an emotional reflection and the reverse for the Anchor, on the same context
    (the real embedded judge: MiniLM from its PyPI package)."""
    from test_dialogue import ED, SUPPORT

    from mascot_dag.lib.judges.embedded import EmbeddedJudge
    from mascot_dag.lib.stage1.rewards import judge_consistency_reward

    judge = EmbeddedJudge()
    cards = {c.persona_id: c for c in SUPPORT}
    plan = [{"role": "assistant", "content": "Tonight, list the three hardest topics; tomorrow "
             "book a practice session at 9 and ask your tutor for one past paper."}]
    feeling = "That sounds so painful. Your disappointment makes complete sense right now."
    guide = judge_consistency_reward(judge, cards["action_guide"], SUPPORT)
    anchor = judge_consistency_reward(judge, cards["anchor"], SUPPORT)
    assert guide.__name__ == "judge_consistency"
    g = guide([plan, feeling], context_text=[ED.text] * 2)
    a = anchor([plan, feeling], context_text=[ED.text] * 2)
    assert all(1.0 <= x <= 5.0 for x in g + a)
    assert g[0] > g[1] and a[1] > a[0]
    with pytest.raises(ValueError, match="context_text"):
        guide([feeling])
