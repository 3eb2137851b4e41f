"""Automatic dialogue metrics for MASCOT's two failure modes: persona collapse and sycophancy.

Following lm-evaluation-harness, every metric is registered with its direction (`higher_is_better`)
and its aggregation next to its definition (`METRICS`), so a report cannot silently invert a
comparison. A dialogue is a list of turns `{"speaker": persona_id|"user", "role": "agent"|"user",
"text": str}`; every metric returns one number per dialogue, or None when it is undefined for that
dialogue (e.g. self-BLEU with fewer than two agents). None is skipped by aggregation, never
counted as zero.

Tokenisation (all lexical metrics): lowercase, then the regex `[a-z0-9]+(?:'[a-z]+)?` (words with an
optional apostrophe suffix: "don't" is one token; punctuation is dropped).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

Turn = dict[str, str]
Embed = Callable[[list[str]], np.ndarray]

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens: `tokenize("I don't know!") == ["i", "don't", "know"]`."""
    return _TOKEN.findall(text.lower())


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def agent_turns(turns: list[Turn]) -> list[Turn]:
    return [t for t in turns if t.get("role") == "agent"]


def _by_agent(turns: list[Turn]) -> dict[str, list[str]]:
    """Agent speaker -> its turns' texts, in order of first appearance."""
    out: dict[str, list[str]] = {}
    for t in agent_turns(turns):
        out.setdefault(t["speaker"], []).append(t["text"])
    return out


# --- diversity ----------------------------------------------------------------------------------


def distinct_n(turns: list[Turn], n: int) -> float | None:
    """Unique / total word n-grams over all agent turns (n-grams do not cross turn boundaries).

    >>> distinct_n([{"speaker": "a", "role": "agent", "text": "go go now"}], 1)  # {go, now} / 3
    0.6666666666666666
    """
    grams = [g for t in agent_turns(turns) for g in ngrams(tokenize(t["text"]), n)]
    return len(set(grams)) / len(grams) if grams else None


def speaker_entropy(speakers: Sequence[str]) -> float:
    """Shannon entropy in bits of the speaker counts (0 for one speaker, NaN for none)."""
    if not speakers:
        return math.nan
    n = len(speakers)
    return float(-sum(c / n * math.log2(c / n) for c in Counter(speakers).values()))


def agent_speaker_entropy(turns: list[Turn]) -> float | None:
    """`speaker_entropy` of the agent turns' speakers: 2 bits when four personas speak equally."""
    speakers = [t["speaker"] for t in agent_turns(turns)]
    return speaker_entropy(speakers) if speakers else None


def response_length(turns: list[Turn]) -> float | None:
    """Mean number of word tokens per agent turn. Descriptive only: no quality direction."""
    lengths = [len(tokenize(t["text"])) for t in agent_turns(turns)]
    return float(np.mean(lengths)) if lengths else None


# --- homogeneity between agents (persona collapse) ------------------------------------------------


def sentence_bleu(hypothesis: list[str], references: list[list[str]], max_n: int = 4) -> float:
    """Sentence BLEU (Papineni et al. 2002) with multiple references, smoothed.

    - modified precision p_n: hypothesis n-gram counts clipped by their max count in any reference;
    - effective order (as sacrebleu's sentence BLEU): orders above the hypothesis length are
      dropped, so a 2-token hypothesis identical to a reference scores 1.0, not 0;
    - smoothing: Chen & Cherry (2014) method 1, a zero match count becomes 0.1, so one missing
      4-gram does not zero the score;
    - brevity penalty exp(1 - r/c) when c <= r, r = the reference length closest to c (ties: the
      shorter), c = hypothesis length. Geometric mean with uniform weights 1/N.
    """
    c = len(hypothesis)
    if c == 0 or not references:
        return 0.0
    order = min(max_n, c)
    log_p = 0.0
    for n in range(1, order + 1):
        hyp = Counter(ngrams(hypothesis, n))
        best: Counter = Counter()
        for ref in references:
            for g, k in Counter(ngrams(ref, n)).items():
                best[g] = max(best[g], k)
        matches = sum(min(k, best[g]) for g, k in hyp.items())
        log_p += math.log((matches or 0.1) / sum(hyp.values())) / order
    r = min((abs(len(ref) - c), len(ref)) for ref in references)[1]
    bp = 1.0 if c > r else math.exp(1.0 - r / c)
    return bp * math.exp(log_p)


def self_bleu(turns: list[Turn]) -> float | None:
    """Homogeneity of the agents of one dialogue: mean over agents of the BLEU-4 of that agent's
    concatenated turns against each other agent's concatenated turns as references.
    1.0 = every agent says the same thing; lower is better. None with fewer than 2 speaking agents.
    """
    docs = {
        a: [w for text in texts for w in tokenize(text)] for a, texts in _by_agent(turns).items()
    }
    docs = {a: toks for a, toks in docs.items() if toks}
    if len(docs) < 2:
        return None
    scores = [
        sentence_bleu(toks, [other for b, other in docs.items() if b != a])
        for a, toks in docs.items()
    ]
    return float(np.mean(scores))


