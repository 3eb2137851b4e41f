"""Foundation: contexts and personas in DuckDB through Dagster, atomic and idempotent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from mascot_dag.assets import contexts as contexts_mod
from mascot_dag.assets import personas as personas_mod
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _materialize(home: Path, run_config=None, raise_on_error=True):
    assets = dg.load_assets_from_modules([contexts_mod, personas_mod])
    checks = dg.load_asset_checks_from_modules([contexts_mod, personas_mod])
    return dg.materialize(
        [*assets, *checks],
        resources={"store": DuckDBStore(path=str(home / "mascot.duckdb")),
                   "settings": LineageSettings()},
        run_config=run_config,
        raise_on_error=raise_on_error,
    )


def _count(home: Path, sql: str):
    con = duckdb.connect(str(home / "mascot.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_demo_contexts_and_personas_idempotent(home):
    result = _materialize(home)
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert checks and all(c.passed for c in checks), [(c.check_name, c.passed) for c in checks]
    n1 = _count(home, "SELECT count(*), count(DISTINCT source), count(DISTINCT split) "
                      "FROM contexts")[0]
    assert n1[0] > 80 and n1[1] == 2 and n1[2] == 2
    valences = {r[0] for r in _count(
        home, "SELECT DISTINCT valence FROM contexts WHERE valence IS NOT NULL")}
    assert valences == {"positive", "negative", "neutral"}
    assert _count(home, "SELECT count(*) FROM personas")[0][0] == 8
    assert _count(home, "SELECT count(DISTINCT style) FROM persona_prompts")[0][0] >= 2
    # Re-materialising replaces rows: same counts, no duplicates.
    assert _materialize(home).success
    assert _count(home, "SELECT count(*) FROM contexts")[0][0] == n1[0]
    assert _count(home, "SELECT count(*) FROM persona_prompts")[0][0] == 16
    meta = result.asset_materializations_for_node("contexts")[0].metadata
    assert meta["dagster/row_count"].value == n1[0]


def test_malformed_csv_fails_with_file_and_line_and_keeps_old_rows(home, tmp_path):
    assert _materialize(home).success
    before = _count(home, "SELECT count(*) FROM contexts")[0][0]
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "conv_id,utterance_idx,context,prompt,speaker_idx,utterance,selfeval,tags\n"
        "hit:1_conv:2,1,sad,My dog died,,It was awful,,\n"
        "hit:1_conv:2,two,sad,My dog died,,Sorry,,\n",
        encoding="utf-8",
    )
    cfg = {"ops": {"contexts": {"config": {"ed_path": str(bad)}}}}
    result = _materialize(home, run_config=cfg, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    msg = str(failure.step_failure_data.error.message) + str(failure.step_failure_data.error.cause)
    assert "bad.csv" in msg and "3" in msg
    assert _count(home, "SELECT count(*) FROM contexts")[0][0] == before
    # With skip_bad_rows a file keeping 1 of its 2 lines still fails (below min_kept_fraction,
    # 0.9 by default); with the fraction lowered the bad row is skipped and counted.
    cfg["ops"]["contexts"]["config"]["skip_bad_rows"] = True
    result = _materialize(home, run_config=cfg, raise_on_error=False)
    assert not result.success and "only 1 of 2 data lines loaded" in str(result.all_events)
    assert _count(home, "SELECT count(*) FROM contexts")[0][0] == before
    cfg["ops"]["contexts"]["config"]["min_kept_fraction"] = 0.5
    ok = _materialize(home, run_config=cfg)
    assert ok.asset_materializations_for_node("contexts")[0].metadata["skipped_rows"].value == 1


def _cli_env(home: Path, **extra) -> dict:
    env = {**os.environ, "MASCOT_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"),
           "HF_HUB_OFFLINE": "1", **extra}
    (home / "dagster").mkdir(exist_ok=True)
    return env


def test_cli_materialize_several_duckdb_writers_in_one_run(home, shared_data):
    """The Done-when command: real ED valid split and QMSum test files through the dagster CLI."""
    env = _cli_env(
        home,
        MASCOT_ED_PATH=str(shared_data / "empatheticdialogues" / "valid.csv"),
        MASCOT_QMSUM_PATH=str(shared_data / "qmsum"),
    )
    proc = subprocess.run(
        [str(BIN / "dagster"), "asset", "materialize", "--select",
         "contexts,persona_cards,persona_prompts", "-m", "mascot_dag.definitions"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = dict(_count(home, "SELECT source, count(*) FROM contexts GROUP BY source"))
    assert rows["empatheticdialogues"] == 2770
    meetings = _count(
        home, "SELECT count(DISTINCT meeting_id) FROM contexts WHERE source = 'qmsum'")
    assert meetings[0][0] == 35
    assert _count(home, "SELECT count(*) FROM personas")[0][0] == 8


def test_definitions_validate(home):
    proc = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", "-m", "mascot_dag.definitions"],
        cwd=REPO, env=_cli_env(home), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_every_asset_and_check_says_what_it_is():
    """Dagster tells the truth: every asset and check has a description, and a check declared
    blocking whose profile setting can turn blocking off says 'warn-only' where it cannot block
    (a WARN result never blocks: the description must not claim otherwise)."""
    import inspect

    from mascot_dag.assets.common import WARN_ONLY
    from mascot_dag.definitions import defs

    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        assert graph.get(key).description, f"asset {key.to_user_string()} has no description"
    specs = {spec.name: spec for check in defs.asset_checks or [] for spec in check.check_specs}
    specs |= {spec.name: spec for a in defs.assets or [] for spec in getattr(a, "check_specs", [])}
    for name, spec in specs.items():
        assert spec.description, f"check {name} has no description"
    from mascot_dag.assets import probe, reward_model

    # the two gates a profile can switch off: declared blocking, described as warn-only there,
    # and their WARN results start with WARN_ONLY (the source says so where the severity is set)
    for module, check, setting in ((probe, "roster_fidelity_effect", "probe_blocking"),
                                   (reward_model, "heldout_accuracy_vs_chance",
                                    "reward_blocking")):
        assert specs[check].blocking
        assert "warn-only in the embedded and tiny profiles" in specs[check].description
        assert f'"" if settings.{setting} else WARN_ONLY' in inspect.getsource(module)
    assert WARN_ONLY.startswith("warn-only in this profile")


def test_definitions_hold_the_lineage():
    from mascot_dag.definitions import defs

    keys = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
    assert {"contexts", "persona_cards", "persona_prompts"} <= keys


@pytest.mark.parametrize("bad_env", ["MASCOT_ED_PATH"])
def test_missing_path_is_a_clear_error(home, bad_env, tmp_path):
    cfg = {"ops": {"contexts": {"config": {"ed_path": str(tmp_path / "nope.csv")}}}}
    result = _materialize(home, run_config=cfg, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "nope.csv" in str(failure.step_failure_data.error.message) + str(
        failure.step_failure_data.error.cause)


def test_schedule_and_sensor_are_listed_stopped(home):
    env = _cli_env(home)
    # weekly_retrain is a cron-keeping sensor: Dagster's scheduler cannot start an asset backfill
    for kind, name in (("sensor", "weekly_retrain"), ("sensor", "inbox_sensor")):
        proc = subprocess.run(
            [str(BIN / "dagster"), kind, "list", "-m", "mascot_dag.definitions"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"{name} [STOPPED]" in proc.stdout, proc.stdout[-2000:]


def test_metadata_floats_are_rounded():
    """Metadata shows meaningful digits, not float noise, in results and their checks."""
    import dagster as dg

    from mascot_dag.assets.common import materialized, rounded

    assert rounded(0.71328125000000004) == 0.7133 and rounded(1234.5678) == 1235.0
    assert rounded(-0.000123456) == -0.0001235 and rounded(0.0) == 0.0
    assert rounded({"a": [0.123456, "x", 3], "b": float("nan")})["a"] == [0.1235, "x", 3]
    result = materialized({"gain": 0.123456789, "n": 12, "per": {"anchor": 0.987654321}},
                          check_results=[dg.AssetCheckResult(
                              check_name="c", passed=True, metadata={"lo": 0.0123456789})])
    assert result.metadata == {"gain": 0.1235, "n": 12, "per": {"anchor": 0.9877}}
    assert result.check_results[0].metadata["lo"].value == 0.01235
