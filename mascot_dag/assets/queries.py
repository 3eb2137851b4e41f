"""The store's reads and writes that several asset modules share: one place for each query
(the contexts of a split, a roster, the dialogue tables), so asset modules never import each
other for them."""

from __future__ import annotations

import json

import polars as pl

from mascot_dag.assets.common import counts, table_metadata
from mascot_dag.lib.data.personas import PersonaCard
from mascot_dag.lib.dialogue.rollout import record_tables, records_from_frames
from mascot_dag.lib.storage.tables import card_from_row, context_from_row
from mascot_dag.lib.types import Context
from mascot_dag.resources.settings import LineageSettings
from mascot_dag.resources.store import DuckDBStore

SOURCES = ("empatheticdialogues", "qmsum")


def contexts_of(store: DuckDBStore, split: str, source: str, limit: int = 0) -> list[Context]:
    """The contexts of one source in `split` (limit 0 = all), in md5 order of their ids: a
    deterministic sample that mixes valences instead of the first N ids. The one context query
    of the lineage."""
    limit_sql = f"LIMIT {int(limit)}" if limit else ""
    rows = store.frame("SELECT * FROM contexts WHERE split = ? AND source = ? "
                       f"ORDER BY md5(context_id) {limit_sql}", [split, source]).to_dicts()
    return [context_from_row(r) for r in rows]


class NoModeContexts(ValueError):
    """A trained persona set without contexts of the mode it speaks in: an input error (the
    data or the setting), which fails the step at once (assets/common.input_errors_fail_at_once)."""


def persona_set_contexts(store: DuckDBStore, settings: LineageSettings, split: str,
                         limit: int, persona_set: str) -> list[Context]:
    """Contexts of `split` (limit 0 = all) of the mode `persona_set` speaks in: the workplace set
    in meetings (QMSum-format contexts), every other set in support contexts (EmpatheticDialogues
    format, or a user's support-mode contexts); lib.data.personas.set_mode says which. None:
    NoModeContexts naming the set, the mode and the setting to change."""
    from mascot_dag.lib.data.personas import set_mode
    from mascot_dag.lib.data.user_contexts import MODES

    cards = [card_from_row(r) for r in store.frame("SELECT * FROM personas").to_dicts()]
    mode = set_mode(cards, persona_set) if cards else "support"
    source = MODES[mode]
    out = contexts_of(store, split, source, limit)
    if out:
        return out
    if store.frame("SELECT count(*) AS n FROM contexts")["n"].item() == 0:
        raise ValueError(f"no {split} contexts from {source}: materialise `contexts` first")
    raise NoModeContexts(
        f"persona set {persona_set!r} is trained (train_persona_sets={settings.train_persona_sets}"
        f", train_persona_set={settings.train_persona_set!r}) and speaks in {mode} contexts, but "
        f"the {split} split holds no {mode} contexts (source {source}): load them "
        f"({'MASCOT_QMSUM_PATH' if mode == 'meeting' else 'MASCOT_ED_PATH'} or a contexts file "
        f"with mode {mode}), or leave {persona_set!r} out of the setting train_persona_sets "
        f"(e.g. --set 'train_persona_sets=[...]' naming the other sets)")


def train_contexts(store: DuckDBStore, settings: LineageSettings,
                   persona_set: str) -> list[Context]:
    return persona_set_contexts(store, settings, "train", settings.max_train_contexts,
                                persona_set)


def persona_roster(store: DuckDBStore, persona_id: str) -> list[PersonaCard]:
    """The roster of a persona's own set (the personas it trains and is judged beside)."""
    rows = store.frame("SELECT persona_set FROM personas WHERE persona_id = ?", [persona_id])
    if rows.is_empty():
        raise ValueError(f"no persona {persona_id!r}: materialise `persona_cards` first")
    return load_roster(store, rows["persona_set"].item())


def pick_contexts(store: DuckDBStore, split: str, per_mode: int,
                  required: bool = True) -> list[Context]:
    """Up to `per_mode` contexts of each source from a split, in a fixed hash order
    (`required=False`: an empty split gives [], e.g. the OOD split of a held-out source)."""
    out = [c for source in SOURCES for c in contexts_of(store, split, source, per_mode)]
    if not out and required:
        raise ValueError(f"no {split} contexts: materialise `contexts` first")
    return out


def all_contexts(store: DuckDBStore) -> dict[str, Context]:
    return {r["context_id"]: context_from_row(r)
            for r in store.frame("SELECT * FROM contexts").to_dicts()}


def load_roster(store: DuckDBStore, persona_set: str) -> list[PersonaCard]:
    rows = store.frame("SELECT * FROM personas WHERE persona_set = ? ORDER BY persona_id",
                       [persona_set])
    if rows.is_empty():
        raise ValueError(f"no personas of set {persona_set!r}: materialise `persona_cards` first")
    return [card_from_row(r) for r in rows.to_dicts()]


