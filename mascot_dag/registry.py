"""Model versions in the MLflow registry -> adapters loaded into the chat backend: the names of
the registered models, which version an alias points at, and the adapter folder of a version.
Used by the assets, `mascot chat` and the pages (`mascot_dag.companions`), so it lives outside
assets/ (no asset module imports another)."""

from pathlib import Path

import polars as pl

from mascot_dag.lib.evaluation.champion import CHAMPION
from mascot_dag.lib.storage.home import Home
from mascot_dag.resources.llm import ChatModelResource
from mascot_dag.resources.tracking import MLflowResource

DIRECTOR_MODEL = "mascot-director"
REWARD_MODEL = "mascot-persona-reward"
# pi_SFT: the supervised base policy of Stage 1; the `sft` evaluation baseline serves it too.
POLICY_SFT_MODEL = "mascot-policy-sft"


def persona_model(persona_id: str) -> str:
    """The registered model of a persona's adapter: mascot-persona-<id, _ as ->."""
    return f"mascot-persona-{persona_id.replace('_', '-')}"


def resolve_version(tracking: MLflowResource, model_name: str, alias: str | None) -> str | None:
    """`alias` (e.g. champion) when given and set, else None; no alias -> the latest version."""
    if alias:
        return tracking.get_alias_version(model_name, alias)
    return tracking.latest_version(model_name)


def fetch(tracking: MLflowResource, model_name: str, version: str) -> Path:
    """The registered version's adapter folder, downloaded once per home. Steps running at the
    same time on a cluster (two personas' adapters both need the reward model) may download the
    same version at once: each downloads into a folder of its own and renames it into place, so
    no step ever reads a half-written folder (the first rename wins; the others are dropped)."""
    import os
    import shutil

    # keyed by the run, not the version number alone: numbers repeat after a registry reset,
    # and a folder of the old registry's v1 must not be taken for the new one's
    run = tracking.version_run_id(model_name, version)[:12] or "norun"
    dst = Home.from_env().checkpoints / "downloads" / f"{model_name}-v{version}-{run}"
    if (dst / "adapter_config.json").exists():
        return dst
    part = dst.with_name(f"{dst.name}.part-{os.getpid()}")
    shutil.rmtree(part, ignore_errors=True)
    local = tracking.download_adapter(f"models:/{model_name}/{version}", part)
    inner = local.relative_to(part)
    try:
        part.rename(dst)
    except OSError:  # another step renamed its copy first (dst exists and is not empty)
        shutil.rmtree(part, ignore_errors=True)
        if not (dst / inner / "adapter_config.json").exists():
            raise
    return dst / inner


def attach(
    chat: ChatModelResource, tracking: MLflowResource, model_name: str, alias: str | None = None
) -> tuple[str | None, str | None]:
    """Load a registered adapter into the backend; returns (adapter name, version) or Nones."""
    version = resolve_version(tracking, model_name, alias)
    if version is None:
        return None, None
    name = f"{model_name}@v{version}"
    # add_adapter is idempotent for the same name and folder.
    chat.backend().add_adapter(name, str(fetch(tracking, model_name, version)))
    return name, version


def attach_policy_sft(chat: ChatModelResource, tracking: MLflowResource, needed_by: str) -> str:
    """Load the latest pi_SFT (`policy_sft`) into the backend; its adapter name."""
    name, _ = attach(chat, tracking, POLICY_SFT_MODEL)
    if name is None:
        raise ValueError(f"{needed_by} needs {POLICY_SFT_MODEL} in MLflow: materialise policy_sft")
    return name


def attach_personas(
    chat: ChatModelResource, tracking: MLflowResource, persona_ids: list[str],
    alias: str | None = None,
) -> tuple[dict[str, str | None], dict[str, str]]:
    """Adapters of every persona that has one: ({persona: adapter name}, {persona: version})."""
    names, versions = {}, {}
    for pid in persona_ids:
        name, version = attach(chat, tracking, persona_model(pid), alias)
        if name:
            names[pid], versions[pid] = name, version
    return names, versions


def adapter_runs(tracking: MLflowResource, names) -> dict[str, str]:
    """{adapter name: the run id of its registered version} for the attached adapters among
    `names` (`<model>@v<version>`, as `attach` names them; None and other names skipped): what
    the generation cache keys a request's adapter by, so that a registry reset, which numbers
    versions from 1 again, never replays another adapter's texts."""
    out = {}
    for name in names:
        model, sep, version = (name or "").rpartition("@v")
        if sep and model and version.isdigit():
            out[name] = tracking.version_run_id(model, version)
    return out


def training_figures(tracking: MLflowResource, versions: dict[str, str]
                     ) -> tuple[dict[str, float], dict[str, tuple[float, float, int]]]:
    """Stage 1's training figures of the adapters `versions` names ({model: version}, as
    `assets.queries.method_versions` reads them from the evaluation's dialogues): the held-out
    accuracy of the reward model they were trained with, and each persona adapter's GRPO reward
    at its first and last logged step with the number of steps."""
    rewards, reward_model = {}, {}
    for model, version in sorted(versions.items()):
        if not model.startswith("mascot-persona-") or model == REWARD_MODEL:
            continue
        run_id = tracking.version_run_id(model, version)
        curve = tracking.metric_history(run_id, "reward") if run_id else []
        params = tracking.version_run_params(model, version)
        if curve:
            rewards[params.get("persona", model)] = (curve[0][1], curve[-1][1], len(curve))
        rm_version = params.get("reward_model_version")
        if rm_version and not reward_model:
            rm_run = tracking.version_run_id(REWARD_MODEL, rm_version)
            if rm_run:
                got = tracking.run_metrics(rm_run)
                reward_model = {k: got[k] for k in ("heldout_accuracy", "heldout_accuracy_lo",
                                                    "heldout_accuracy_hi") if k in got}
    return reward_model, rewards


# The champion alias: the evaluation gate's decisions, kept in the registry.
def champion_exists(tracking: MLflowResource) -> bool:
    """Whether a champion is set: the director's alias (apply_gate always moves it)."""
    return tracking.get_alias_version(DIRECTOR_MODEL, "champion") is not None


def current_champion_scores(tracking: MLflowResource, scores: pl.DataFrame,
                            champion_used: dict[str, str]) -> pl.DataFrame:
    """eval_scores without `champion` rows that another champion produced: a champion partition
    left over from an earlier run (before the alias moved) must not stand in for the current one;
    the gate then fails closed (no paired contexts). `champion_used`: {model: version} the
    `champion` dialogues used (`assets.queries.method_versions`)."""
    alias = tracking.get_alias_version(DIRECTOR_MODEL, "champion")
    used = champion_used.get(DIRECTOR_MODEL)
    if alias is not None and used == alias:
        return scores
    return scores.filter(pl.col("method") != CHAMPION)


def apply_gate(tracking: MLflowResource, decision, versions: dict) -> list[str]:
    """Move `champion` to every version used; the director version keeps its overall score as
    the tag `eval_overall` (informational: the gate re-evaluates the champion every run)."""
    if not decision.promote:
        return []
    moved = []
    for model_name, version in sorted(versions.items()):
        tracking.set_alias(model_name, "champion", version)
        moved.append(f"{model_name}@{version}")
    if DIRECTOR_MODEL in versions:
        tracking.set_version_tag(DIRECTOR_MODEL, versions[DIRECTOR_MODEL], "eval_overall",
                                 f"{decision.candidate:.4f}")
    return moved
