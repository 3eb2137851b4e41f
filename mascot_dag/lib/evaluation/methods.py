"""Evaluation methods: MASCOT, its ablations and the baselines, all via `run_dialogues`.

Every method runs the SAME specs (contexts, simulated users, seeds) through the same lockstep turn
structure; a method only changes the roster, the `DialogueConfig` and a wrapper around the chat
function (`method_plan`). The simulated user's requests always pass through unchanged, so every
method faces the same user simulator.

Prompting baselines (zero_shot, zero_shot_cot, few_shot, few_shot_cot, self_consistency, sft) speak
as the persona roster in a FIXED round-robin order (turn k: roster[k % n]), each turn with that
persona's system prompt in the baseline's style, as the paper runs them: persona consistency and
identifiability then compare like with like with MASCOT (what differs is the director, the
aligned adapters and the prompting technique, not whether personas were asked for at all).

- zero_shot / few_shot: the persona prompt of style zero_shot / few_shot (few_shot: + the card's
  example utterances), no wrapper.
- *_cot: + `COT_INSTRUCTION`; the model writes "Thoughts: ... Response: ..."; only the response is
  kept (`extract_cot_response`). It gets `COT_BUDGET_FACTOR` x the agent budget, because thoughts
  and response share one generation and the response would otherwise be cut off.
- self_consistency: `SC_SAMPLES` samples per request (derived seeds, one batched call); the sample
  agreeing most with the others (mean token Jaccard) wins (`most_consistent`).
- sft: the zero-shot persona prompts through the SFT LoRA adapter (`sft_examples` builds its data
  from ED listener turns, which carry no persona; the persona comes from the prompt, as for the
  other baselines).

Single-voice methods speak as one generic `ASSISTANT` (`persona_grounding=False`, so their agent
requests carry `GENERIC_SYSTEM`, which the wrapper rewrites):
- zero_shot_single (extra, not in `METHODS`): the previous single-assistant zero-shot baseline.
- multiagent_esc: MultiAgentESC-style (lib/evaluation/esc.py; simplified, see there): complexity
gate ->
  emotion/cause/intention analysis -> votes over the 8 ESConv strategies -> one debate round when
  there is no majority -> final response, each stage ONE batched call; its published pipeline
  answers with one supporter voice.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from mascot_dag.lib.data.personas import PersonaCard, system_prompt
from mascot_dag.lib.dialogue.engine import GENERIC_SYSTEM, run_dialogues
from mascot_dag.lib.dialogue.spec import ChatFn, DialogueConfig, DialogueRecord, DialogueSpec
from mascot_dag.lib.types import ChatRequest, ChatResult, Context, Message

METHODS: tuple[str, ...] = (
    "zero_shot",
    "zero_shot_cot",
    "few_shot",
    "few_shot_cot",
    "self_consistency",
    "sft",
    "multiagent_esc",
    "mascot",
    "mascot_p",
    "mascot_c",
)
PROMPTING_BASELINES: tuple[str, ...] = METHODS[:6]  # persona roster, fixed round-robin
EXTRA_METHODS: tuple[str, ...] = ("zero_shot_single",)  # run on request, not by default
ALL_METHODS: tuple[str, ...] = METHODS + EXTRA_METHODS
SINGLE_AGENT: tuple[str, ...] = ("multiagent_esc", "zero_shot_single")  # one "assistant" voice
# How reports name a method that only approximates its published form.
METHOD_LABELS: dict[str, str] = {
    "multiagent_esc": "MultiAgentESC-style (a simplified MultiAgentESC: rule-based complexity "
    "gate, one debate round, no response selection; see mascot_dag/lib/evaluation/esc.py)",
}
Wrap = Callable[[ChatFn], ChatFn]

ASSISTANT = PersonaCard(
    persona_id="assistant",
    persona_set="baseline",
    name="Assistant",
    role="a supportive assistant",
    description="A single helpful assistant that listens and replies with care.",
    behaviours=["acknowledge the person's feelings", "respond to what was actually said"],
    avoid=["lecturing", "long answers"],
    examples=[
        "That sounds really hard. How are you holding up?",
        "It makes sense that you feel that way after all of this.",
        "Would it help to talk through what happened step by step?",
    ],
)

ZERO_SHOT_SYSTEM = (
    "You are a supportive assistant. Read the conversation and reply to the latest turn with one "
    "short, warm and helpful turn (2-3 sentences)."
)
COT_INSTRUCTION = (
    "Before replying, think briefly about how the person feels and what would help. Answer in "
    "exactly this format:\nThoughts: <one or two sentences>\nResponse: <your reply>"
)
FEW_SHOT_EXAMPLES: tuple[tuple[str, str], ...] = (
    (
        "I didn't get the job I interviewed for last week.",
        "I'm sorry, that's a real disappointment after all the effort you put in. "
        "What part of it is weighing on you most?",
    ),
    (
        "My best friend is moving to another country next month.",
        "That's a big change, and it's natural to feel sad about it. "
        "Have you two talked about how you'll stay in touch?",
    ),
    (
        "We can't agree on which feature to build first.",
        "Both options have merit, so it may help to list what each one unblocks. "
        "Which one do users ask for most often?",
    ),
)
COT_BUDGET_FACTOR = 2
SC_SAMPLES = 3
ASK_SUFFIX = "Write your next turn."


def few_shot_block() -> str:
    return "Examples:\n" + "\n".join(f"User: {u}\nAssistant: {a}" for u, a in FEW_SHOT_EXAMPLES)


def baseline_system(method: str) -> str:
    """The generic system prompt of a single-assistant baseline (and of the SFT training data)."""
    parts = [ZERO_SHOT_SYSTEM]
    if method in ("few_shot", "few_shot_cot"):
        parts.append(few_shot_block())
    if method in ("zero_shot_cot", "few_shot_cot"):
        parts.append(COT_INSTRUCTION)
    return "\n\n".join(parts)


def baseline_style(method: str) -> str:
    """The persona prompt style a prompting baseline speaks with (`personas.PROMPT_STYLES`)."""
    return "few_shot" if method.startswith("few_shot") else "zero_shot"


def persona_baseline_system(
    card: PersonaCard, method: str, roster: list[PersonaCard] | None = None
) -> str:
    """The system prompt of one roster persona under a prompting baseline: the persona's prompt
    in the baseline's style, plus the thinking format for the CoT variants."""
    system = system_prompt(card, baseline_style(method), roster)
    return f"{system}\n\n{COT_INSTRUCTION}" if method.endswith("_cot") else system


