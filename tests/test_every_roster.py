"""Every roster trained (issue 31 item 3, docs/decisions/0070-every-roster-trained.md): the study,
paper and cluster profiles align every persona set of the folder, the workplace set on meeting
contexts; embedded and tiny align one set (`train_persona_sets`). The partitions are the trained
sets' persona ids, built when the definitions load from MASCOT_PROFILE and MASCOT_SET."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import q

from mascot_dag.lib.data.personas import (
    PersonaFileError,
    load_personas,
    personas_of_set,
    set_mode,
    trained_sets,
)

REPO = Path(__file__).resolve().parents[1]
MASCOT = str(Path(sys.executable).parent / "mascot")
CARDS = load_personas()
SUPPORT = [c.persona_id for c in personas_of_set(CARDS, "support")]
WORKPLACE = [c.persona_id for c in personas_of_set(CARDS, "workplace")]
ONE = WORKPLACE[0]  # the workplace persona whose adapter the tiny run trains


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **extra}
    for key in ("MASCOT_PERSONAS_DIR", "MASCOT_CONTEXTS_PATH", "MASCOT_SIZES", "MASCOT_SET"):
        if key not in extra:
            env.pop(key, None)
    return env


def _partitions(**env: str) -> list[str]:
    """The persona partitions a fresh process builds when it loads the definitions."""
    code = ("import json; import mascot_dag.definitions; from mascot_dag.assets.common import "
            "persona_partitions; print(json.dumps(persona_partitions.get_partition_keys()))")
    out = subprocess.run([sys.executable, "-c", code], env=_env(**env), capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_partitions_follow_the_profile():
    assert _partitions(MASCOT_PROFILE="study") == SUPPORT + WORKPLACE
    assert _partitions(MASCOT_PROFILE="tiny") == SUPPORT
    # a profile's sizes bring their set count: study resources at the tiny sizes train one set
    assert _partitions(MASCOT_PROFILE="study", MASCOT_SIZES="tiny") == SUPPORT
    assert _partitions(MASCOT_PROFILE="tiny",
                       MASCOT_SET=json.dumps(['train_persona_sets=["workplace"]'])) == WORKPLACE


def test_profiles_say_which_sets_they_train():
    from mascot_dag.profiles import settings_for

    for name in ("study", "paper", "cluster"):
        assert settings_for(name).train_persona_sets == ["all"], name
    for name in ("embedded", "tiny"):
        assert settings_for(name).train_persona_sets == [], name


def test_trained_sets_and_their_modes():
    assert trained_sets(CARDS) == ["support"]
    assert trained_sets(CARDS, ["all"]) == ["support", "workplace"]
    assert trained_sets(CARDS, ["workplace"]) == ["workplace"]
    assert set_mode(CARDS, "workplace") == "meeting" and set_mode(CARDS, "support") == "support"
    with pytest.raises(PersonaFileError, match=r"no persona set nope .*support, workplace"):
        trained_sets(CARDS, ["nope"])
    from mascot_dag.resources.settings import LineageSettings

    with pytest.raises(ValueError, match="'all' stands alone"):
        LineageSettings(train_persona_sets=["all", "support"])


def test_sets_verdict_passes_only_when_every_set_passes():
    import dataclasses

    from mascot_dag.lib.stage1.panel import PanelVerdict, sets_verdict

    ok = PanelVerdict(True, 0.2, 0.1, 0.3, 8, 64, "lexical/training", ("anchor",), (), (), {},
                      "gain")
    flat = dataclasses.replace(ok, passed=False, gain=0.0, lo=-0.1, hi=0.1, established=(),
                               description="no gain")
    assert sets_verdict({"support": ok}) is ok
    both = sets_verdict({"support": ok, "workplace": flat})
    assert not both.passed and both.lo == -0.1 and both.reader.startswith("workplace: ")
    assert "support roster: gain" in both.description
    assert "workplace roster: no gain" in both.description
    assert sets_verdict({"support": ok, "workplace": ok}).passed


def _demo(home: Path, sets: list[str], *args: str, timeout: int = 1200):
    env = _env(MASCOT_HOME=str(home), DAGSTER_HOME=str(home / "dagster"), MASCOT_PROFILE="tiny")
    return subprocess.run([MASCOT, "demo", "--profile", "tiny",
                           "--set", f"train_persona_sets={json.dumps(sets)}", *args],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_workplace_adapter_trains_on_meeting_contexts(tmp_path):
    """The tiny sizes, the workplace set trained: its personas' candidates, judgments and pairs,
    the reward model, and one workplace persona's adapter, through `mascot demo --select`."""
    home = tmp_path / "home"
    select = ["contexts", "persona_cards", "persona_prompts", "candidate_responses",
              "persona_judgments", "persona_preference_pairs", "persona_reward_model",
              f"persona_adapters:{ONE}"]
    # from the base model, no warm start: pi_SFT and the warm start have their own tests, and
    # this one is about the workplace set's contexts, roster and probe (suite time: ~2 min less)
    proc = _demo(home, ["workplace"], "--set", "policy_init=base", "--set", "warm_start_steps=0",
                 *(a for s in select for a in ("--select", s)))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    sources = dict(q(home, "SELECT c.persona_id, list(DISTINCT x.source) FROM candidates c "
                                "JOIN contexts x USING (context_id) GROUP BY 1"))
    assert set(sources) == set(WORKPLACE), sources  # the workplace roster, no support persona
    assert all(s == ["qmsum"] for s in sources.values()), sources  # meetings only
    # the cross-persona pool is the persona's own roster
    judged = q(home, "SELECT DISTINCT split_part(target_id, '|', 2) FROM judgments")
    assert {r[0] for r in judged} == set(WORKPLACE)
    probed = q(home, "SELECT DISTINCT p.persona_id, x.source FROM persona_probe p "
                          "JOIN contexts x USING (context_id)")
    assert probed == [(ONE, "qmsum")], probed  # probed on held-out meetings
    assert q(home, "SELECT DISTINCT persona_set FROM probe_readers") == [("workplace",)]
    code = ("from mascot_dag.profiles import resources_for; from mascot_dag.registry import "
            f"persona_model; print(resources_for('tiny')['tracking'].latest_version("
            f"persona_model({ONE!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(MASCOT_HOME=str(home)), timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "1"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_trained_set_without_contexts_of_its_mode_is_a_clear_error(tmp_path):
    """Every QMSum domain held out (ood_domains): the train split has no meeting, so the
    workplace set's candidates fail at once, naming the set, the mode and the setting."""
    home = tmp_path / "home"
    proc = _demo(home, ["workplace"], "--set", 'ood_domains=["academic","committee","product"]',
                 "--select", "contexts", "--select", "persona_cards",
                 "--select", f"candidate_responses:{ONE}", timeout=600)
    assert proc.returncode != 0, proc.stdout[-2000:]
    said = proc.stdout + proc.stderr
    # a dg.Failure without retries (assets/common.input_errors_fail_at_once): failed at once
    assert "Failure: NoModeContexts: persona set 'workplace'" in said, said[-3000:]
    assert "speaks in meeting contexts" in said and "train_persona_sets" in said, said[-3000:]
