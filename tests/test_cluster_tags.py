"""Per-asset cluster requests (lib/runtime/cluster.py) as the executors read them from the
Definitions:
dagster-ray's `dagster-ray/config` and dagster-k8s's `dagster-k8s/config`. Every asset's
Kubernetes Job is rendered with dagster-k8s's own `construct_dagster_k8s_job` (what its
`k8s_job_executor` submits for a step) and its `nvidia.com/gpu` limit must equal the asset's GPU
request; the Ray job's `num_gpus` must be the same number."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from mascot_dag.lib.runtime import cluster

TRAINING = {"policy_sft", "persona_reward_model", "persona_adapters", "director_adapter"}
GENERATING = {"candidate_responses", "group_rollouts", "director_comparison", "eval_dialogues"}


@pytest.fixture(scope="module")
def asset_nodes():
    """{asset name: node tags} of the code location's asset job (the tags each step carries)."""
    from mascot_dag.definitions import defs

    job = defs.resolve_implicit_global_asset_job_def()
    names = {k.to_user_string() for k in defs.resolve_asset_graph().toposorted_asset_keys}
    nodes = {n.name: dict(n.tags) for n in job.graph.nodes if n.name in names}
    assert set(nodes) == names, names - set(nodes)
    return nodes


def render_k8s_job(asset: str, tags: dict):
    """The Job dagster-k8s builds for this asset's step (the image and names are placeholders;
    the resources come from the step's tags only)."""
    from dagster_k8s.job import (
        DagsterK8sJobConfig,
        construct_dagster_k8s_job,
        get_k8s_job_name,
        get_user_defined_k8s_config,
    )

    config = DagsterK8sJobConfig(job_image="mascot-dag:latest", dagster_home="/opt/dagster/home",
                                 image_pull_policy="IfNotPresent")
    name = f"dagster-step-{get_k8s_job_name('0' * 32, asset)}"
    return construct_dagster_k8s_job(
        config, ["dagster", "api", "execute_step"], name,
        user_defined_k8s_config=get_user_defined_k8s_config(tags), component="step_worker")


def test_every_assets_k8s_job_limits_the_gpus_it_requests(asset_nodes):
    gpu_assets = set()
    for asset, tags in asset_nodes.items():
        wanted = cluster.request_for(asset).gpus
        job = render_k8s_job(asset, tags).to_dict()
        (container,) = job["spec"]["template"]["spec"]["containers"]
        limits = container["resources"]["limits"]
        requests = container["resources"]["requests"]
        got = int(limits.get("nvidia.com/gpu", 0))
        assert got == wanted, (asset, limits)
        assert int(requests.get("nvidia.com/gpu", 0)) == wanted, (asset, requests)
        assert requests["cpu"] == str(cluster.request_for(asset).cpus), (asset, requests)
        # the Ray executor reads the same request from its own tag
        ray = json.loads(tags[cluster.RAY_TAG])
        assert ray.get("num_gpus", 0) == wanted and ray["num_cpus"] >= 1, (asset, ray)
        if wanted:
            gpu_assets.add(asset)
    # GPUs for training and generation, CPUs elsewhere
    assert gpu_assets == TRAINING | GENERATING, gpu_assets


def test_a_new_asset_without_a_request_is_named():
    with pytest.raises(KeyError, match="'persona_poems'.*mascot_dag/lib/runtime/cluster.py"):
        cluster.request_for("persona_poems")
    with pytest.raises(ValueError, match="gpus=-1"):
        cluster.Request(gpus=-1)


def test_the_cluster_profile_runs_steps_on_ray_with_servers(monkeypatch):
    """The cluster profile's resources and executor come from the environment, and a missing
    server address is an error that names the variable and what it must point at."""
    from mascot_dag.profiles import executor_for, executor_name, resources_for

    for var in ("MASCOT_MLFLOW_URI", "MASCOT_GENERATION_URL", "MASCOT_EXECUTOR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MASCOT_PROFILE", "cluster")
    with pytest.raises(ValueError, match="MASCOT_MLFLOW_URI .*mlflow server.*"
                                         "MASCOT_GENERATION_URL .*VLLM_ALLOW_RUNTIME_LORA"):
        resources_for("cluster")
    monkeypatch.setenv("MASCOT_MLFLOW_URI", "http://127.0.0.1:5000")
    monkeypatch.setenv("MASCOT_GENERATION_URL", "http://127.0.0.1:8000/v1")
    monkeypatch.setenv("MASCOT_SIZES", "tiny")
    res = resources_for("cluster")
    assert res["tracking"].serves_artifacts
    assert type(res["chat"]).__name__ == "VLLMServerChatResource"
    assert res["settings"].k_candidates == 2  # MASCOT_SIZES=tiny
    assert executor_name() == "ray"
    monkeypatch.delenv("MASCOT_RAY_ADDRESS", raising=False)
    with pytest.raises(ValueError, match="MASCOT_RAY_ADDRESS"):
        executor_for()
    monkeypatch.setenv("MASCOT_RAY_ADDRESS", "http://127.0.0.1:8265")
    ex = executor_for()
    assert isinstance(ex, dg.ExecutorDefinition) and ex.name == "ray"
    monkeypatch.setenv("MASCOT_SET", "not json")
    with pytest.raises(ValueError, match="MASCOT_SET"):
        resources_for("cluster")


def test_server_adapters_are_named_by_folder_and_bad_ones_are_named(tmp_path):
    """The vLLM-server backend: an adapter's name on the server carries a hash of its folder
    (two homes' `@v1` never collide), and a folder that is not an adapter, or a server that
    cannot be reached, fails naming the adapter before any request is sent."""
    from conftest import free_port

    from mascot_dag.lib.llm import ChatBackendError
    from mascot_dag.lib.llm.vllm_server import VLLMServerChat, served_name

    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        (folder / "adapter_config.json").write_text("{}")
    assert served_name("p@v1", a) != served_name("p@v1", b)
    assert served_name("p@v1", a).startswith("p@v1~") and served_name("p@v1", a) == served_name(
        "p@v1", str(a) + "/")
    chat = VLLMServerChat(f"http://127.0.0.1:{free_port()}/v1", "m", max_retries=0)
    with pytest.raises(FileNotFoundError, match="adapter 'x'.*no adapter_config.json"):
        chat.add_adapter("x", tmp_path)
    with pytest.raises(ChatBackendError, match="adapter 'p@v1'.*server running"):
        chat.add_adapter("p@v1", a)
    assert chat.adapters == {}  # nothing recorded for an adapter the server did not take


def test_the_kubernetes_config_in_design_is_valid_for_dagster_k8s():
    """The run launcher YAML and the code location of docs/DESIGN.md "Past one machine" are
    what a user copies: the YAML must pass dagster-k8s's config schema and the Python must build
    Definitions whose executor is dagster-k8s's step executor."""
    import re
    from pathlib import Path

    import yaml
    from dagster._config import process_config
    from dagster_k8s.launcher import K8sRunLauncher

    text = (Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md").read_text()
    section = text[text.index("**Kubernetes.**"):text.index("**Measured**")]
    (raw_yaml,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    launcher = yaml.safe_load(raw_yaml)["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    result = process_config(K8sRunLauncher.config_type(), launcher["config"])
    assert result.success, result.errors
    scope: dict = {}
    exec(compile(code, "DESIGN.md", "exec"), scope)  # noqa: S102 - our own documentation
    assert scope["defs"].resolve_implicit_global_asset_job_def().executor_def.name == "k8s"
