"""The inbox sensor on a temporary inbox: a good file starts a run, a malformed one is moved
aside."""

from __future__ import annotations

import os
import time

import dagster as dg

from mascot_dag.automation import inbox_sensor

GOOD = (
    "conv_id,utterance_idx,context,prompt,speaker_idx,utterance,selfeval,tags\n"
    "hit:900_conv:1800,1,proud,I finished my first marathon,1,I did it_comma_ 42 km!,,\n"
    "hit:900_conv:1800,2,proud,I finished my first marathon,2,That is amazing!,,\n"
)
BAD = (
    "conv_id,utterance_idx,context,prompt,speaker_idx,utterance,selfeval,tags\n"
    "hit:901_conv:1802,one,sad,Lost my keys,1,Ugh,,\n"
)


def _drop(home, name, text):
    inbox = home / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    path = inbox / name
    path.write_text(text, encoding="utf-8")
    old = time.time() - 60  # the sensor waits until a file is a few seconds old
    os.utime(path, (old, old))
    return path


def test_sensor_good_and_malformed(home):
    with dg.instance_for_test() as instance:
        ctx = dg.build_sensor_context(instance=instance)
        assert not inbox_sensor(ctx).run_requests  # empty inbox: nothing to do
        _drop(home, "bad.csv", BAD)
        result = inbox_sensor(ctx)
        assert not result.run_requests
        assert (home / "inbox" / "rejected" / "bad.csv").exists()
        assert "line 2" in (home / "inbox" / "rejected" / "bad.csv.error.txt").read_text() or \
            "2" in (home / "inbox" / "rejected" / "bad.csv.error.txt").read_text()
        _drop(home, "good.csv", GOOD)
        result = inbox_sensor(ctx)
        assert len(result.run_requests) == 1
        # an asset backfill of every partition of the lineage, as Materialize all
        req = result.run_requests[0]
        assert req.requires_backfill_daemon()
        keys = {k.to_user_string() for k in req.asset_graph_subset.asset_keys}
        assert {"contexts", "candidate_responses", "eval_dialogues", "eval_report"} <= keys
        assert not (home / "inbox" / "good.csv").exists()
        assert list((home / "data" / "incoming").rglob("good*.csv"))
