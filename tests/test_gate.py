"""Champion gate in both directions against a real MLflow sqlite registry."""

from __future__ import annotations

import pandas as pd

from mascot_dag.assets.evaluation import DIRECTOR_MODEL, apply_gate, current_champion_score
from mascot_dag.lib.champion import decide_champion, overall_score
from mascot_dag.resources.tracking import MLflowResource


def _scores(value: float) -> pd.DataFrame:
    return pd.DataFrame([
        {"method": "mascot", "dialogue_id": "d1", "level": lvl, "judge": "embedded",
         "criterion": c, "value": value, "higher_is_better": True}
        for lvl, c in (("agent", "consistency"), ("collective", "fidelity"))
    ])


def _register(tracking: MLflowResource, tmp_path, name: str) -> str:
    adapter = tmp_path / name
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with tracking.start_run("gate-test", name) as run:
        tracking.log_adapter(adapter)
    return tracking.register_version(name, run)


def test_gate_promotes_then_keeps(tmp_path):
    tracking = MLflowResource(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                              artifact_root=str(tmp_path / "art"))
    tracking.configure()
    v1 = _register(tracking, tmp_path, DIRECTOR_MODEL)
    assert current_champion_score(tracking) is None
    first = decide_champion(overall_score(_scores(4.0), "mascot"), current_champion_score(tracking))
    assert first.promote
    moved = apply_gate(tracking, first, {DIRECTOR_MODEL: v1})
    assert moved == [f"{DIRECTOR_MODEL}@{v1}"]
    assert tracking.get_alias_version(DIRECTOR_MODEL, "champion") == v1
    assert abs(current_champion_score(tracking) - 75.0) < 1e-6  # 4.0 on 1-5 -> 75 on 0-100

    (tmp_path / "second").mkdir()
    v2 = _register(tracking, tmp_path / "second", DIRECTOR_MODEL)
    worse = decide_champion(overall_score(_scores(3.0), "mascot"), current_champion_score(tracking))
    assert not worse.promote and "75.00" in worse.reason and "50.00" in worse.reason
    assert apply_gate(tracking, worse, {DIRECTOR_MODEL: v2}) == []
    assert tracking.get_alias_version(DIRECTOR_MODEL, "champion") == v1

    better = decide_champion(overall_score(_scores(4.5), "mascot"), current_champion_score(tracking))
    assert better.promote
    apply_gate(tracking, better, {DIRECTOR_MODEL: v2})
    assert tracking.get_alias_version(DIRECTOR_MODEL, "champion") == v2
