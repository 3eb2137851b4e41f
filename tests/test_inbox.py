"""The drop folder: good files are accepted into data/incoming, malformed ones rejected whole."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from mascot_dag.lib.data import DataFileError, load_empathetic_dialogues, load_qmsum
from mascot_dag.lib.data.inbox import (
    accept,
    incoming_sources,
    process_inbox,
    qmsum_domain,
    reject,
    scan_inbox,
    validate_file,
)

DATA = Path(str(resources.files("mascot_dag") / "data"))
HEADER = "conv_id,utterance_idx,context,prompt,speaker_idx,utterance,selfeval,tags\n"


def _good_csv(path: Path) -> Path:
    path.write_text(
        HEADER
        + "in:1,1,proud,I finished my first marathon,1,I did it! Four hours but I finished.,,\n"
        + "in:1,2,proud,I finished my first marathon,2,That is amazing_comma_ well done!,,\n"
        + "in:2,1,lonely,My friends all moved away,1,Everyone left town this year.,,\n",
        encoding="utf-8",
    )
    return path


def _bad_csv(path: Path) -> Path:
    # Lines 2-3 are fine, line 4 has an unknown emotion: the whole file must be refused.
    path.write_text(
        HEADER
        + "in:9,1,proud,I won a prize,1,I won the science prize today.,,\n"
        + "in:9,2,proud,I won a prize,2,Congratulations!,,\n"
        + "in:10,1,hangry,I skipped lunch,1,I am starving and cross.,,\n",
        encoding="utf-8",
    )
    return path


def _meeting(seed: str) -> dict:
    turns = [{"speaker": f"Speaker {i % 2}", "content": f"{seed} point number {i} {{vocalsound}}"}
             for i in range(4)]
    return {
        "topic_list": [{"topic": f"{seed} planning", "relevant_text_span": [["0", "3"]]}],
        "general_query_list": [],
        "specific_query_list": [
            {"query": "What was decided?", "answer": "To ship.", "relevant_text_span": [["1", "2"]]}
        ],
        "meeting_transcripts": turns,
    }


def test_scan_finds_new_files_only(home):
    inbox = home / "inbox"
    (inbox / "Committee").mkdir(parents=True)
    (inbox / "rejected").mkdir()
    _good_csv(inbox / "a.csv")
    (inbox / "product_m.jsonl").write_text("{}\n", encoding="utf-8")
    (inbox / "Committee" / "c.jsonl").write_text("{}\n", encoding="utf-8")
    (inbox / "rejected" / "old.csv").write_text("x", encoding="utf-8")
    (inbox / ".partial.csv").write_text("x", encoding="utf-8")
    (inbox / "notes.txt").write_text("x", encoding="utf-8")
    found = scan_inbox(inbox)
    assert [p.relative_to(inbox).as_posix() for p in found] == [
        "Committee/c.jsonl", "a.csv", "product_m.jsonl"]
    assert scan_inbox(inbox, min_age_s=3600) == []  # all just written
    assert scan_inbox(home / "missing") == []
    assert qmsum_domain(found[0]) == "committee" and qmsum_domain(found[2]) == "product"
    with pytest.raises(DataFileError, match="cannot tell the QMSum domain"):
        qmsum_domain(inbox / "meeting.jsonl")


def test_good_csv_is_accepted(home):
    inbox = home / "inbox"
    inbox.mkdir()
    f = _good_csv(inbox / "mine.csv")
    result = validate_file(f)
    assert sorted(c.context_id for c in result.contexts) == ["ed:in:1", "ed:in:2"]
    dest = accept(f, home)
    assert dest == home / "data" / "incoming" / "empatheticdialogues" / "mine.csv"
    assert dest.is_file() and not f.exists()
    ed, qm = incoming_sources(home)
    assert ed == [dest] and qm == []
    assert len(load_empathetic_dialogues(ed[0]).contexts) == 2
    # The same conversations dropped again are refused: the contexts asset would see duplicates.
    again = _good_csv(inbox / "mine.csv")
    with pytest.raises(DataFileError, match=r"ed:in:1 is already read from .*incoming.*mine\.csv"):
        validate_file(again, home)


def test_malformed_csv_is_rejected_whole(home):
    inbox = home / "inbox"
    inbox.mkdir()
    _good_csv(inbox / "good.csv")
    _bad_csv(inbox / "bad.csv")
    outcomes = {o.file.name: o for o in process_inbox(home)}
    assert outcomes["good.csv"].accepted and outcomes["good.csv"].contexts == 2
    bad = outcomes["bad.csv"]
    assert not bad.accepted
    assert bad.moved_to == home / "inbox" / "rejected" / "bad.csv" and bad.moved_to.is_file()
    note = (home / "inbox" / "rejected" / "bad.csv.error.txt").read_text(encoding="utf-8")
    assert "bad.csv" in note and "line 4" in note and "hangry" in note
    # Nothing of the bad file reached incoming, not even its valid first conversation.
    ed, _ = incoming_sources(home)
    assert [p.name for p in ed] == ["good.csv"]
    assert scan_inbox(home / "inbox") == []


def test_good_jsonl_is_accepted(home):
    inbox = home / "inbox"
    (inbox / "Academic").mkdir(parents=True)
    f1 = inbox / "product_launch.jsonl"
    f1.write_text(json.dumps(_meeting("launch")) + "\n", encoding="utf-8")
    f2 = inbox / "Academic" / "seminar.jsonl"
    f2.write_text(json.dumps(_meeting("seminar")) + "\n", encoding="utf-8")
    # The packaged committee meeting with one turn changed: a new transcript (an exact copy is
    # refused, as the packaged data holds its ids: tests/test_faults_data.py).
    meeting = json.loads((DATA / "qmsum" / "Committee" / "demo.jsonl").read_text(encoding="utf-8"))
    meeting["meeting_transcripts"][0]["content"] += " (second sitting)"
    (inbox / "committee_demo.jsonl").write_text(json.dumps(meeting) + "\n", encoding="utf-8")
    outcomes = process_inbox(home)
    assert all(o.accepted for o in outcomes), [o.error for o in outcomes]
    ed, qm = incoming_sources(home)
    base = home / "data" / "incoming" / "qmsum"
    assert ed == [] and qm == sorted([base / "academic" / "seminar.jsonl",
                                      base / "committee" / "committee_demo.jsonl",
                                      base / "product" / "product_launch.jsonl"])
    contexts = [c for f in qm for c in load_qmsum(f).contexts]
    assert {c.domain for c in contexts} == {"academic", "committee", "product"}
    assert any(c.situation == "launch planning" and c.domain == "product" for c in contexts)


def test_malformed_jsonl_is_rejected_whole(home):
    inbox = home / "inbox"
    inbox.mkdir()
    bad_span = _meeting("budget")
    bad_span["topic_list"][0]["relevant_text_span"] = [["0", "9"]]  # only 4 turns
    lines = [json.dumps(_meeting("roadmap")), json.dumps(bad_span)]
    (inbox / "product_bad.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (inbox / "committee_broken.jsonl").write_text('{"topic_list": [\n', encoding="utf-8")
    (inbox / "nodomain.jsonl").write_text(json.dumps(_meeting("x")) + "\n", encoding="utf-8")
    outcomes = {o.file.name: o for o in process_inbox(home)}
    assert not any(o.accepted for o in outcomes.values())
    rejected = home / "inbox" / "rejected"
    note = (rejected / "product_bad.jsonl.error.txt").read_text(encoding="utf-8")
    assert "line 2" in note and "0 <= start <= end < 4" in note
    note = (rejected / "committee_broken.jsonl.error.txt").read_text(encoding="utf-8")
    assert "line 1" in note and "invalid JSON" in note
    assert "QMSum domain" in (rejected / "nodomain.jsonl.error.txt").read_text(encoding="utf-8")
    assert sorted(p.name for p in rejected.glob("*.jsonl")) == [
        "committee_broken.jsonl", "nodomain.jsonl", "product_bad.jsonl"]
    assert incoming_sources(home) == ([], [])  # the valid first meeting was not half-loaded


def test_reject_keeps_earlier_rejections(home):
    inbox = home / "inbox"
    inbox.mkdir()
    first = reject(_bad_csv(inbox / "bad.csv"), home, "first error")
    second = reject(_bad_csv(inbox / "bad.csv"), home, DataFileError("second error"))
    assert first.name == "bad.csv" and second.name == "bad-2.csv"
    assert "second error" in (second.parent / "bad-2.csv.error.txt").read_text(encoding="utf-8")
    assert "first error" in (first.parent / "bad.csv.error.txt").read_text(encoding="utf-8")
