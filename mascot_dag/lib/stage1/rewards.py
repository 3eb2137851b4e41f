"""Reward functions for GRPO, in TRL's form (`trl/rewards/format_rewards.py`).

A reward is a callable `(completions, **kwargs) -> list[float | None]`; TRL passes `prompts` and any
dataset columns as keyword arguments. With conversational prompts, each completion arrives as a
list of message dicts (`[{"role": "assistant", "content": "..."}]`); plain strings work too.
Parameterised rewards are factories returning a picklable callable object whose stable `__name__`
becomes the logged metric name (`rewards/<name>/mean`). `None` means "not applicable here" (TRL
turns it into NaN and leaves it out of the sum).

Composite reward of Stage 1: `reward_model_reward(scorer)` plus `format_reward(...)`, either passed
as two functions with `reward_weights` (TRL logs each one) or folded into one with `combined(...)`;
with group history in the prompts, `novelty_reward()` adds what the persona reward never sees: how
much of a reply the other agents already said.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from mascot_dag.lib.evaluation.metrics import lexical_overlap

RewardFunc = Callable[..., list[float | None]]

# Phrases by which a persona breaks character into the generic assistant voice.
ROLE_BREAKS = ("as an ai", "language model", "i am an ai", "i'm an ai", "as a chatbot")
# Turn markers that mean the agent is writing someone else's lines (beyond other agents' names).
GENERIC_SPEAKERS = ("user", "assistant", "system")


def completion_text(completion: Any) -> str:
    """The text of one completion: a str, or the content of a list of message dicts.

    >>> completion_text([{"role": "assistant", "content": "Hi"}])
    'Hi'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, list | tuple):
        return "".join(completion_text(m) for m in completion)
    raise TypeError(
        f"completion must be a str or a list of message dicts, got {type(completion)!r}"
    )


# Talk ABOUT the turn instead of taking it: the 135M model often answers the agent prompt
# ("Write your next turn as The Anchor.") with "Your next turn will be..." or "Here's a response".
META_TALK = re.compile(
    r"\b(?:next turn|write your|here'?s (?:a|my) (?:response|reply|turn)|my response|"
    r"in this conversation|the conversation so far|as (?:the )?(?:anchor|catalyst|beacon|"
    r"action guide|companion))\b",
    re.IGNORECASE,
)
_TERMINAL = (".", "!", "?")


def _finished_share(text: str) -> float:
    """Share of characters up to the last sentence end (1.0 when the text ends one, closing
    quotes and brackets after it included)."""
    text = text.rstrip("\"')\u201d\u2019 ")
    last = max(text.rfind(c) for c in _TERMINAL)
    return (last + 1) / len(text) if last >= 0 and text else 0.0


class FormatReward:
    """Shape of a reply, in [0, 1], five parts of 0.2 each, so that replies of one GRPO group
    differ (a reward that is 1.0 for nearly every reply adds nothing to the advantages):

    - length: inside [min_chars, max_chars]; below, 0.2 * chars / min_chars; above,
      0.2 * max_chars / chars (partial credit, so longer-but-close beats far off);
    - complete: the share of the reply that lies in finished sentences (up to its last . ! ?):
      graded, because GRPO completions are cut at a token budget and a reply that finishes a
      thought early beats one that trails off;
    - in role: no "As an AI", "language model", ...;
    - own voice: no line starting with another agent's name (or User/Assistant/System) + ":";
    - no meta-talk: does not talk about the turn ("Your next turn...", "Here's a response").
    A reply of only repeated words loses the length part (distinct words < 40% of words).
    An empty reply scores 0.0.
    """

    __name__ = "format_reward"

    def __init__(self, min_chars: int, max_chars: int, other_names: Sequence[str]) -> None:
        if not 0 < min_chars <= max_chars:
            raise ValueError(
                f"format_reward needs 0 < min_chars <= max_chars, got {min_chars}, {max_chars}"
            )
        self.min_chars = min_chars
        self.max_chars = max_chars
        self.other_names = tuple(other_names)
        names = [re.escape(n.strip()) for n in (*self.other_names, *GENERIC_SPEAKERS) if n.strip()]
        self._prefix = re.compile(rf"^\s*(?:{'|'.join(names)})\s*:", re.IGNORECASE | re.MULTILINE)

    def parts(self, text: str) -> dict[str, float]:
        text = text.strip()
        n = len(text)
        if n == 0:
            return dict.fromkeys(("length", "complete", "in_role", "own_voice", "no_meta"), 0.0)
        if n < self.min_chars:
            length = 0.2 * n / self.min_chars
        elif n > self.max_chars:
            length = 0.2 * self.max_chars / n
        else:
            length = 0.2
        words = text.lower().split()
        if len(words) >= 5 and len(set(words)) / len(words) < 0.4:
            length = 0.0
        lowered = text.lower()
        return {
            "length": length,
            "complete": 0.2 * _finished_share(text),
            "in_role": 0.0 if any(p in lowered for p in ROLE_BREAKS) else 0.2,
            "own_voice": 0.0 if self._prefix.search(text) else 0.2,
            "no_meta": 0.0 if META_TALK.search(text) else 0.2,
        }

    def score_text(self, text: str) -> float:
        return round(sum(self.parts(text).values()), 6)

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return [self.score_text(completion_text(c)) for c in completions]


