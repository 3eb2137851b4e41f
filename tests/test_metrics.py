"""Automatic dialogue metrics on hand-made dialogues whose values are computed by hand."""

from __future__ import annotations

import math
import string

import numpy as np
import pytest

from mascot_dag.lib.evaluation.metrics import (
    METRICS,
    PersonaIdentifier,
    aggregate,
    compute_metrics,
    cross_agent_similarity,
    distinct_n,
    metric_rows,
    redundancy_embedding,
    redundancy_lexical,
    response_length,
    self_bleu,
    sentence_bleu,
    tokenize,
)


def agent(speaker: str, text: str) -> dict[str, str]:
    return {"speaker": speaker, "role": "agent", "text": text}


def user(text: str) -> dict[str, str]:
    return {"speaker": "user", "role": "user", "text": text}


def letters(texts: list[str]) -> np.ndarray:
    """Deterministic toy embedding: bag of letters a-z (counts)."""
    return np.array([[t.lower().count(c) for c in string.ascii_lowercase] for t in texts], float)


def test_tokenize_lowercases_and_keeps_contractions():
    assert tokenize("I don't KNOW, really!") == ["i", "don't", "know", "really"]


def test_distinct_n_by_hand():
    d = [user("hello hello there"), agent("a", "I feel you. I feel it."), agent("b", "feel better")]
    # agent unigrams: i feel you i feel it | feel better -> 8 total, {i feel you it better} = 5
    assert distinct_n(d, 1) == pytest.approx(5 / 8)
    # bigrams within turns: (i feel)(feel you)(you i)(i feel)(feel it) | (feel better)
    # -> 6 total, 5 unique (i feel repeats); user turn ignored
    assert distinct_n(d, 2) == pytest.approx(5 / 6)
    assert distinct_n([user("only the user")], 1) is None


def test_sentence_bleu_by_hand():
    # order 3 (effective): p1 = 2/3, p2 = 1/2 (the cat), p3 = 0 -> smoothed 0.1/1; BP = 1
    assert sentence_bleu("the cat sat".split(), ["the cat ran".split()]) == pytest.approx(
        (2 / 3 * 1 / 2 * 0.1) ** (1 / 3)
    )
    # perfect precision but short: c = 2, r = 3 -> BP = exp(1 - 3/2)
    assert sentence_bleu("the cat".split(), ["the cat sat".split()]) == pytest.approx(
        math.exp(-0.5)
    )
    assert sentence_bleu([], [["x"]]) == 0.0


def test_self_bleu_identical_and_disjoint_agents():
    same = [user("help"), agent("a", "We should take a walk."), agent("b", "we should take a walk")]
    assert self_bleu(same) == pytest.approx(1.0)
    two_turns = [agent("a", "go now"), agent("b", "go now"), agent("a", "rest"), agent("b", "rest")]
    assert self_bleu(two_turns) == pytest.approx(1.0)
    disjoint = [agent("a", "apples bananas cherries dates"), agent("b", "engines fuel gears oil")]
    # no n-gram matches: p_n = 0.1/4, 0.1/3, 0.1/2, 0.1/1; equal lengths -> BP = 1
    expected = 0.1 * (1 / 24) ** 0.25  # ~0.045
    assert self_bleu(disjoint) == pytest.approx(expected)
    assert self_bleu([user("hi"), agent("a", "hello"), agent("a", "again")]) is None


def test_cross_agent_similarity_with_toy_embedding():
    d = [agent("a", "ab"), agent("a", "aa"), agent("b", "ac"), user("zz")]
    # different-agent pairs: (ab, ac) = 1/(sqrt2*sqrt2) = 0.5; (aa, ac) = 2/(2*sqrt2) = 0.7071
    assert cross_agent_similarity(d, letters) == pytest.approx((0.5 + 1 / math.sqrt(2)) / 2)
    assert cross_agent_similarity([agent("a", "ab"), agent("a", "ab")], letters) is None
    with pytest.raises(ValueError, match="shape"):
        cross_agent_similarity(d, lambda texts: np.ones(3))


def test_redundancy_embedding_repeated_turn_is_one():
    assert redundancy_embedding([user("ab"), agent("a", "ab")], letters) == pytest.approx(1.0)
    # a: repeats the user (1.0); b: "cd" shares no letter with "ab" (0.0) -> mean 0.5
    d = [user("ab"), agent("a", "ab"), agent("b", "cd")]
    assert redundancy_embedding(d, letters) == pytest.approx(0.5)
    assert redundancy_embedding([agent("a", "ab")], letters) is None  # nothing earlier


def test_redundancy_lexical_by_hand():
    d = [user("I lost my job"), agent("a", "i lost my job"), agent("b", "Sorry about your job")]
    # a: all its 1-2 grams occur in the user turn -> 1.0
    # b: 4 unigrams + 3 bigrams = 7 grams, only "job" seen before -> 1/7
    assert redundancy_lexical(d) == pytest.approx((1 + 1 / 7) / 2)


