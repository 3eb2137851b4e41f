"""Guards of the persona chat's replies (`mascot chat`, terminal and page; `ChatSession` only).

The embedded 135M base model leaks the machinery of its prompt: speaker labels ("Catalyst:",
"Your Next Turn:"), stage directions about turns ("As the Catalyst finishes speaking, you could
respond as..."), its system prompt word for word, the previous companion's reply, and a tail cut
at the token limit. These guards, pure functions, turn a raw reply into what a user reads:

1. scaffolding removed by pattern: a roster name or role label followed by a colon (text before a
   later label is kept, the label itself dropped), sentences with a stage direction about turns,
   sentences holding a run of `ECHO_RUN`+ words copied from the request (system prompt = persona
   card and directive, the context, the transcript: prompt echoes);
2. the reply ends at a sentence boundary (a cut-off tail is trimmed when a complete sentence
   precedes it, else marked with an ellipsis);
3. a reply that is empty or repeats an earlier turn of the conversation (`REPEAT_OVERLAP` of its
   tokens) is resampled with a new seed, at most `RESAMPLES` times, then a fallback line that is
   never empty and repeats no earlier turn.

Never used by `mascot serve` (an LLM judge's JSON must come back untouched) nor on the
evaluation's raw outputs: what is evaluated is the model, not these guards.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

RESAMPLES = 2
REPEAT_OVERLAP = 0.8
ECHO_RUN = 8
ROLE_LABELS = (
    "user", "you", "me", "moderator", "assistant", "companion", "companions", "speaker",
    "listener", "director", "system", "context", "persona", "character", "human", "ai", "bot",
    "response", "reply", "answer", "turn", "next turn", "your turn", "your next turn",
    "my turn", "my next turn", "conversation so far", "conversation", "transcript", "action",
    "tone", "note", "narrator", "group", "everyone", "all",
)
_STAGE = re.compile(
    r"(your|my|the|their|his|her) (next )?turn\b|\bnext turn\b|finish(es|ed)? speaking"
    r"|\bcould respond\b|\brespond(ing)? with\b|\b(respond|reply|answer|speak) as\b"
    r"|\bwrite your\b|director asks"
    r"|\bconversation so far\b|\b(your|the) director\b|\bin a [a-z]+ tone\b|\bas an ai\b"
    r"|\blanguage model\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"[^.!?\n]*(?:[.!?]+[\"')\]*]*|\n|$)")
_END = re.compile(r"[.!?…][\"')\]*]*$")
_FALLBACKS = {
    "support": (
        "I'm here with you. Tell me a little more about how you're feeling.",
        "That sounds hard. What part of it weighs on you most right now?",
        "Thank you for telling us. What would help you most tonight?",
        "You don't have to carry this alone. What happened next?",
        "Let's take it one step at a time. What do you need first?",
    ),
    "meeting": (
        "Good point. What would we need to decide first?",
        "Let's pin down the next step and who owns it.",
        "Could we list the open questions before we move on?",
        "I'd like to hear the constraints before we commit.",
    ),
}


_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def overlap(reply: str, earlier: str) -> float:
    """Share of the reply's tokens (with multiplicity) that the earlier turn also holds."""
    a, b = Counter(tokens(reply)), Counter(tokens(earlier))
    n = sum(a.values())
    return sum((a & b).values()) / n if n else 0.0


def repeats(reply: str, earlier: Iterable[str]) -> bool:
    """Whether the reply repeats an earlier turn: >= REPEAT_OVERLAP of its tokens in that turn."""
    return any(overlap(reply, e) >= REPEAT_OVERLAP for e in earlier)


def resample_seed(seed: int, attempt: int) -> int:
    """Seed of resample `attempt` (0 = the request's own seed)."""
    return (seed + 104_729 * attempt) % 2**31


def label_pattern(names: Iterable[str]) -> re.Pattern:
    """A label with its colon: `<name>:` or `<name> (<id>):` (optionally "The", bold, quotes)
    for roster names and ids and the role labels, anywhere in the text; and any 1-4 word
    heading with a colon at the start of the text, of a line or of a sentence ("My Go-to:")."""
    alts = set(ROLE_LABELS)
    for n in names:
        low = n.lower().strip()
        alts |= {low, low.removeprefix("the "), low.replace("_", " ")}
    body = "|".join(sorted((re.escape(a).replace(r"\ ", r"\s+") for a in alts if a), key=len,
                           reverse=True))
    named = rf"[*_\"'>\[]*\b(?:the\s+)?(?:{body})\b\s*(?:\([^)]{{0,40}}\))?[*_\"'\]]*\s*:[*_]*"
    heading = (r"(?:^|(?<=[.!?\n]))[ \t]*[*_\"'>#-]*(?:[A-Za-z][\w'-]*[ \t]+){0,3}[A-Za-z][\w'-]*"
               r"[ \t]*(?:\([^)]{0,40}\))?[*_\"']*[ \t]*:(?!//)[*_]*")
    return re.compile(f"{named}|{heading}", re.IGNORECASE | re.MULTILINE)


def _runs(text: str, n: int) -> set[tuple[str, ...]]:
    t = tokens(text)
    return {tuple(t[i : i + n]) for i in range(len(t) - n + 1)}


