"""Every CLI mistake a user can make gets one line on stderr naming what to do, never a
traceback (issue 32): the real `mascot` command in a subprocess, a fresh home."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

MASCOT = str(Path(sys.executable).parent / "mascot")


def _run(home: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "MASCOT_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([MASCOT, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode != 0, proc
    assert "Traceback" not in err and "╭" not in err, err  # no Python or rich traceback
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def test_serve_with_an_alias_that_does_not_exist(home):
    proc = _run(home, "serve", "--adapter", "models:/mascot-persona-anchor@champion",
                "--engine", "transformers", "--port", "0")
    _one_line_error(proc, "--adapter models:/mascot-persona-anchor@champion",
                    "models:/NAME/VERSION", "leave out --adapter")


def test_query_without_its_parameter(home):
    _one_line_error(_run(home, "query", "dialogue"),
                    "query dialogue needs --param dialogue_id=VALUE")


def test_unknown_query_names_the_available_ones(home):
    _one_line_error(_run(home, "query", "nope"), "no query 'nope'", "eval_summary")


def test_query_before_any_demo_run(home):
    _one_line_error(_run(home, "query", "eval_summary"), "does not exist yet",
                    "run `make demo` first")


def test_query_help_lists_the_queries_and_their_parameters(home):
    proc = _run(home, "query", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "dialogue --param dialogue_id=...:" in text and "eval_summary:" in text
    assert "persona_probe:" in text


def test_truncated_output_says_so(home):
    from mascot_dag.lib.storage import db

    with db.connect(home / "mascot.duckdb") as con:
        for i, split in enumerate(("train", "eval", "ood")):
            con.execute("INSERT INTO contexts VALUES (?, 'empatheticdialogues', "
                        "'emotional_support', ?, 's', 't', 'sad', 'negative', NULL, NULL, NULL, "
                        "NULL, 'demo.csv', 'line 2')", [f"ed:{i}", split])
    proc = _run(home, "query", "contexts_by_split", "--limit", "1")
    assert proc.returncode == 0, proc.stderr
    assert "(showing 1 of 3 rows; --limit 0 shows all)" in proc.stdout
    everything = _run(home, "query", "contexts_by_split", "--limit", "0")
    assert "showing" not in everything.stdout and everything.stdout.count("ood") == 1


def test_unknown_roster(home):
    _one_line_error(_run(home, "chat", "--roster", "family", "--turns", "1"),
                    "--roster 'family'", "support")


@pytest.mark.parametrize("command", [["rate"], ["chat", "--web"]])
def test_port_in_use(home, command):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = _run(home, *command, "--port", str(port))
    _one_line_error(proc, f"port {port} on 127.0.0.1 is not free", "--port")


def test_report_before_any_demo_run(home):
    _one_line_error(_run(home, "report"), "no report yet", "make demo")


def test_version(home):
    from importlib.metadata import version

    proc = _run(home, "--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"mascot-dag {version('mascot-dag')}"
