"""Pairwise reward model on persona preference pairs (Stage 1), and a scorer that serves it.

TRL's RewardTrainer (Bradley-Terry loss, -log sigmoid(r_chosen - r_rejected)) trains a LoRA adapter
plus the scalar `score` head of `AutoModelForSequenceClassification(num_labels=1)`. The head is
freshly initialised, so it must train too: `modules_to_save=["score"]` saves it with the adapter.
A deterministic hash split holds out pairs; accuracy = share of pairs where the chosen response
scores strictly higher than the rejected one.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mascot_dag.lib.stage1.rewards import completion_text
from mascot_dag.lib.training.common import (
    Curve,
    clean_messages,
    curve,
    load_tokenizer,
    prepare_checkpoints,
    quiet_trainer,
    save_adapter,
    trainable_percent,
    trainer_kwargs,
)
from mascot_dag.lib.training.config import LoraSettings, RewardModelSettings


@dataclass
class RewardModelResult:
    adapter_dir: Path
    loss_curve: Curve
    train_accuracy: float | None
    heldout_accuracy: float | None  # None when no pair was held out
    n_train: int
    n_heldout: int
    trainable_percent: float
    steps: int
    seconds_per_step: float | None
    resumed_from: str | None = None
    heldout_margins: list[float] = field(default_factory=list)  # score(chosen) - score(rejected)
    heldout_groups: list[str] = field(default_factory=list)  # each held-out pair's context

    def heldout_accuracy_ci(self, seed: int = 0) -> dict[str, float]:
        """Held-out accuracy with a 95% CI that resamples contexts (pairs of one context share
        candidates, so they are not independent): {"mean", "lo", "hi", "n_units", ...}."""
        from mascot_dag.lib.evaluation.stats import paired_cluster_bootstrap

        groups = self.heldout_groups or [str(i) for i in range(len(self.heldout_margins))]
        correct = [1.0 if m > 0 else 0.0 for m in self.heldout_margins]
        return paired_cluster_bootstrap(groups, correct, seed=seed)


def split_pairs(
    pairs: Sequence[dict], heldout_fraction: float, seed: int
) -> tuple[list[dict], list[dict]]:
    """Deterministic (train, heldout) split by GROUP: the groups (a pair's "group", its context
    id; the pair itself when absent) with the lowest seeded hashes are held out whole.

    Splitting by context means no candidate, and no situation, is on both sides: pairs of one
    context share candidates, so a pair-level split would let the held-out side test memory.
    Hashing the content (not the position) makes the split independent of the rows' order.
    """
    if heldout_fraction <= 0 or len(pairs) < 2:
        return list(pairs), []

    def group(p: dict) -> str:
        if "group" in p:
            return json.dumps([seed, str(p["group"])])
        return json.dumps([seed, p["prompt"], p["chosen"], p["rejected"]], sort_keys=True)

    groups = sorted({group(p) for p in pairs},
                    key=lambda g: hashlib.sha256(g.encode("utf-8")).hexdigest())
    if len(groups) < 2:
        return list(pairs), []
    n_held = min(len(groups) - 1, max(1, math.ceil(heldout_fraction * len(groups))))
    held = set(groups[:n_held])
    return [p for p in pairs if group(p) not in held], [p for p in pairs if group(p) in held]


class RewardScorer:
    """Scores (prompt messages, completion) with a trained reward model; batched, no gradients.

    `RewardScorer(base_model, adapter_dir).score([[sys, user]], ["Reply..."]) -> [1.7]`
    """

    def __init__(
        self,
        base_model: str | None = None,
        adapter_dir: str | Path | None = None,
        *,
        batch_size: int = 8,
        max_length: int = 384,
        device: str | None = None,
        _model: Any = None,
        _tokenizer: Any = None,
    ) -> None:
        import torch

        self.batch_size = batch_size
        self.max_length = max_length
        if _model is not None:
            self.model, self.tokenizer = _model, _tokenizer
        else:
            if base_model is None or adapter_dir is None:
                raise ValueError("RewardScorer needs base_model and adapter_dir")
            from peft import PeftModel
            from transformers import AutoModelForSequenceClassification

            adapter_dir = Path(adapter_dir)
            if not (adapter_dir / "adapter_config.json").exists():
                raise FileNotFoundError(
                    f"{adapter_dir} has no adapter_config.json: train the reward model first "
                    "(train_reward_model) or point to its 'adapter' folder"
                )
            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            self.tokenizer = load_tokenizer(str(adapter_dir))
            base = AutoModelForSequenceClassification.from_pretrained(base_model, num_labels=1)
            base.config.pad_token_id = self.tokenizer.pad_token_id
            self.model = PeftModel.from_pretrained(base, str(adapter_dir)).to(device)
        self.model.eval()

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, **kwargs: Any) -> RewardScorer:
        """Wrap an in-memory sequence-classification model (e.g. right after training)."""
        return cls(_model=model, _tokenizer=tokenizer, **kwargs)

    def score(
        self, prompts_messages: Sequence[list[dict]], completions: Sequence[Any]
    ) -> list[float]:
        """One scalar per (prompt, completion); completions are str or assistant message lists."""
        import torch

        if len(prompts_messages) != len(completions):
            raise ValueError(
                f"RewardScorer.score: {len(prompts_messages)} prompts but "
                f"{len(completions)} completions"
            )
        pad_id = self.tokenizer.pad_token_id
        device = next(self.model.parameters()).device
        seqs = []
        for prompt, completion in zip(prompts_messages, completions, strict=True):
            messages = [*prompt, {"role": "assistant", "content": completion_text(completion)}]
            # Same tokenisation as TRL's RewardTrainer (whole conversation via the chat template);
            # overlong inputs keep their end, where the response is.
            ids = self.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)
            seqs.append(list(ids["input_ids"])[-self.max_length :])
        scores: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(seqs), self.batch_size):
                chunk = seqs[start : start + self.batch_size]
                width = max(len(s) for s in chunk)
                # Right padding: the classifier reads the last non-pad token of each row.
                input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, s in enumerate(chunk):
                    input_ids[row, : len(s)] = torch.tensor(s)
                    mask[row, : len(s)] = 1
                out = self.model(input_ids=input_ids.to(device), attention_mask=mask.to(device))
                scores.extend(out.logits[:, 0].float().cpu().tolist())
        return scores

    def accuracy(self, pairs: Sequence[dict]) -> tuple[float | None, list[float]]:
        """(share of pairs with score(chosen) > score(rejected), margins); (None, []) when empty."""
        if not pairs:
            return None, []
        prompts = [p["prompt"] for p in pairs]
        chosen = self.score(prompts, [p["chosen"] for p in pairs])
        rejected = self.score(prompts, [p["rejected"] for p in pairs])
        margins = [c - r for c, r in zip(chosen, rejected, strict=True)]
        return sum(m > 0 for m in margins) / len(margins), margins


def train_reward_model(
    base_model: str,
    pairs: list[dict],
    settings: RewardModelSettings,
    lora: LoraSettings,
    output_dir: Path,
    resume: bool = True,
    callbacks: list | None = None,
) -> RewardModelResult:
    """Train the pairwise reward model; adapter + score head + tokenizer -> output_dir/adapter."""
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    from mascot_dag.lib.training.callbacks import StepTimer

    clean = []
    for i, p in enumerate(pairs):
        where = f"preference pair #{i}"
        for k in ("chosen", "rejected"):
            if not isinstance(p.get(k), str) or not p[k].strip():
                raise ValueError(f"{where}: '{k}' must be a non-empty string")
        clean.append(
            {
                "prompt": clean_messages(p.get("prompt"), f"{where}: 'prompt'"),
                "chosen": p["chosen"],
                "rejected": p["rejected"],
                **({"group": str(p["group"])} if "group" in p else {}),
            }
        )
    train, heldout = split_pairs(clean, settings.heldout_fraction, settings.seed)
    if not train:
        raise ValueError(
            "train_reward_model got no preference pairs: build persona_preference_pairs first"
        )

    def as_conversation(p: dict) -> dict:
        # Conversational preference format: TRL renders prompt + answer through the chat template.
        return {
            "prompt": p["prompt"],
            "chosen": [{"role": "assistant", "content": p["chosen"]}],
            "rejected": [{"role": "assistant", "content": p["rejected"]}],
        }

    output_dir = Path(output_dir)
    ckpt_dir, last = prepare_checkpoints(output_dir, resume)
    tokenizer = load_tokenizer(base_model)
    model = AutoModelForSequenceClassification.from_pretrained(base_model, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    args = RewardConfig(**trainer_kwargs(settings, ckpt_dir), max_length=settings.max_length)
    timer = StepTimer()
    trainer = RewardTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list([as_conversation(p) for p in train]),
        processing_class=tokenizer,
        peft_config=lora.to_peft("SEQ_CLS", modules_to_save=["score"]),
        callbacks=[timer, *(callbacks or [])],
    )
    quiet_trainer(trainer)
    if len(trainer.train_dataset) == 0:
        raise ValueError(
            f"every training pair is longer than max_length={settings.max_length} tokens: "
            "raise RewardModelSettings.max_length or shorten the contexts"
        )
    trainer.train(resume_from_checkpoint=last)

    adapter_dir = save_adapter(trainer, tokenizer, output_dir)
    scorer = RewardScorer.from_model(
        trainer.model, tokenizer, batch_size=settings.batch_size, max_length=settings.max_length
    )
    # Scoring is a forward pass per response: cap the train side, the held-out side is the measure.
    train_acc, _ = scorer.accuracy(train[: settings.train_accuracy_pairs])
    held_acc, margins = scorer.accuracy(heldout)
    return RewardModelResult(
        adapter_dir=adapter_dir,
        loss_curve=curve(trainer.state.log_history, "loss"),
        train_accuracy=train_acc,
        heldout_accuracy=held_acc,
        n_train=len(train),
        n_heldout=len(heldout),
        trainable_percent=trainable_percent(trainer.model),
        steps=trainer.state.global_step,
        seconds_per_step=timer.seconds_per_step,
        resumed_from=last,
        heldout_margins=margins,
        heldout_groups=[str(p.get("group", i)) for i, p in enumerate(heldout)],
    )