def strip_labels(text: str, labels: re.Pattern) -> str:
    """Drop every label; keep the words said before the first label (from there on the model
    writes another speaker's part), else the first part after a label. Words before a label
    count as said when they end a sentence or are 4+ words ("Your" of "Your Director:" is not)."""
    parts = [p.strip() for p in labels.split(text)]
    said = [p for i, p in enumerate(parts) if tokens(p) and (
        i == len(parts) - 1 or _END.search(p) or len(tokens(p)) >= 4)]
    return next(iter(said), next((p for p in parts if tokens(p)), ""))


def _echoed_chars(text: str, prompt: str) -> set[int]:
    """Start offsets of the text's tokens inside a run of ECHO_RUN+ words copied from `prompt`
    (runs may cross sentences)."""
    runs = _runs(prompt, ECHO_RUN)
    found = list(_TOKEN.finditer(text.lower()))
    words = [m.group() for m in found]
    covered: set[int] = set()
    for i in range(len(words) - ECHO_RUN + 1):
        if tuple(words[i : i + ECHO_RUN]) in runs:
            covered |= {found[j].start() for j in range(i, i + ECHO_RUN)}
    return covered


def strip_sentences(text: str, prompt: str) -> str:
    """Drop sentences (or lines) with a stage direction about turns, with a word of an
    ECHO_RUN-word run copied from `prompt` (the system prompt, context and transcript: prompt
    echoes), or that say again a sentence of the same reply."""
    echoed = _echoed_chars(text, prompt)
    kept, seen = [], set()
    for m in _SENTENCE.finditer(text):
        s, words = m.group(), tuple(tokens(m.group()))
        if (not words or words in seen or _STAGE.search(s)
                or any(m.start() <= c < m.end() for c in echoed)):
            continue
        seen.add(words)
        kept.append(" ".join(s.split()))
    return " ".join(kept)


def end_at_sentence(text: str) -> str:
    """The text up to its last complete sentence; an unfinished lone sentence gets an ellipsis."""
    text = text.strip().rstrip("*_-:;, ")
    if not text or _END.search(text):
        return text
    cut = max((m.end() for m in re.finditer(r"[.!?]+[\"')\]]*(?=\s)", text)), default=0)
    if cut and tokens(text[:cut]):
        return text[:cut].strip()
    return text + "..."


def clean_reply(raw: str, names: Iterable[str], prompt: str) -> tuple[str, list[str]]:
    """(text, guards that changed it): labels, sentences (stage directions, prompt echoes), the
    sentence boundary, in that order."""
    changed = []
    text = raw.strip()
    for name, step in (
        ("labels", lambda t: strip_labels(t, label_pattern(names))),
        ("scaffolding", lambda t: strip_sentences(t, prompt)),
        ("sentence_end", end_at_sentence),
    ):
        new = step(text)
        if " ".join(new.split()) != " ".join(text.split()):
            changed.append(name)
        text = new
    text = text.strip(" \"'*_-")
    return (text if tokens(text) else ""), changed


def has_scaffolding(text: str, names: Iterable[str], prompt: str) -> bool:
    """What the guards keep from users: a label with a colon, a stage direction, a prompt run."""
    return bool(label_pattern(names).search(text) or _STAGE.search(text)
                or _runs(text, ECHO_RUN) & _runs(prompt, ECHO_RUN))


def fallback(mode: str, earlier: list[str]) -> str:
    """A fixed line of the mode that repeats no earlier turn (never empty)."""
    lines = _FALLBACKS.get(mode, _FALLBACKS["support"])
    return next((x for x in lines if not repeats(x, earlier)), lines[len(earlier) % len(lines)])


@dataclass
class GuardedReply:
    text: str
    resamples: int = 0  # samples drawn after the first
    changed: list[str] = field(default_factory=list)  # guards that changed the kept sample
    fallback: bool = False


def guard_reply(
    sample: Callable[[int], str],
    names: Iterable[str],
    prompt: str,
    earlier: list[str],
    mode: str = "support",
    resamples: int = RESAMPLES,
) -> GuardedReply:
    """`sample(k)` the raw reply of attempt k (k >= 1: resample with `resample_seed`);
    `earlier` the conversation's previous turns (user and agents)."""
    names = list(names)
    earlier = [e for e in earlier if tokens(e)]
    for k in range(resamples + 1):
        text, changed = clean_reply(sample(k), names, prompt)
        if text and not repeats(text, earlier):
            return GuardedReply(text, k, changed)
        why = "empty" if not text else "repeat"
    return GuardedReply(fallback(mode, earlier), resamples, [why], True)


_DANGLING = {"a", "an", "the", "and", "or", "but", "to", "of", "your", "my", "that", "with",
             "for", "in", "on", "at", "you", "their", "is", "are", "be", "will", "not"}


def directive_valid(d: dict) -> bool:
    """A directive is shown only when the director's JSON was valid (status ok or retried, not
    the fallback) and its action reads as a whole instruction (not cut off mid-phrase)."""
    words = tokens(str(d.get("action") or ""))
    return (d.get("status") in ("ok", "retried") and 0 < len(words) <= 30
            and words[-1] not in _DANGLING)