def _unit_rows(embed: Embed, texts: list[str]) -> np.ndarray:
    vecs = np.asarray(embed(texts), dtype=float)
    if vecs.ndim != 2 or vecs.shape[0] != len(texts):
        raise ValueError(f"embed() must return shape (n_texts={len(texts)}, dim); got {vecs.shape}")
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs / np.where(norms == 0, 1.0, norms)


def cross_agent_similarity(turns: list[Turn], embed: Embed) -> float | None:
    """Mean cosine similarity over all pairs of agent turns spoken by DIFFERENT agents.
    High = agents sound alike (persona collapse); lower is better. None with < 2 agents."""
    ats = agent_turns(turns)
    if len({t["speaker"] for t in ats}) < 2:
        return None
    unit = _unit_rows(embed, [t["text"] for t in ats])
    sims = unit @ unit.T
    speakers = np.array([t["speaker"] for t in ats])
    different = speakers[:, None] != speakers[None, :]
    return float(sims[different].mean())


# --- redundancy against the conversation so far (social sycophancy) --------------------------


def redundancy_embedding(turns: list[Turn], embed: Embed) -> float | None:
    """For each agent turn with at least one earlier turn (any role), its max cosine similarity to
    an earlier turn; averaged over those agent turns. 1.0 = it repeats something already said."""
    if not any(i > 0 and t.get("role") == "agent" for i, t in enumerate(turns)):
        return None
    unit = _unit_rows(embed, [t["text"] for t in turns])
    sims = unit @ unit.T
    scores = [sims[i, :i].max() for i, t in enumerate(turns) if i > 0 and t.get("role") == "agent"]
    return float(np.mean(scores))


def _gram_set(text: str) -> set[tuple[str, ...]]:
    toks = tokenize(text)
    return set(ngrams(toks, 1)) | set(ngrams(toks, 2))


def lexical_overlap(text: str, earlier: Sequence[str], shared: str = "") -> float | None:
    """The largest fraction of `text`'s distinct word 1- and 2-grams that already occur in ONE of
    the `earlier` texts (0 = nothing repeated, 1 = all of it said before); None when `text` has
    no tokens or there is nothing earlier. The unit of `redundancy_lexical` and of Stage 1's
    novelty reward (lib.rewards.NoveltyReward), so the two measure the same thing.

    n-grams of `shared` (the context every speaker sees) do not count as repeated: two agents
    naming the user's topic is not an echo, repeating what the other agent ADDED is.

    >>> round(lexical_overlap("my dog is sick", ["your dog is sick"]), 4)
    0.7143
    >>> lexical_overlap("my dog is sick", ["your dog is sick"], shared="the dog is sick")
    0.0
    """
    grams = _gram_set(text)
    if not grams or not earlier:
        return None
    ignore = _gram_set(shared) if shared else set()
    return _overlap(grams, [_gram_set(e) - ignore for e in earlier])


def _overlap(grams: set, earlier: Sequence[set]) -> float:
    return max(len(grams & e) / len(grams) for e in earlier)


def redundancy_lexical(turns: list[Turn]) -> float | None:
    """Embedding-free redundancy: for each agent turn with earlier turns, the largest fraction of
    its distinct word 1- and 2-grams that already occur in ONE earlier turn; averaged. Turns
    without tokens are skipped."""
    grams = [_gram_set(t["text"]) for t in turns]  # once per turn, not once per later turn
    scores = [_overlap(grams[i], grams[:i]) for i, t in enumerate(turns)
              if i > 0 and t.get("role") == "agent" and grams[i]]
    return float(np.mean(scores)) if scores else None


# --- persona identifiability ------------------------------------------------------------------


class PersonaIdentifier:
    """Which persona said this? TF-IDF over word 1-2 grams + logistic regression.

    Train it on persona-labelled UTTERANCES (e.g. agents' turns from training rollouts or Stage-1
    candidates), never on the persona cards or system prompts: it must measure whether the voices
    are distinguishable, not whether a text copies its card. It deliberately does not use the
    embedded judge's fidelity signal (similarity to the persona card), otherwise training against
    that judge would grade itself on this metric too.
    """

    def __init__(self, texts: list[str], speakers: list[str], seed: int = 0) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline

        if len(texts) != len(speakers):
            raise ValueError(f"{len(texts)} training texts but {len(speakers)} speaker labels")
        if len(set(speakers)) < 2:
            raise ValueError(
                f"PersonaIdentifier needs utterances of >= 2 personas, got {sorted(set(speakers))}"
            )
        self.speakers = sorted(set(speakers))
        self.model = make_pipeline(
            TfidfVectorizer(tokenizer=tokenize, token_pattern=None, ngram_range=(1, 2)),
            LogisticRegression(max_iter=1000, random_state=seed),
        )
        self.model.fit(texts, speakers)

    @classmethod
    def from_turns(cls, turns: list[Turn], seed: int = 0) -> PersonaIdentifier:
        ats = agent_turns(turns)
        return cls([t["text"] for t in ats], [t["speaker"] for t in ats], seed=seed)

    def predict(self, texts: list[str]) -> list[str]:
        return [str(s) for s in self.model.predict(texts)] if texts else []

    def accuracy(self, turns: list[Turn]) -> float | None:
        """Fraction of agent turns whose speaker is recovered. None without agent turns, and None
        when no speaker of the dialogue is one the identifier was trained on (another roster,
        e.g. the meeting roster, or a single "assistant" voice): not measurable there, rather
        than a 0 that every method would share. In a dialogue with known speakers, an unknown
        one counts as a miss (it cannot be recovered)."""
        ats = agent_turns(turns)
        if not ats or not {t["speaker"] for t in ats} & set(self.speakers):
            return None
        pred = self.predict([t["text"] for t in ats])
        return float(np.mean([p == t["speaker"] for p, t in zip(pred, ats, strict=True)]))