def test_response_length_ignores_user():
    d = [user("a b c d e f"), agent("a", "one two three"), agent("b", "four five")]
    assert response_length(d) == pytest.approx(2.5)


VOCAB = {
    "anchor": ["feel", "heart", "safe", "warm", "breathe", "gentle"],
    "catalyst": ["why", "evidence", "assume", "question", "logic", "reframe"],
    "beacon": ["strength", "proud", "grow", "progress", "brave", "shine"],
    "guide": ["step", "plan", "list", "call", "schedule", "tomorrow"],
}


def _utterances(offset: int) -> tuple[list[str], list[str]]:
    texts, labels = [], []
    for persona, words in VOCAB.items():
        for k in range(4):
            texts.append(" ".join(words[(k + offset + j) % len(words)] for j in range(3)))
            labels.append(persona)
    return texts, labels


def test_identifiability_separable_personas_is_perfect():
    ident = PersonaIdentifier(*_utterances(0))
    held_out, labels = _utterances(2)
    turns = [agent(p, t) for t, p in zip(held_out, labels, strict=True)] + [user("feel why step")]
    assert ident.accuracy(turns) == 1.0


def test_identifiability_identical_texts_is_chance():
    texts = ["i hear you and that sounds hard"] * 8
    speakers = ["anchor", "catalyst", "beacon", "guide"] * 2
    ident = PersonaIdentifier(texts, speakers)
    # every test turn is the same text -> one predicted persona -> 1 of 4 speakers right
    turns = [agent(p, "i hear you and that sounds hard") for p in VOCAB]
    assert ident.accuracy(turns) == pytest.approx(0.25)
    # a roster it never saw (the meeting roster, one "assistant" voice): not measurable, not 0
    assert ident.accuracy([agent("facilitator", "let us recap"), agent("assistant", "ok")]) is None
    # a known roster with one unknown speaker: that turn is a miss
    assert ident.accuracy([agent("anchor", "i hear you and that sounds hard"),
                           agent("assistant", "i hear you and that sounds hard")]) <= 0.5
    with pytest.raises(ValueError, match=">= 2 personas"):
        PersonaIdentifier(["a", "b"], ["anchor", "anchor"])


def test_registry_directions_and_compute_metrics():
    assert METRICS["distinct_2"].higher_is_better is True
    assert METRICS["self_bleu"].higher_is_better is False
    assert METRICS["cross_agent_similarity"].higher_is_better is False
    assert METRICS["response_length"].higher_is_better is None
    assert METRICS["persona_identifiability"].higher_is_better is True
    d = [user("I lost my job"), agent("a", "i lost my job"), agent("b", "Sorry about your job")]
    bare = compute_metrics(d)
    assert set(bare) == set(METRICS)
    assert bare["cross_agent_similarity"] is None and bare["persona_identifiability"] is None
    assert bare["redundancy_lexical"] == pytest.approx(4 / 7)
    full = compute_metrics(d, embed=letters, identifier=PersonaIdentifier(*_utterances(0)))
    assert full["cross_agent_similarity"] is not None
    assert full["persona_identifiability"] is None  # speakers "a", "b": a roster it never saw
    p, q = list(VOCAB)[:2]
    known = [user("I lost my job"), agent(p, "i lost my job"), agent(q, "Sorry about your job")]
    ident = compute_metrics(known, identifier=PersonaIdentifier(*_utterances(0)))
    assert 0.0 <= ident["persona_identifiability"] <= 1.0
    with pytest.raises(ValueError, match="turn 1"):
        compute_metrics([user("x"), {"speaker": "a", "role": "bot", "text": "y"}])


def test_aggregate_skips_missing_values():
    assert aggregate("distinct_1", [0.5, None, 1.0, float("nan")]) == pytest.approx(0.75)
    assert aggregate("self_bleu", [None]) is None


def test_metric_rows_carry_registry_direction():
    rows = {
        r["criterion"]: r
        for r in metric_rows("mascot", "d1", {"self_bleu": 0.2, "response_length": 3.0})
    }
    assert rows["self_bleu"]["higher_is_better"] is False
    assert rows["response_length"]["higher_is_better"] is None
    assert rows["self_bleu"]["level"] == "automatic" and rows["self_bleu"]["judge"] == "metric"


def test_speaker_entropy_shows_a_concentrated_group():
    from mascot_dag.lib.evaluation.metrics import agent_speaker_entropy

    round_robin = [user("hi")] + [agent(p, "words here") for p in ("a", "b", "c", "d")]
    assert agent_speaker_entropy(round_robin) == pytest.approx(2.0)
    concentrated = [agent("a", "x"), user("y"), agent("a", "z"), agent("b", "w")]
    assert agent_speaker_entropy(concentrated) == pytest.approx(0.9183, abs=1e-4)
    assert agent_speaker_entropy([user("only the user")]) is None
    assert METRICS["speaker_entropy"].higher_is_better is None  # descriptive, never ranked
    assert compute_metrics(concentrated)["speaker_entropy"] == pytest.approx(0.9183, abs=1e-4)
