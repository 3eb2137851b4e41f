"""MultiAgentESC-style baseline (`multiagent_esc`): the MultiAgentESC pipeline (Xu et al., 2025,
"MultiAgentESC: A LLM-based Multi-Agent Collaboration Framework for Emotional Support
Conversation"), simplified to a bounded number of short, batched generation calls.

Per agent request (one supporter voice, the generic `ASSISTANT`):
1. complexity gate (`is_simple`): a short small-talk message ("thanks!", "ok") gets a direct
   reply, as in the paper, where simple utterances skip the multi-agent pipeline;
2. dialogue analysis: three analysts (emotion, cause, intention), ESC_ANALYSIS_TOKENS each;
3. strategy proposals: one proposer per analysis picks one of the 8 ESConv strategies
   (`ESCONV_STRATEGIES`), ESC_VOTE_TOKENS each; `parse_strategy` maps free text to a strategy;
4. debate/vote (`vote`): a strict majority wins; without one, ONE debate round where each
   proposer sees the others' picks and votes again; then plurality, ties to the earliest proposer;
5. final response with the chosen strategy and the analyses.

What is simplified against the published pipeline: the gate is a rule (word count and small-talk
cues), not an LLM's decision; the debate is one re-vote round, not a free multi-turn discussion;
no per-strategy candidate responses and no response-selection/reflection step (one final response
from the voted strategy); every agent is the same base model with a role prompt. Every stage is
ONE batched call across the dialogues of a step (the debate only for dialogues that need it), so
the cost stays bounded on CPU: per complex turn 3 x 16 + 3 x 6 (+ 3 x 6) tokens besides the reply.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

from mascot_dag.lib.dialogue.spec import ChatFn
from mascot_dag.lib.types import ChatRequest, ChatResult, Message

# ESConv (Liu et al., 2021) support strategies, with the definitions given to the agents.
ESCONV_STRATEGIES: tuple[tuple[str, str], ...] = (
    ("Question", "ask about the problem to understand it better"),
    ("Restatement or Paraphrasing", "restate what the person said, more concisely"),
    ("Reflection of feelings", "name and reflect the feelings the person expresses"),
    ("Self-disclosure", "share a similar experience to show understanding"),
    ("Affirmation and Reassurance", "affirm the person's strengths and reassure them"),
    ("Providing Suggestions", "suggest a way forward, without telling them what to do"),
    ("Information", "give useful facts or resources"),
    ("Others", "any other supportive reply, e.g. pleasantries"),
)
ESC_STRATEGIES = ESCONV_STRATEGIES
STRATEGY_NAMES = tuple(n for n, _ in ESCONV_STRATEGIES)
FALLBACK_STRATEGY = "Reflection of feelings"  # no parseable vote at all: the ESC default move
# How each strategy is recognised in a model's free-text answer (lower case stems).
_ALIASES: tuple[tuple[str, str], ...] = (
    ("restat", "Restatement or Paraphrasing"), ("paraphras", "Restatement or Paraphrasing"),
    ("reflect", "Reflection of feelings"), ("self-disclos", "Self-disclosure"),
    ("self disclos", "Self-disclosure"), ("disclos", "Self-disclosure"),
    ("affirm", "Affirmation and Reassurance"), ("reassur", "Affirmation and Reassurance"),
    ("suggest", "Providing Suggestions"), ("inform", "Information"), ("question", "Question"),
    ("other", "Others"),
)
ESC_ANALYSTS: tuple[tuple[str, str], ...] = (
    ("emotion", "What emotion does the user feel, and how strongly? One short sentence."),
    ("cause", "What caused the user's feelings? One short sentence."),
    ("intention", "What does the user want from this conversation? One short sentence."),
)
ESC_ANALYST_SYSTEM = "You analyse conversations to understand how the user feels and why."
ESC_PROPOSER_SYSTEM = "You are an emotional support expert choosing a support strategy."
ESC_ANALYSIS_TOKENS = 16
ESC_VOTE_TOKENS = 6
SIMPLE_MAX_WORDS = 8
_SMALL_TALK = re.compile(
    r"^\W*(hi|hello|hey|thanks|thank you|thx|ok|okay|bye|goodbye|good (morning|night|evening)|"
    r"yes|no|yeah|nope|sure|cool|great|nice|alright|see you)\b", re.IGNORECASE)
_LABEL = re.compile(r"^[^:\n]{1,40}:\s*")


def latest_message(transcript: str) -> str:
    """The last line of the conversation shown to the agent, without its "Name:" label."""
    lines = [ln for ln in transcript.strip().splitlines() if ln.strip()]
    return _LABEL.sub("", lines[-1]).strip() if lines else ""


def is_simple(message: str) -> bool:
    """The complexity gate: <= 3 words, or <= SIMPLE_MAX_WORDS words opening with small talk."""
    words = re.findall(r"[\w']+", message)
    if len(words) <= 3:
        return True
    return len(words) <= SIMPLE_MAX_WORDS and bool(_SMALL_TALK.match(message))


def parse_strategy(text: str) -> str | None:
    """The ESConv strategy a free-text answer names first (alias stems, case-insensitive), else a
    bare option number 1-8, else None."""
    low = text.lower()
    hits = [(low.find(stem), name) for stem, name in _ALIASES if stem in low]
    if hits:
        return min(hits)[1]
    m = re.search(r"\b([1-8])\b", low)
    return STRATEGY_NAMES[int(m.group(1)) - 1] if m else None


def has_majority(votes: list[str | None]) -> bool:
    valid = [v for v in votes if v]
    return bool(valid) and Counter(valid).most_common(1)[0][1] * 2 > len(votes)


def vote(votes: list[str | None]) -> str:
    """Plurality of the parsed votes; ties go to the tied strategy voted by the earliest
    proposer; no valid vote: FALLBACK_STRATEGY."""
    valid = [v for v in votes if v]
    if not valid:
        return FALLBACK_STRATEGY
    counts = Counter(valid)
    top = max(counts.values())
    return next(v for v in valid if counts[v] == top)


def _options() -> str:
    return "\n".join(f"{k}. {n}: {d}" for k, (n, d) in enumerate(ESCONV_STRATEGIES, 1))


def _debate_prompt(talk: str, votes: list[str | None], picks: list[str], name: str) -> str:
    said = "\n".join(f"- {n} expert: {v or ' '.join(p.split())[:60]}"
                     for (n, _), v, p in zip(ESC_ANALYSTS, votes, picks, strict=True))
    return (f"{talk}\n\nStrategies:\n{_options()}\n\nThe experts proposed:\n{said}\n\nAs the "
            f"{name} expert, weigh their views and answer with the ONE strategy name the group "
            "should use.")


def _ask(req: ChatRequest, system: str, user: str, seed: int, tokens: int | None = None
         ) -> ChatRequest:
    messages: tuple[Message, ...] = ({"role": "system", "content": system},
                                     {"role": "user", "content": user})
    changes: dict = {"seed": seed}
    if tokens is not None:
        changes["max_new_tokens"] = tokens
    return dataclasses.replace(req, messages=messages,
                               sampling=dataclasses.replace(req.sampling, **changes))


def _seed(seed: int, k: int) -> int:
    return (seed * 31 + 977 * (k + 1)) % 2**31


def multiagent_esc(generate: ChatFn, reqs: list[ChatRequest], transcript, reply_system: str,
                   ask: str) -> list[ChatResult]:
    """Replies to `reqs` (agent requests of the single supporter); `transcript(req)` is the
    context + conversation shown to the agents, `reply_system` the supporter's system prompt."""
    talks = [transcript(r) for r in reqs]
    seeds = [r.sampling.seed for r in reqs]
    complex_ = [i for i, t in enumerate(talks) if not is_simple(latest_message(t))]
    spent: dict[int, list[ChatResult]] = {i: [] for i in range(len(reqs))}
    na = len(ESC_ANALYSTS)
    analyses: dict[int, list[str]] = {}
    votes: dict[int, list[str | None]] = {}
    picks: dict[int, list[str]] = {}
    if complex_:
        res = generate([_ask(reqs[i], ESC_ANALYST_SYSTEM, f"{talks[i]}\n\n{q}",
                             _seed(seeds[i], k), ESC_ANALYSIS_TOKENS)
                        for i in complex_ for k, (_, q) in enumerate(ESC_ANALYSTS)])
        for j, i in enumerate(complex_):
            spent[i] += res[j * na:(j + 1) * na]
            analyses[i] = [" ".join(r.text.split()) for r in res[j * na:(j + 1) * na]]
        res = generate([_ask(reqs[i], ESC_PROPOSER_SYSTEM,
                             f"{talks[i]}\n\nAnalysis of the user's {name}: {analyses[i][k]}\n\n"
                             f"Strategies:\n{_options()}\n\nWhich ONE strategy should the next "
                             "reply use? Answer with its name.",
                             _seed(seeds[i], na + k), ESC_VOTE_TOKENS)
                        for i in complex_ for k, (name, _) in enumerate(ESC_ANALYSTS)])
        for j, i in enumerate(complex_):
            spent[i] += res[j * na:(j + 1) * na]
            picks[i] = [r.text for r in res[j * na:(j + 1) * na]]
            votes[i] = [parse_strategy(t) for t in picks[i]]
        split = [i for i in complex_ if not has_majority(votes[i])]
        if split:  # the debate: each proposer sees the others' picks and votes once more
            res = generate([_ask(reqs[i], ESC_PROPOSER_SYSTEM,
                                 _debate_prompt(talks[i], votes[i], picks[i], name),
                                 _seed(seeds[i], 2 * na + k), ESC_VOTE_TOKENS)
                            for i in split for k, (name, _) in enumerate(ESC_ANALYSTS)])
            for j, i in enumerate(split):
                spent[i] += res[j * na:(j + 1) * na]
                votes[i] = [parse_strategy(r.text) for r in res[j * na:(j + 1) * na]]
    finals = []
    for i, r in enumerate(reqs):
        if i not in analyses:  # simple message: a direct reply
            finals.append(_ask(r, reply_system, f"{talks[i]}\n\n{ask}", _seed(seeds[i], 3 * na)))
            continue
        chosen = vote(votes[i])
        what = dict(ESCONV_STRATEGIES)[chosen]
        notes = "\n".join(f"- {n}: {a}" for (n, _), a in zip(ESC_ANALYSTS, analyses[i],
                                                                 strict=True))
        finals.append(_ask(r, reply_system,
                           f"{talks[i]}\n\nAnalysis:\n{notes}\n\nStrategy chosen by the experts: "
                           f"{chosen} ({what}).\n\nUsing this strategy, {ask.lower()}",
                           _seed(seeds[i], 3 * na)))
    out = generate(finals)
    return [ChatResult(f.text, sum(x.prompt_tokens for x in [*spent[i], f]),
                       sum(x.completion_tokens for x in [*spent[i], f]),
                       all(x.cached for x in [*spent[i], f]))
            for i, f in enumerate(out)]
