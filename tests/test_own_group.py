"""Your own group (issue 31): the user's persona folder and contexts file, validated with errors
naming file and field or line, leaving stored data as it was; the partitions follow the folder;
the chat's choice of models. The whole tiny lineage on the example: test_own_group_lineage.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import duckdb
import polars as pl
import pytest
import yaml

from mascot_dag.lib.data.loading import DataFileError
from mascot_dag.lib.data.personas import PersonaFileError, load_personas, mode_sets, trained_set
from mascot_dag.lib.data.user_contexts import load_user_contexts

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "own_group"


def _card(pid: str, **over) -> dict:
    card = {"persona_id": pid, "name": f"The {pid.title()}", "role": "a test persona",
            "description": "Exists only to exercise the loader in tests.",
            "behaviours": ["checks things"], "avoid": ["guessing"],
            "examples": ["one example", "two examples", "three examples"]}
    return {**card, **over}


def _folder(tmp_path: Path, sets: dict[str, list[dict]]) -> Path:
    d = tmp_path / "personas"
    d.mkdir(exist_ok=True)
    for name, cards in sets.items():
        (d / f"{name}.yaml").write_text(yaml.safe_dump({"set": name, "personas": cards}))
    return d


# --- persona sets --------------------------------------------------------------------------------

def test_example_folder_loads_as_the_trained_set():
    cards = load_personas(EXAMPLE / "personas")
    assert [c.persona_id for c in cards] == ["tutor", "sceptic", "organiser"]
    assert trained_set(cards) == "study_group"
    # no workplace set: the user's set speaks in meetings too
    assert mode_sets(cards) == {"support": "study_group", "workplace": "study_group"}
    assert trained_set(load_personas()) == "support"  # the packaged default


@pytest.mark.parametrize(("sets", "pattern"), [
    ({"trio": [_card("a"), {k: v for k, v in _card("b").items() if k != "role"}, _card("c")]},
     r"trio\.yaml: persona b: field 'role'"),
    ({"solo": [_card("a")]}, r"solo\.yaml: field 'personas': set 'solo' has 1 persona;"),
    ({"big": [_card(f"p{i}") for i in range(9)]},
     r"big\.yaml: field 'personas': set 'big' has 9 personas; a set holds 2 to 8"),
    ({"one": [_card("a"), _card("b")], "two": [_card("b"), _card("c")]},
     r"two\.yaml: persona b: field 'persona_id': already used in one\.yaml"),
])
def test_bad_persona_folders_name_file_persona_and_field(tmp_path, sets, pattern):
    with pytest.raises(PersonaFileError, match=pattern):
        load_personas(_folder(tmp_path, sets))


def test_bad_persona_folder_leaves_the_stored_cards(tmp_path, monkeypatch):
    from mascot_dag.assets.personas import persona_cards
    from mascot_dag.resources.store import DuckDBStore

    store = DuckDBStore(path=str(tmp_path / "m.duckdb"))
    monkeypatch.setenv("MASCOT_PERSONAS_DIR", str(EXAMPLE / "personas"))
    assert dg.materialize([persona_cards], resources={"store": store}).success
    before = store.frame("SELECT persona_id FROM personas ORDER BY 1")["persona_id"].to_list()
    assert before == ["organiser", "sceptic", "tutor"]
    monkeypatch.setenv("MASCOT_PERSONAS_DIR", str(_folder(tmp_path, {"solo": [_card("a")]})))
    res = dg.materialize([persona_cards], resources={"store": store}, raise_on_error=False)
    assert not res.success
    failure = next(e for e in res.all_events if e.is_step_failure)
    assert "solo.yaml: field 'personas'" in str(failure.step_failure_data.error.cause)
    after = store.frame("SELECT persona_id FROM personas ORDER BY 1")["persona_id"].to_list()
    assert after == before


def test_partitions_are_the_users_personas():
    """The Definitions read the folder when they load (a fresh process: partitions are fixed at
    import), so the Dagster UI's persona partitions are the user's ids."""
    code = ("from mascot_dag.definitions import defs; import dagster as dg, json; "
            "g = defs.resolve_asset_graph(); "
            "print(json.dumps(g.get(dg.AssetKey('persona_adapters')).partitions_def"
            ".get_partition_keys()))")
    env = {"MASCOT_PERSONAS_DIR": str(EXAMPLE / "personas"), "HF_HUB_OFFLINE": "1",
           "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["tutor", "sceptic", "organiser"]


def test_missing_reference_utterances_say_na(tmp_path, monkeypatch):
    from mascot_dag.lib.stage1.readers import NoReferenceUtterances, load_reference_utterances

    monkeypatch.setenv("MASCOT_PERSONAS_DIR", str(_folder(tmp_path, {
        "duo": [_card("a"), _card("b")]})))
    with pytest.raises(NoReferenceUtterances, match="n/a: no reference utterances for duo"):
        load_reference_utterances("duo")
    # the packaged sets keep their own files; the example's set finds its file beside it
    assert "anchor" in load_reference_utterances("support")
    monkeypatch.setenv("MASCOT_PERSONAS_DIR", str(EXAMPLE / "personas"))
    assert set(load_reference_utterances("study_group")) == {"tutor", "sceptic", "organiser"}


def test_probe_command_says_na_for_a_set_without_references(tmp_path, home, monkeypatch):
    """`mascot probe` on a home whose stored set has no reference utterances says n/a for it
    (not only "no persona_probe rows")."""
    from mascot_dag.lib.storage.tables import personas_frame
    from mascot_dag.resources.store import DuckDBStore

    folder = _folder(tmp_path, {"duo": [_card("a"), _card("b")]})
    monkeypatch.setenv("MASCOT_PERSONAS_DIR", str(folder))
    cards = load_personas(folder)
    DuckDBStore(path=str(home / "mascot.duckdb")).replace(
        "personas", personas_frame(cards, {c.persona_id: "test" for c in cards}))
    proc = subprocess.run([str(Path(sys.executable).parent / "mascot"), "probe"],
                          env={**os.environ, "MASCOT_HOME": str(home)}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc
    assert "duo roster: n/a: no reference utterances for duo" in proc.stdout, proc.stdout
    assert proc.stderr.strip() == "no persona_probe rows: materialise persona_adapters"


# --- contexts ------------------------------------------------------------------------------------

ROWS = [{"context_id": "a1", "text": "I failed my exam.", "split": "eval"},
        {"context_id": "a2", "text": "Plan the launch.", "mode": "meeting", "domain": "product"},
        {"context_id": "a3", "text": "I feel stuck.",
         "history": json.dumps([{"speaker": "me", "text": "I feel stuck."}])}]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_contexts_file_formats(tmp_path, fmt):
    path = tmp_path / f"ctx.{fmt}"
    df = pl.DataFrame(ROWS)
    {"csv": df.write_csv, "jsonl": df.write_ndjson, "parquet": df.write_parquet}[fmt](path)
    got = {c.context_id: c for c in load_user_contexts(path).contexts}
    assert list(got) == ["user:a1", "user:a2", "user:a3"]
    assert got["user:a1"].source == "empatheticdialogues" and got["user:a1"].split == "eval"
    assert got["user:a2"].source == "qmsum" and got["user:a2"].domain == "product"
    assert got["user:a3"].turns == [{"speaker": "me", "text": "I feel stuck."}]


def test_your_domains_hold_out_and_group_the_report():
    """A user's `domain` is a held-out domain like QMSum's (ood_domains may name it; an unknown
    name is an error listing both), and the report's breakdown groups the user's contexts by it."""
    from mascot_dag.lib.data.split import OOD_SPLIT, assign_split_ood, validate_ood
    from mascot_dag.lib.evaluation.report_sections import context_groups

    validate_ood([], ["exams"], {"exams", "essays"})
    with pytest.raises(ValueError,
                       match=r"unknown \['poetry'\].*your contexts \['essays', 'exams'\]"):
        validate_ood([], ["poetry"], {"exams", "essays"})
    with pytest.raises(ValueError, match="unknown"):
        validate_ood([], ["exams"])  # no user contexts: QMSum domains only
    # a support-mode user context (stored with the ED source, no valence) is held out by domain
    held = assign_split_ood("user:a", "empatheticdialogues", None, None, "exams",
                            ood_domains=["exams"])
    kept = assign_split_ood("user:b", "empatheticdialogues", None, None, "essays",
                            ood_domains=["exams"])
    assert held == OOD_SPLIT and kept != OOD_SPLIT
    per = pl.DataFrame({"context_id": ["user:a", "user:b", "ed:1"]})
    ctx = pl.DataFrame({"context_id": ["user:a", "user:b", "ed:1"],
                        "source": ["empatheticdialogues", "qmsum", "empatheticdialogues"],
                        "valence": [None, None, "negative"], "domain": ["exams", None, None]})
    assert context_groups(per, ctx).to_list() == ["Yours exams", "Yours (no domain)",
                                                 "ED negative"]


def test_example_contexts_file():
    res = load_user_contexts(EXAMPLE / "contexts.csv")
    assert len(res.contexts) == 20 and {c.split for c in res.contexts} == {"train", "eval"}


@pytest.mark.parametrize(("text", "pattern"), [
    ("context_id,mode\na,support\n", r"bad\.csv: line 1: header lacks column\(s\) text"),
    ("context_id,text\na,hello\nb,\n", r"bad\.csv: line 3: field 'text' is missing or empty"),
    ("context_id,text\na,hello\na,again\n",
     r"bad\.csv: line 3: field 'context_id': duplicate id 'a' \(first at line 2\)"),
    ("", r"bad\.csv: file is empty"),
    ("context_id,text\n", r"bad\.csv: file is empty \(no rows\)"),
    ("context_id,text,mode\na,hello,chat\n", r"bad\.csv: line 2: field 'mode'"),
])
def test_bad_contexts_files_name_file_and_line(tmp_path, text, pattern):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(DataFileError, match=pattern):
        load_user_contexts(path)


def test_bad_jsonl_names_the_line_and_roster(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"context_id": "a", "text": "x"}\n\n{"context_id": "b"}\n')
    with pytest.raises(DataFileError, match=r"bad\.jsonl: line 3: field 'text'"):
        load_user_contexts(path)
    path.write_text('{"context_id": "a", "text": "x", "roster": "nobody"}\n')
    with pytest.raises(DataFileError, match=r"line 1: field 'roster': no persona set 'nobody'"):
        load_user_contexts(path, rosters={"support", "workplace"})


def test_bad_contexts_file_leaves_the_stored_contexts(tmp_path, monkeypatch):
    from mascot_dag.assets import contexts as contexts_mod
    from mascot_dag.resources.settings import LineageSettings
    from mascot_dag.resources.store import DuckDBStore

    db = tmp_path / "m.duckdb"

    def run(path: Path):
        monkeypatch.setenv("MASCOT_CONTEXTS_PATH", str(path))
        return dg.materialize([contexts_mod.contexts], raise_on_error=False, resources={
            "store": DuckDBStore(path=str(db)), "settings": LineageSettings()})

    def rows() -> list:
        con = duckdb.connect(str(db), read_only=True)
        try:
            return con.execute("SELECT context_id, split FROM contexts ORDER BY 1").fetchall()
        finally:
            con.close()

    assert run(EXAMPLE / "contexts.csv").success
    before = rows()
    assert sum(cid.startswith("user:") for cid, _ in before) == 20
    assert ("user:s04", "eval") in before  # the file's own split is kept
    bad = tmp_path / "bad.csv"
    bad.write_text("context_id,text\ns1,hello\ns1,again\n")
    res = run(bad)
    assert not res.success
    failure = next(e for e in res.all_events if e.is_step_failure)
    assert "bad.csv: line 3: field 'context_id': duplicate" in str(
        failure.step_failure_data.error.cause)
    assert rows() == before


# --- the chat's models ---------------------------------------------------------------------------

def test_models_labels_and_roster(monkeypatch):
    from mascot_dag.companions import LATEST, registry_alias, resolve_models, roster_of

    assert resolve_models("latest") == LATEST and registry_alias(LATEST) is None
    assert resolve_models("champion") == "champion" and registry_alias("champion") == "champion"
    assert resolve_models("staging") == "staging"
    roster, mode = roster_of("workplace")
    assert mode == "meeting" and roster[0].persona_set == "workplace"
    with pytest.raises(ValueError, match="--roster 'nobody': no such persona set"):
        roster_of("nobody")
    monkeypatch.setenv("MASCOT_PERSONAS_DIR", str(EXAMPLE / "personas"))
    roster, mode = roster_of(None)
    assert mode == "support" and [c.persona_id for c in roster] == ["tutor", "sceptic", "organiser"]


def test_roster_gate_says_na_without_reference_utterances(tmp_path, home, monkeypatch):
    """A user's set without probe/<set>.yaml: the gate reports n/a (a warning), never a verdict
    from another set's readers, and does not crash."""
    from mascot_dag.assets.probe import persona_roster_probe
    from mascot_dag.resources.settings import LineageSettings
    from mascot_dag.resources.store import DuckDBStore
    from mascot_dag.resources.tracking import MLflowResource

    monkeypatch.setenv("MASCOT_PERSONAS_DIR", str(_folder(tmp_path, {
        "duo": [_card("a"), _card("b")]})))
    res = dg.materialize([persona_roster_probe], resources={
        "store": DuckDBStore(path=str(home / "m.duckdb")), "tracking": MLflowResource(),
        "settings": LineageSettings(train_persona_set="duo")})
    assert res.success
    (check,) = res.get_asset_check_evaluations()
    assert check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert check.description.startswith("n/a: no reference utterances for duo")
