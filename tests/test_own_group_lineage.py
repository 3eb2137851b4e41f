"""README "Your own group", run as written but for a selection: the tiny lineage on
examples/own_group (a three-persona set and a 20-row CSV of contexts), then the probe, the report
and `mascot chat` with what it trained (issue 31). One module-scoped home: the lineage is the
expensive part (~6 min on 2 busy cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import q

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "own_group"
IDS = ["tutor", "sceptic", "organiser"]
NAMES = {"The Tutor": "tutor", "The Sceptic": "sceptic", "The Organiser": "organiser"}
MASCOT = str(Path(sys.executable).parent / "mascot")
STAGE1 = ["contexts", "persona_cards", "persona_prompts", "policy_sft", "candidate_responses",
          "persona_judgments", "persona_preference_pairs", "persona_reward_model",
          "persona_adapters", "persona_roster_probe"]


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    home = tmp_path_factory.mktemp("own_group")
    env = {**os.environ, "MASCOT_HOME": str(home), "MASCOT_PROFILE": "tiny",
           "HF_HUB_OFFLINE": "1", "DAGSTER_HOME": str(home / "dagster")}
    env.pop("MASCOT_PERSONAS_DIR", None)
    env.pop("MASCOT_CONTEXTS_PATH", None)
    # the README's command but for the profile and a selection: what the assertions read
    # (Stage 1, its probe, MASCOT's evaluation and the report; 362 s against ~870 s for the
    # whole lineage on 2 busy cores). The rest of the lineage is the same code on other
    # personas: tests/test_lineage.py runs all of it.
    select = [*STAGE1, "eval_dialogues:mascot", "eval_scores", "three_way_comparisons",
              "human_ratings", "eval_report"]
    proc = subprocess.run([MASCOT, "demo", "--profile", "tiny",
                           "--personas", str(EXAMPLE / "personas"),
                           "--contexts", str(EXAMPLE / "contexts.csv"),
                           *(a for s in select for a in ("--select", s))],
                          env=env, capture_output=True, text=True, timeout=3000, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    # what later commands see: the same folder through the environment
    return {"home": home, "env": {**env, "MASCOT_PERSONAS_DIR": str(EXAMPLE / "personas")}}


def test_adapters_registered_for_the_custom_personas(own):
    code = ("import json; from mascot_dag.profiles import resources_for; from mascot_dag.registry "
            "import persona_model; t = resources_for('tiny')['tracking']; "
            f"print(json.dumps({{p: t.latest_version(persona_model(p)) for p in {IDS!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], env=own["env"], capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    versions = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(versions[p] for p in IDS), versions
    rows = q(own["home"], "SELECT persona_id, persona_set FROM personas ORDER BY 1")
    assert rows == [("organiser", "study_group"), ("sceptic", "study_group"),
                    ("tutor", "study_group")]
    n_user = q(own["home"], "SELECT count(*) FROM contexts WHERE context_id LIKE 'user:%'")
    assert n_user == [(20,)]


def test_probe_and_report_show_the_custom_ids(own):
    probed = {r[0] for r in q(own["home"], "SELECT DISTINCT persona_id FROM persona_probe")}
    assert probed == set(IDS)
    proc = subprocess.run([MASCOT, "probe"], env=own["env"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "study_group roster" in proc.stdout and all(p in proc.stdout for p in IDS), proc.stdout
    report = (own["home"] / "reports" / "latest.md").read_text(encoding="utf-8")
    assert any(p in report for p in IDS), report[:3000]


def _chat(env: dict, *args: str) -> list[str]:
    proc = subprocess.run([MASCOT, "chat", "--turns", "1", "--seed", "0", *args],
                          input="My exam is tomorrow and I can't focus.\n", env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


def test_chat_answers_as_a_custom_persona_with_its_version(own):
    out = _chat(own["env"])
    header = next(ln for ln in out if ln.startswith("Roster study_group"))
    label = "champion" if "models: champion" in header else "latest, not promoted"
    assert f"models: {label}" in header, out
    replies = [ln for ln in out if ln.startswith("[")]
    assert replies, out
    name = replies[0][1:replies[0].index("]")]
    pid = NAMES[name]
    assert f"<mascot-persona-{pid}/" in replies[0] and f"({label})>" in replies[0], replies
    base = [ln for ln in _chat(own["env"], "--models", "base") if ln.startswith("[")]
    assert base and "<base + persona prompt>" in base[0], base
    # same seed, same message: the trained group does not say what the base model says
    strip = [r.split("> ", 1)[-1] for r in (replies[0], base[0])]
    assert strip[0] != strip[1], (replies, base)