_RESPONSE = re.compile(r"response\s*:\s*", re.IGNORECASE)
_THOUGHTS = re.compile(r"^\W*thoughts?\s*:\s*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def extract_cot_response(text: str) -> str:
    """The reply part of a "Thoughts: ... Response: ..." generation.

    The text after the first "Response:" label; without a (non-empty) one, the text after the
    thoughts' first sentence; when there is no second sentence either, the whole text (without
    a leading "Thoughts:" label), so a turn is never empty when the model said something.
    """
    m = _RESPONSE.search(text)
    if m and text[m.end() :].strip():
        return text[m.end() :].strip()
    body = _THOUGHTS.sub("", text.strip(), count=1).strip()
    if m:  # an empty "Response:" at the end: keep what came before it
        body = _RESPONSE.sub("", body).strip()
    parts = _SENTENCE_END.split(body, maxsplit=1)
    if len(parts) == 2 and parts[1].strip():
        return parts[1].strip()
    return body or text.strip()


def _tokens(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def jaccard(a: str, b: str) -> float:
    ta, tb = _tokens(a), _tokens(b)
    union = ta | tb
    return len(ta & tb) / len(union) if union else 0.0


def most_consistent(texts: list[str]) -> int:
    """Index of the text with the highest mean token-Jaccard agreement with the others.

    Ties go to the lowest index (deterministic). Empty texts agree with nothing (Jaccard 0).
    """
    if not texts:
        raise ValueError("most_consistent: no samples")
    if len(texts) == 1:
        return 0
    scores = [
        sum(jaccard(t, o) for j, o in enumerate(texts) if j != i) / (len(texts) - 1)
        for i, t in enumerate(texts)
    ]
    return max(range(len(texts)), key=lambda i: (scores[i], -i))


def _system(req: ChatRequest) -> str | None:
    m = req.messages
    return m[0]["content"] if m and m[0]["role"] == "system" else None


def _is_agent(req: ChatRequest) -> bool:
    """A single-voice method's agent request (persona grounding off: the generic placeholder)."""
    return _system(req) == GENERIC_SYSTEM


def _derived_seed(seed: int, k: int) -> int:
    return (seed * 31 + 977 * (k + 1)) % 2**31


def _with(req: ChatRequest, system: str, user: str | None = None, **changes) -> ChatRequest:
    """A copy of req with a new system (and optionally user) message and changed sampling."""
    rest = req.messages[1:] if user is None else ({"role": "user", "content": user},)
    messages: tuple[Message, ...] = ({"role": "system", "content": system}, *rest)
    sampling = dataclasses.replace(req.sampling, **changes.pop("sampling", {}))
    return dataclasses.replace(req, messages=messages, sampling=sampling, **changes)


def _merge(chosen: ChatResult, all_results: list[ChatResult], text: str) -> ChatResult:
    """The chosen text, with the token costs of every call made for it."""
    return ChatResult(
        text,
        sum(r.prompt_tokens for r in all_results),
        sum(r.completion_tokens for r in all_results),
        all(r.cached for r in all_results),
    )


AgentFn = Callable[[ChatFn, list[ChatRequest]], list[ChatResult]]


SystemFn = Callable[[ChatRequest], str]


def _agent_wrapper(handle: AgentFn, is_agent: Callable[[ChatRequest], bool] = _is_agent) -> Wrap:
    """Wrap: agent requests (`is_agent`) go to `handle`, the rest (simulated user) pass through."""

    def wrap(generate: ChatFn) -> ChatFn:
        def chat(requests: list[ChatRequest]) -> list[ChatResult]:
            agent = [i for i, r in enumerate(requests) if is_agent(r)]
            if not agent:
                return generate(requests)
            out: list[ChatResult | None] = [None] * len(requests)
            other = [i for i in range(len(requests)) if i not in set(agent)]
            if other:
                for i, res in zip(other, generate([requests[i] for i in other]), strict=True):
                    out[i] = res
            results = handle(generate, [requests[i] for i in agent])
            for i, res in zip(agent, results, strict=True):
                out[i] = res
            return out  # type: ignore[return-value]

        return chat

    return wrap


def _prompting(system_for: SystemFn, cot: bool) -> AgentFn:
    """Agent requests with the baseline's system prompt; CoT: a larger budget, reply extracted."""

    def handle(generate: ChatFn, reqs: list[ChatRequest]) -> list[ChatResult]:
        factor = COT_BUDGET_FACTOR if cot else 1
        new = [
            _with(r, system_for(r), sampling={"max_new_tokens": r.sampling.max_new_tokens * factor})
            for r in reqs
        ]
        results = generate(new)
        if cot:
            return [_merge(r, [r], extract_cot_response(r.text)) for r in results]
        return results

    return handle


def _self_consistency(system_for: SystemFn) -> AgentFn:
    def handle(generate: ChatFn, reqs: list[ChatRequest]) -> list[ChatResult]:
        samples = [
            _with(r, system_for(r), sampling={"seed": _derived_seed(r.sampling.seed, k)})
            for r in reqs
            for k in range(SC_SAMPLES)
        ]
        results = generate(samples)
        out = []
        for i in range(len(reqs)):
            group = results[i * SC_SAMPLES : (i + 1) * SC_SAMPLES]
            best = group[most_consistent([g.text for g in group])]
            out.append(_merge(best, group, best.text))
        return out

    return handle


def _transcript(req: ChatRequest) -> str:
    """The agent request's context + conversation, without its final "write your turn" line."""
    return req.messages[-1]["content"].strip().removesuffix(ASK_SUFFIX).strip()


def _multiagent_esc(generate: ChatFn, reqs: list[ChatRequest]) -> list[ChatResult]:
    """MultiAgentESC-style (lib/evaluation/esc.py): gate, analysis, strategy votes, debate, final
    reply."""
    from mascot_dag.lib.evaluation.esc import multiagent_esc

    return multiagent_esc(generate, reqs, _transcript, ZERO_SHOT_SYSTEM, ASK_SUFFIX)


def _identity(generate: ChatFn) -> ChatFn:
    return generate


def method_plan(
    method: str,
    specs: list[DialogueSpec],
    base_config: DialogueConfig,
    persona_adapters: dict[str, str | None] | None = None,
    director_adapter: str | None = None,
    sft_adapter: str | None = None,
) -> tuple[list[DialogueSpec], DialogueConfig, Wrap]:
    """(specs, config, wrap) of a method; `wrap(generate)` is the chat function to run it with."""
    if method not in ALL_METHODS:
        raise ValueError(f"unknown method {method!r}; known: {ALL_METHODS}")
    adapters = dict(persona_adapters or {})
    cfg = dataclasses.replace
    if method == "mascot":
        return (
            specs,
            cfg(
                base_config,
                speaker_policy="director",
                persona_grounding=True,
                persona_adapters=adapters,
                director_adapter=director_adapter,
            ),
            _identity,
        )
    if method == "mascot_p":
        return (
            specs,
            cfg(
                base_config,
                speaker_policy="director",
                persona_grounding=False,
                persona_adapters={},
                director_adapter=director_adapter,
            ),
            _identity,
        )
    if method == "mascot_c":
        return (
            specs,
            cfg(
                base_config,
                speaker_policy="random",
                persona_grounding=True,
                persona_adapters=adapters,
                director_adapter=None,
            ),
            _identity,
        )
    if method == "sft" and sft_adapter is None:
        raise ValueError(
            "method 'sft' needs sft_adapter (the name of the SFT LoRA loaded into the chat "
            "backend); train it from sft_examples() first or leave 'sft' out of the methods"
        )
    if method in PROMPTING_BASELINES:
        return _roster_plan(method, specs, base_config, sft_adapter)
    single = [dataclasses.replace(s, roster=[ASSISTANT]) for s in specs]
    config = cfg(
        base_config,
        speaker_policy="round_robin",
        no_repeat=False,
        persona_grounding=False,
        director_adapter=None,
        persona_adapters={},
    )
    if method == "multiagent_esc":
        handle = _multiagent_esc
    else:  # zero_shot_single
        handle = _prompting(lambda r: ZERO_SHOT_SYSTEM, cot=False)
    return single, config, _agent_wrapper(handle)


def _roster_plan(
    method: str, specs: list[DialogueSpec], base_config: DialogueConfig, sft_adapter: str | None
) -> tuple[list[DialogueSpec], DialogueConfig, Wrap]:
    """A prompting baseline over the persona roster, in a fixed round-robin order.

    The dialogue engine writes each turn's persona prompt in the baseline's style; the wrapper
    only adds what the technique needs (CoT format and budget, self-consistency samples). Agent
    requests are recognised by their exact persona prompt, so the simulated user's pass through.
    """
    style = baseline_style(method)
    # sft: the adapter is every persona's, so turns/models record it (model_used)
    adapters = {c.persona_id: sft_adapter for s in specs for c in s.roster} if sft_adapter else {}
    config = dataclasses.replace(
        base_config,
        speaker_policy="round_robin",
        no_repeat=False,
        persona_grounding=True,
        prompt_style=style,
        director_adapter=None,
        persona_adapters=adapters if method == "sft" else {},
    )
    prompts = {
        system_prompt(c, style, s.roster): persona_baseline_system(c, method, s.roster)
        for s in specs
        for c in s.roster
    }

    def is_agent(req: ChatRequest) -> bool:
        return _system(req) in prompts

    def system_for(req: ChatRequest) -> str:
        return prompts[_system(req) or ""]

    if method == "self_consistency":
        return specs, config, _agent_wrapper(_self_consistency(system_for), is_agent)
    if method.endswith("_cot"):
        return specs, config, _agent_wrapper(_prompting(system_for, cot=True), is_agent)
    return specs, config, _identity  # zero_shot, few_shot, sft: the engine's prompt as is


def method_dialogue_id(spec: DialogueSpec, method: str) -> str:
    """`eval:<context_id>` -> `eval:<method>:<context_id>` (the incoming prefix is kept)."""
    cid = spec.context.context_id
    if not spec.dialogue_id.endswith(f":{cid}"):
        raise ValueError(
            f"{spec.dialogue_id}: expected a dialogue id '<prefix>:{cid}' (from build_specs)"
        )
    return f"{spec.dialogue_id.removesuffix(f':{cid}')}:{method}:{cid}"


def run_method(
    method: str,
    specs: list[DialogueSpec],
    chat_generate: ChatFn,
    base_config: DialogueConfig,
    persona_adapters: dict[str, str | None] | None = None,
    director_adapter: str | None = None,
    sft_adapter: str | None = None,
    stage: str = "eval",
) -> list[DialogueRecord]:
    """Run one method on the specs; dialogue ids become `<prefix>:<method>:<context_id>`."""
    planned, config, wrap = method_plan(
        method, specs, base_config, persona_adapters, director_adapter, sft_adapter
    )
    planned = [dataclasses.replace(s, dialogue_id=method_dialogue_id(s, method)) for s in planned]
    generate = chat_generate.generate if hasattr(chat_generate, "generate") else chat_generate
    return run_dialogues(planned, wrap(generate), config, stage=stage, method=method)


def sft_examples(contexts: list[Context]) -> list[dict]:
    """LoRA SFT data: one example per non-empty listener turn of the EmpatheticDialogues contexts.

    messages = the zero-shot system prompt, the preceding turns as user (speaker) / assistant
    (listener) messages (consecutive same-role turns merged, so roles alternate), and the listener
    turn as the final assistant message. A listener turn with no speaker turn before it is
    skipped (there is nothing to reply to).
    """
    out = []
    for ctx in contexts:
        if ctx.source != "empatheticdialogues":
            continue
        history: list[Message] = []
        for t in ctx.turns:
            text = " ".join((t.get("text") or "").split())
            if not text:
                continue
            role = "assistant" if t.get("speaker") == "listener" else "user"
            if role == "assistant" and any(m["role"] == "user" for m in history):
                out.append(
                    {
                        "messages": [
                            {"role": "system", "content": baseline_system("zero_shot")},
                            *history,
                            {"role": "assistant", "content": text},
                        ]
                    }
                )
            if history and history[-1]["role"] == role:
                history[-1] = {"role": role, "content": f"{history[-1]['content']} {text}"}
            else:
                history.append({"role": role, "content": text})
    return out