def rosters(store: DuckDBStore) -> dict[str, list[PersonaCard]]:
    """{"support": the roster of support contexts, "workplace": the roster of meetings}: the
    packaged sets, or the user's folder's (lib.data.personas.mode_sets says which is which)."""
    from mascot_dag.lib.data.personas import mode_sets

    cards = [card_from_row(r) for r in store.frame("SELECT * FROM personas").to_dicts()]
    if not cards:
        raise ValueError("no personas: materialise `persona_cards` first")
    return {role: load_roster(store, s) for role, s in mode_sets(cards).items()}


def roster_ids(by_mode: dict[str, list[PersonaCard]]) -> list[str]:
    """The persona ids of every roster of `rosters(store)` (support and meeting), once each: the
    personas whose registered adapters a dialogue loads, looked up per persona (a persona
    without a version speaks as the base model with its prompt, labelled so)."""
    return list(dict.fromkeys(c.persona_id for cards in by_mode.values() for c in cards))


def write_dialogues(store: DuckDBStore, records, prefix: str) -> tuple:
    dialogues, turns, directives = record_tables(records)
    like = [f"{prefix}:%"]
    store.replace_many([
        ("dialogues", dialogues, "dialogue_id LIKE ?", like),
        ("turns", turns, "dialogue_id LIKE ?", like),
        ("directives", directives, "dialogue_id LIKE ?", like),
    ])
    return dialogues, turns, directives


def dialogue_metadata(dialogues, turns, directives, **extra) -> dict:
    agent = turns.filter(pl.col("role") == "agent")
    directed = agent.join(directives, on=["dialogue_id", "turn_idx"], how="inner")
    return table_metadata(
        turns.select("dialogue_id", "turn_idx", "speaker", "text"),
        dialogues=len(dialogues),
        by_mode=counts(dialogues, "mode"),
        agent_turns=len(agent),
        agent_turns_with_directive=directed.height,
        directive_status=counts(directives, "status") if len(directives) else {},
        speakers=counts(agent, "speaker"),
        **extra,
    )


def method_versions(store: DuckDBStore, method: str = "mascot") -> dict[str, str]:
    """{registered model: version} of the adapters the method's eval dialogues used (`mascot`:
    what the gate would promote; `champion`: what the champion run used)."""
    out = {}
    for models in store.frame("SELECT models FROM dialogues WHERE method = ? AND stage = 'eval'",
                              [method])["models"]:
        m = json.loads(models)
        for name in [*m.get("personas", {}).values(), m.get("director")]:
            if name and "@v" in name:
                model_name, version = name.split("@v", 1)
                out[model_name] = version
    return out


def probe_verdict(store: DuckDBStore, settings: LineageSettings, versions: dict[str, str]):
    """The probe panel's verdict (lib/stage1/panel.PanelVerdict) on the persona adapters
    `versions` names ({model: version}), or (None, why there is none)."""
    from mascot_dag.lib.evaluation.stats import MIN_CLUSTERS_FOR_SIGNIFICANCE
    from mascot_dag.lib.stage1.panel import roster_panel

    used = {f"{name}/{v}" for name, v in versions.items() if name.startswith("mascot-persona-")}
    probed = store.frame("SELECT DISTINCT persona_id, model_version FROM persona_probe "
                         "WHERE arm = 'adapter'")
    if not used:
        return None, "the evaluation used no persona adapter"
    missing = used - set(probed["model_version"].to_list())
    if missing:
        return None, f"no probe of {', '.join(sorted(missing))}"
    from mascot_dag.lib.stage1.panel import sets_verdict

    personas = set(probed.filter(pl.col("model_version").is_in(list(used)))["persona_id"]
                   .to_list())
    sets = store.frame("SELECT persona_set, persona_id FROM personas ORDER BY persona_id")
    by_set: dict[str, list[str]] = {}
    for persona_set, pid in sets.rows():
        if pid in personas:
            by_set.setdefault(persona_set, []).append(pid)
    try:  # each trained set's roster apart; the verdict passes when every set's passes
        return sets_verdict({s: roster_panel(store.frame, ids, s, MIN_CLUSTERS_FOR_SIGNIFICANCE,
                                             seed=settings.seed).verdict
                             for s, ids in by_set.items()}), ""
    except ValueError as e:
        return None, str(e)


def dialogue_records(store: DuckDBStore, prefix: str) -> list:
    """The stored dialogues under `prefix` (e.g. `rollout`) as records with their turns."""
    like = [f"{prefix}:%"]
    dialogues = store.frame("SELECT * FROM dialogues WHERE dialogue_id LIKE ?", like)
    turns = store.frame("SELECT * FROM turns WHERE dialogue_id LIKE ?", like)
    return records_from_frames(dialogues, turns, turns.clear())
