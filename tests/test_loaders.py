"""Dataset loaders, valence mapping and the hash split: demo data, real samples, malformed files."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from mascot_dag.lib.data import DataFileError, load_empathetic_dialogues, load_qmsum
from mascot_dag.lib.data.empathetic import HEADER, UTTERANCE_CAP
from mascot_dag.lib.data.qmsum import clean_turn
from mascot_dag.lib.data.split import assign_split
from mascot_dag.lib.data.valence import EMOTIONS, UnknownEmotionError, valence_of

DATA = Path(__file__).resolve().parents[1] / "mascot_dag" / "data"
HEAD = ",".join(HEADER)


def _row(
    conv="c:1",
    idx="1",
    emo="sad",
    prompt="My cat is ill_comma_ sadly.",
    utt="She is sick.",
    extra="",
):
    return f"{conv},{idx},{emo},{prompt},,{utt},,{extra}"


def _csv(tmp_path, *rows, name="ed.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([HEAD, *rows]) + "\n", encoding="utf-8")
    return path


def _meeting(n_turns=6, topic_span=(("0", "3"),), query_span=(("1", "2"),)) -> dict:
    return {
        "topic_list": [{"topic": "Budget", "relevant_text_span": [list(s) for s in topic_span]}],
        "general_query_list": [{"query": "Summarize the whole meeting.", "answer": "x"}],
        "specific_query_list": [
            {
                "query": "What about cost?",
                "answer": "Too high.",
                "relevant_text_span": [list(s) for s in query_span],
            }
        ],
        "meeting_transcripts": [
            {"speaker": f"S{i % 2}", "content": f"turn {i} {{vocalsound}} ok ."}
            for i in range(n_turns)
        ],
    }


def _jsonl(tmp_path, *lines, domain="Product") -> Path:
    folder = tmp_path / domain
    folder.mkdir(exist_ok=True)
    path = folder / "test.jsonl"
    path.write_text(
        "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n",
        encoding="utf-8",
    )
    return path


# --- demo data -------------------------------------------------------------------------------


def test_demo_empathetic_dialogues():
    res = load_empathetic_dialogues(DATA / "empatheticdialogues")
    assert res.skipped == []
    assert len(res.contexts) == 80
    assert {c.valence for c in res.contexts} == {"positive", "negative", "neutral"}
    c = next(c for c in res.contexts if c.context_id == "ed:demo_conv:01")
    assert (
        c.situation == "My old dog passed away last weekend, and the house feels empty without her."
    )
    assert c.text == c.situation + "\n" + c.turns[0]["text"]
    assert [t["speaker"] for t in c.turns] == ["speaker", "listener", "speaker"]
    assert "_comma_" not in c.turns[2]["text"] and "," in c.turns[2]["text"]
    assert c.source_ref == "lines 2-4" and c.emotion == "sad" and c.domain == "emotional_support"
    for split in ("train", "eval"):
        vals = {c.valence for c in res.contexts if assign_split(c.context_id) == split}
        assert len(vals) >= 2, split
    # The held-out persona probe needs enough eval contexts to have power.
    assert sum(assign_split(c.context_id) == "eval" for c in res.contexts) >= 16


def test_demo_qmsum():
    res = load_qmsum(DATA / "qmsum")
    assert res.skipped == []
    assert {c.domain for c in res.contexts} == {"academic", "committee", "product"}
    assert len({c.meeting_id for c in res.contexts}) == 3
    assert len(res.contexts) == 6
    for c in res.contexts:
        assert c.context_id.startswith(f"qmsum:{c.meeting_id}:")
        assert c.text and "{" not in c.text and " ," not in c.text and " ." not in c.text
        assert c.queries and c.situation == c.topic
    # A single file gives the same ids as the folder (domain from the parent folder name).
    one = load_qmsum(DATA / "qmsum" / "Product" / "demo.jsonl")
    assert [c.context_id for c in one.contexts] == [
        c.context_id for c in res.contexts if c.domain == "product"
    ]


# --- real samples ----------------------------------------------------------------------------


def test_shared_empathetic_valid(shared_data):
    res = load_empathetic_dialogues(shared_data / "empatheticdialogues" / "valid.csv")
    assert len(res.contexts) == 2770
    assert res.skipped == []
    assert len({c.context_id for c in res.contexts}) == 2770
    first = res.contexts[0]  # hit:3_conv:6 opens by repeating its situation word for word
    assert first.turns[0]["text"] == first.situation == first.text
    assert set(Counter(c.valence for c in res.contexts)) == {"positive", "negative", "neutral"}
    # Ratio roughly respected and deterministic on real ids.
    ids = [c.context_id for c in res.contexts]
    n_eval = sum(assign_split(i) == "eval" for i in ids)
    assert 0.22 < n_eval / len(ids) < 0.28


def test_shared_qmsum(shared_data):
    res = load_qmsum(shared_data / "qmsum")
    assert res.skipped == []
    assert len({c.meeting_id for c in res.contexts}) == 35
    meetings = {c.meeting_id for c in res.contexts}
    assert Counter(m.split(":")[0] for m in meetings) == {
        "academic": 9,
        "committee": 6,
        "product": 20,
    }
    assert len({c.context_id for c in res.contexts}) == len(res.contexts)
    assert all(0 < len(c.text) <= 6000 for c in res.contexts)
    assert not any("{vocalsound}" in c.text or "{disfmarker}" in c.text for c in res.contexts)


# --- EmpatheticDialogues errors --------------------------------------------------------------


def test_ed_wrong_field_count_names_file_and_line(tmp_path):
    path = _csv(tmp_path, _row(), _row(idx="2", utt="Oh no, why?"))  # a raw comma -> 9 fields
    with pytest.raises(DataFileError, match=r"ed\.csv: line 3: expected 8 fields, found 9"):
        load_empathetic_dialogues(path)


def test_ed_row_errors(tmp_path):
    cases = {
        _row(idx="two"): r"line 2: utterance_idx 'two' is not an integer",
        _row(emo="melancholic"): r"line 2: unknown emotion 'melancholic'",
        _row(utt="  "): r"line 2: utterance is empty",
    }
    for row, msg in cases.items():
        with pytest.raises(DataFileError, match=msg):
            load_empathetic_dialogues(_csv(tmp_path, row))
    with pytest.raises(DataFileError, match=r"line 1: wrong header"):
        path = tmp_path / "h.csv"
        path.write_text(
            "conv_id,utterance_idx,prompt,utterance,label\nc:1,1,x,y,0\n", encoding="utf-8"
        )
        load_empathetic_dialogues(path)


def test_ed_skip_bad_counts(tmp_path):
    path = _csv(
        tmp_path,
        _row(),
        _row(idx="x"),
        _row(idx="2", utt="Poor thing."),
        _row(conv="c:2", emo="nope"),
        _row(conv="c:3", emo="joyful", utt="I won!", extra="a,b"),
    )
    # min_kept=0: this counts skips; keeping 2 of 5 lines fails at the default (test_faults_data)
    res = load_empathetic_dialogues(path, skip_bad=True, min_kept=0.0)
    assert [c.context_id for c in res.contexts] == ["ed:c:1"]
    assert len(res.contexts[0].turns) == 2
    assert len(res.skipped) == 3
    assert "line 3" in res.skipped[0] and "line 5" in res.skipped[1] and "line 6" in res.skipped[2]


def test_ed_file_level_errors(tmp_path):
    with pytest.raises(DataFileError, match=r"missing\.csv: file not found"):
        load_empathetic_dialogues(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"empty\.csv: file is empty"):
        load_empathetic_dialogues(tmp_path / "empty.csv", skip_bad=True)
    (tmp_path / "head.csv").write_text(HEAD + "\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"head\.csv: no data rows"):
        load_empathetic_dialogues(tmp_path / "head.csv")
    (tmp_path / "latin.csv").write_bytes(
        (HEAD + "\n" + _row(utt="Caf\xe9 closed.") + "\n").encode("latin-1")
    )
    with pytest.raises(
        DataFileError, match=r"latin\.csv: line 2: not valid UTF-8 \(byte offset \d+"
    ):
        load_empathetic_dialogues(tmp_path / "latin.csv")


def test_ed_folder_cap_and_duplicates(tmp_path):
    _csv(tmp_path, _row(utt="word " * 1000), name="a.csv")
    _csv(tmp_path, _row(conv="c:2", emo="Surprised"), name="b.csv")
    res = load_empathetic_dialogues(tmp_path)
    assert [c.context_id for c in res.contexts] == ["ed:c:1", "ed:c:2"]
    assert len(res.contexts[0].turns[0]["text"]) <= UTTERANCE_CAP
    assert res.contexts[1].valence == "neutral" and res.contexts[1].emotion == "surprised"
    _csv(tmp_path, _row(idx="2"), name="c.csv")  # c:1 again, in another file
    with pytest.raises(
        DataFileError, match=r"c\.csv: line 2: conv_id c:1 also appears in .*a\.csv"
    ):
        load_empathetic_dialogues(tmp_path)


# --- QMSum errors ----------------------------------------------------------------------------


def test_qmsum_bad_json_line(tmp_path):
    path = _jsonl(tmp_path, _meeting(), "{not json")
    with pytest.raises(DataFileError, match=r"test\.jsonl: line 2: invalid JSON"):
        load_qmsum(path)
    res = load_qmsum(path, skip_bad=True, min_kept=0.0)  # 1 of 2 lines: below the default 0.9
    assert len(res.contexts) == 1 and len(res.skipped) == 1


def test_qmsum_missing_key_and_bad_spans(tmp_path):
    m = _meeting()
    del m["meeting_transcripts"]
    with pytest.raises(DataFileError, match=r"line 1: meeting: missing key 'meeting_transcripts'"):
        load_qmsum(_jsonl(tmp_path, m))
    bad = {
        (("3", "1"),): r"line 1: topic_list\[0\] \(topic index 0\): span \['3', '1'\] must satisfy",
        (("0", "6"),): r"line 1: topic_list\[0\] \(topic index 0\): span .* < 6",
        (("a", "2"),): r"line 1: topic_list\[0\] \(topic index 0\): span .* does not hold integers",
    }
    for span, msg in bad.items():
        with pytest.raises(DataFileError, match=msg):
            load_qmsum(_jsonl(tmp_path, _meeting(topic_span=span)))
    with pytest.raises(DataFileError, match=r"specific_query_list\[0\]: span"):
        load_qmsum(_jsonl(tmp_path, _meeting(query_span=(("2", "9"),))))


def test_qmsum_queries_and_excerpt(tmp_path):
    path = _jsonl(tmp_path, _meeting(), _meeting(n_turns=7, query_span=(("2", "5"),)))
    a, b = load_qmsum(path).contexts
    assert a.queries == [{"query": "What about cost?", "answer": "Too high."}]
    assert b.queries == []  # the query's span leaves the topic's span
    assert a.text.splitlines() == [
        "S0: turn 0 ok.",
        "S1: turn 1 ok.",
        "S0: turn 2 ok.",
        "S1: turn 3 ok.",
    ]
    assert a.meeting_id != b.meeting_id and a.meeting_id.startswith("product:")
    long = _meeting()
    for i, t in enumerate(long["meeting_transcripts"]):
        t["content"] = f"turn {i} " + "many words " * 5  # each line is 66 characters
    capped = load_qmsum(_jsonl(tmp_path, long), max_chars=140).contexts[0]
    assert capped.text.splitlines() == [
        f"S{i}: turn {i} " + ("many words " * 5).strip() for i in (0, 1)
    ]
    assert len(load_qmsum(_jsonl(tmp_path, long), max_chars=100).contexts[0].text) <= 100


def test_qmsum_file_level_errors(tmp_path):
    with pytest.raises(DataFileError, match="file not found"):
        load_qmsum(tmp_path / "nope.jsonl")
    loose = tmp_path / "loose.jsonl"
    loose.write_text(json.dumps(_meeting()) + "\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"loose\.jsonl: cannot tell the QMSum domain"):
        load_qmsum(loose)
    assert load_qmsum(loose, domain="Committee").contexts[0].domain == "committee"
    loose.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"loose\.jsonl: file is empty"):
        load_qmsum(loose, domain="academic")
    loose.write_bytes(b'{"topic_list": []}\n{"x": "caf\xe9"}\n')
    with pytest.raises(DataFileError, match=r"loose\.jsonl: line 2: not valid UTF-8"):
        load_qmsum(loose, domain="academic")


def test_clean_turn():
    assert (
        clean_turn("Uh , I 'm {vocalsound} not sure {disfmarker} , really .")
        == "Uh, I'm not sure, really."
    )
    assert clean_turn("{gap}") == ""


# --- valence and split -----------------------------------------------------------------------


def test_valence_mapping():
    assert len(EMOTIONS) == 32
    counts = Counter(valence_of(e) for e in EMOTIONS)
    assert counts == {"positive": 11, "negative": 16, "neutral": 5}
    assert valence_of(" Joyful ") == "positive" and valence_of("nostalgic") == "neutral"
    with pytest.raises(UnknownEmotionError, match="unknown emotion 'happy'"):
        valence_of("happy")


def test_split_determinism():
    ids = [f"ed:hit:{i}_conv:{i}" for i in range(2000)]
    first = {i: assign_split(i) for i in ids}
    more = ids + [f"qmsum:new:{i}" for i in range(500)]
    again = {i: assign_split(i) for i in reversed(more)}
    assert all(again[i] == first[i] for i in ids)
    assert 0.2 < sum(v == "eval" for v in first.values()) / len(ids) < 0.3
    assert {assign_split(i, eval_ratio=0.0) for i in ids} == {"train"}
    assert [assign_split(i, salt="other") for i in ids] != list(first.values())
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="eval_ratio"):
            assign_split("x", eval_ratio=bad)