def format_reward(
    min_chars: int = 20, max_chars: int = 400, other_names: Sequence[str] = ()
) -> FormatReward:
    """Reward replies of sensible length that end a sentence, stay in role, speak only for
    themselves and take the turn instead of talking about it.

    >>> reward = format_reward(other_names=["The Catalyst"])
    >>> reward([[{"role": "assistant", "content": "That sounds really hard. I'm here with you."}],
    ...         [{"role": "assistant", "content": "The Catalyst: As an AI, I can't"}]])
    [1.0, 0.4]
    """
    return FormatReward(min_chars, max_chars, other_names)


class RewardModelReward:
    """`weight * score` of a trained reward model (a `RewardScorer`) per prompt + completion.

    When the dataset has a `reward_prompt` column (TRL passes dataset columns as keyword
    arguments), the RM reads that instead of the policy prompt: it was trained on the short
    `reward_messages` form, not on the policy's full persona prompt.
    """

    __name__ = "reward_model"

    def __init__(self, scorer: Any, weight: float = 1.0) -> None:
        self.scorer = scorer
        self.weight = weight

    def __call__(
        self,
        completions: Sequence[Any],
        prompts: Sequence[Any] | None = None,
        reward_prompt: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        prompts = reward_prompt if reward_prompt is not None else prompts
        if prompts is None:
            raise ValueError(
                "reward_model_reward needs the prompts (TRL passes them as prompts=...)"
            )
        prompt_msgs = [
            p if isinstance(p, list) else [{"role": "user", "content": str(p)}] for p in prompts
        ]
        scores = self.scorer.score(prompt_msgs, list(completions))
        return [self.weight * s for s in scores]


def reward_model_reward(scorer: Any, weight: float = 1.0) -> RewardModelReward:
    """Reward-model score of each completion given its prompt.

    >>> reward = reward_model_reward(RewardScorer(base, "rm/adapter"))  # doctest: +SKIP
    >>> reward(completions=[[{"role": "assistant", "content": "I hear you."}]],
    ...        prompts=[[{"role": "user", "content": "I failed my exam."}]])  # doctest: +SKIP
    [0.83]
    """
    return RewardModelReward(scorer, weight)


class NoveltyReward:
    """1 - the reply's lexical overlap with the most similar EARLIER AGENT TURN of its prompt
    (`lib.metrics.lexical_overlap`: share of its word 1-2 grams already in one earlier turn).

    The persona reward model scores a reply against its persona and the context only, so adapters
    trained on it alone learn the same on-topic reply for every persona and the group echoes
    (docs/experiments/2026-12-04-evaluation-3.md). This reward reads the dataset column
    `earlier_turns` (a JSON
    list of the other agents' turns shown in the prompt, see `lib.dialogue.group_agent_messages`)
    and is None (not applicable) where a prompt shows no earlier agent turn. An empty reply
    scores 0.0. With the optional column `shared_context` (the context text every agent sees;
    setting `novelty_ignores_context`) words of the context do not count as repeated, so naming
    the user's topic is not punished, only repeating what another agent added.
    """

    __name__ = "novelty_reward"

    def __call__(
        self, completions: Sequence[Any], earlier_turns: Sequence[str] | None = None,
        shared_context: Sequence[str] | None = None, **kwargs: Any,
    ) -> list[float | None]:
        if earlier_turns is None:
            raise ValueError("novelty_reward needs the dataset column 'earlier_turns' (JSON list "
                             "of the earlier agent turns in each prompt)")
        shared = [""] * len(completions) if shared_context is None else shared_context
        out: list[float | None] = []
        for i, (completion, raw, ctx) in enumerate(
                zip(completions, earlier_turns, shared, strict=True)):
            try:
                earlier = json.loads(raw)
            except (TypeError, json.JSONDecodeError) as exc:
                raise ValueError(f"novelty_reward: earlier_turns #{i} is not a JSON list of "
                                 f"strings: {str(raw)[:80]!r}") from exc
            if not earlier:
                out.append(None)
                continue
            overlap = lexical_overlap(completion_text(completion), earlier, ctx or "")
            out.append(0.0 if overlap is None else round(1.0 - overlap, 6))
        return out


def novelty_reward() -> NoveltyReward:
    """Reward what a reply adds to the other agents' earlier turns in its prompt.

    >>> import json
    >>> reward = novelty_reward()
    >>> reward(["That sounds hard. What happened next?", "I am sorry you feel sad."],
    ...        earlier_turns=[json.dumps(["I am sorry you feel sad."])] * 2)
    [1.0, 0.0]
    >>> reward(["Anything."], earlier_turns=["[]"])
    [None]
    >>> reward(["Your dog is sick."], earlier_turns=[json.dumps(["My dog is sick."])],
    ...        shared_context=["My dog is sick and I am worried."])
    [1.0]
    """
    return NoveltyReward()


class JudgeReward:
    """The judge's persona consistency (1-5) of each reply for the adapter's persona, read against
    its context (dataset column `context_text`): the AI feedback itself, not the reward model
    distilled from it.

    Why (docs/experiments/2026-12-04-why-action-guide-never-gains.md): on the probe's reference
    utterances the embedded judge ranks Action Guide's own voice above the others' almost
    perfectly (AUC 0.99), while the reward model trained on its preferences over the 135M
    model's candidates ranks it BELOW them (AUC 0.26): the candidates rarely hold a concrete plan,
    so the reward model never learnt what one is worth. A judge call costs one MiniLM pass per
    reply. The identifiability probe stays independent of both (it never sees the cards)."""

    __name__ = "judge_consistency"

    def __init__(self, judge: Any, card: Any, roster: Sequence[Any]) -> None:
        self.judge, self.card, self.roster = judge, card, list(roster)

    def __call__(self, completions: Sequence[Any], context_text: Sequence[str] | None = None,
                 **kwargs: Any) -> list[float | None]:
        from mascot_dag.lib.judges.base import ResponseItem

        if context_text is None:
            raise ValueError("judge_consistency_reward needs the dataset column 'context_text' "
                             "(the context each prompt answers)")
        items = [ResponseItem(ctx, self.card, self.roster, completion_text(c))
                 for c, ctx in zip(completions, context_text, strict=True)]
        out: list[float | None] = []
        for scores in self.judge.score_responses(items):
            value = {s.criterion: s.score for s in scores}.get("consistency")
            out.append(None if value is None else float(value))
        return out


def judge_consistency_reward(judge: Any, card: Any, roster: Sequence[Any]) -> JudgeReward:
    """Reward each reply by how well the judge finds it fits `card` (1-5; None if unscored)."""
    return JudgeReward(judge, card, roster)


class CombinedReward:
    """Weighted sum of several rewards; a None component is left out, all None gives None."""

    def __init__(self, funcs: Sequence[RewardFunc], weights: Sequence[float], name: str) -> None:
        if len(funcs) != len(weights) or not funcs:
            raise ValueError(
                f"combined() needs one weight per reward function, got {len(funcs)} functions "
                f"and {len(weights)} weights"
            )
        self.funcs = list(funcs)
        self.weights = [float(w) for w in weights]
        self.__name__ = name

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        columns = [f(completions=completions, **kwargs) for f in self.funcs]
        out: list[float | None] = []
        for row in zip(*columns, strict=True):
            parts = [w * v for w, v in zip(self.weights, row, strict=True) if v is not None]
            out.append(sum(parts) if parts else None)
        return out


def combined(
    funcs: Sequence[RewardFunc], weights: Sequence[float] | None = None, name: str = "combined"
) -> CombinedReward:
    """Fold several rewards into one (default weights 1.0 each).

    >>> r = combined([format_reward(), format_reward()], [0.5, 0.5])
    >>> r(["I'm right here with you, let's take this one step at a time."])
    [1.0]
    """
    return CombinedReward(funcs, weights if weights is not None else [1.0] * len(funcs), name)