# --- registry -----------------------------------------------------------------------------------


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


@dataclass(frozen=True)
class Metric:
    """One automatic metric: `fn(turns, embed, identifier) -> float | None` per dialogue.

    higher_is_better: True/False, or None for descriptive numbers that reports show unranked.
    level: the unit one value describes. aggregation: dialogue values (None dropped) -> one number.
    """

    name: str
    fn: Callable[[list[Turn], Embed | None, PersonaIdentifier | None], float | None]
    higher_is_better: bool | None
    description: str
    level: str = "dialogue"
    aggregation: Callable[[list[float]], float | None] = field(default=_mean)
    needs: str | None = None  # "embed" | "identifier": None is returned without it


METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        Metric("distinct_1", lambda d, e, i: distinct_n(d, 1), True,
               "unique / total word unigrams over agent turns"),
        Metric("distinct_2", lambda d, e, i: distinct_n(d, 2), True,
               "unique / total word bigrams over agent turns"),
        Metric("self_bleu", lambda d, e, i: self_bleu(d), False,
               "mean BLEU-4 of each agent's turns against the other agents' (homogeneity)"),
        Metric("cross_agent_similarity",
               lambda d, e, i: cross_agent_similarity(d, e) if e else None, False,
               "mean embedding cosine between different agents' turns (persona collapse)",
               needs="embed"),
        Metric("redundancy_embedding",
               lambda d, e, i: redundancy_embedding(d, e) if e else None, False,
               "mean max embedding cosine of an agent turn to any earlier turn (sycophancy)",
               needs="embed"),
        Metric("redundancy_lexical", lambda d, e, i: redundancy_lexical(d), False,
               "mean max 1-2-gram containment of an agent turn in an earlier turn (sycophancy)"),
        Metric("response_length", lambda d, e, i: response_length(d), None,
               "mean words per agent turn (descriptive, not ranked)"),
        # descriptive: the prompting baselines' fixed round-robin is at the maximum by
        # construction, and a director may rightly let one persona speak twice; it shows
        # how concentrated a director's picks are, which speaker coverage in the judge hides
        Metric("speaker_entropy", lambda d, e, i: agent_speaker_entropy(d), None,
               "entropy (bits) of who spoke among the agent turns (descriptive, not ranked)"),
        Metric("persona_identifiability", lambda d, e, i: i.accuracy(d) if i else None, True,
               "fraction of agent turns whose persona a TF-IDF classifier recovers",
               needs="identifier"),
    ]
}  # fmt: skip


def compute_metrics(
    dialogue: list[Turn], embed: Embed | None = None, identifier: PersonaIdentifier | None = None
) -> dict[str, float | None]:
    """Every registered metric of one dialogue; None where undefined or its input is missing."""
    for k, t in enumerate(dialogue):
        missing = {"speaker", "role", "text"} - set(t)
        if missing or t["role"] not in ("agent", "user"):
            raise ValueError(
                f"turn {k} must have speaker, role ('agent'|'user') and text; got keys "
                f"{sorted(t)} with role {t.get('role')!r}"
            )
    return {name: m.fn(dialogue, embed, identifier) for name, m in METRICS.items()}


def aggregate(name: str, values: list[float | None]) -> float | None:
    """Aggregate per-dialogue values of metric `name` with its registered aggregation."""
    clean = [float(v) for v in values if v is not None and not math.isnan(v)]
    return METRICS[name].aggregation(clean)


def metric_rows(method: str, dialogue_id: str, values: dict[str, float | None]) -> list[dict]:
    """`eval_scores` rows (level 'automatic', judge 'metric') with the registry's direction.

    Undefined values are kept as NULL rows so a report can say why a number is missing;
    higher_is_better is None for descriptive metrics (response_length).
    """
    return [
        {"method": method, "dialogue_id": dialogue_id, "level": "automatic", "judge": "metric",
         "criterion": name, "value": v, "higher_is_better": METRICS[name].higher_is_better}
        for name, v in values.items()
    ]  # fmt: skip
