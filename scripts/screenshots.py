"""Screenshots of a lineage home in its UIs: the Dagster asset page of eval_report and the MLflow
run page of a persona adapter's training run (with its curves), as small PNGs for the docs.

    python scripts/screenshots.py --home /tmp/tinyhome --profile tiny
    python scripts/screenshots.py --home ~/.mascot --persona beacon --out docs/screenshots
    python scripts/screenshots.py --home /tmp/otherhome --pages mlflow   # MLflow pages only

The home is one that `mascot demo` has filled (MASCOT_HOME; its Dagster instance is HOME/dagster
unless --dagster-home says otherwise; its MLflow store is HOME/mlflow.db, artifacts under
HOME/mlartifacts: MLflowResource's defaults, the store the Makefile's `mlflow-ui` serves). The
script starts, on 127.0.0.1 and free ports:

- `dagster dev -m mascot_dag.definitions` with that home and MASCOT_PROFILE=--profile, in a
  session and process group of its own (`start_new_session`, what setsid does; under
  `env --default-signal=INT,TERM`, since started in the background it otherwise ignores them),
  stopped by that group's id (lib/runtime/local_cluster.stop_group), never by name;
- `mlflow server` on the home's sqlite store, also in its own process group;

then drives headless Chromium through selenium (/usr/bin/chromedriver, as tests/conftest.py's
`browser` fixture does) and writes, under --out:

- eval_report_asset_page.png: /assets/eval_report once its materialization's metadata
  (mlflow_run_id, report, champion_decision) has rendered;
- mlflow_run_page.png: /#/experiments/<exp>/runs/<run> of the newest run tagged
  persona=<--persona> (found with MlflowClient, by tag, not by name), once its metrics show;
- mlflow_run_curves.png: the same run's "Model metrics" tab, its curves drawn as charts.

Each PNG is kept under 1 MB (re-encoded with fewer colours when larger). The servers' logs go to
a temporary folder, printed when a server fails to start. Exit code 0 when every screenshot was
taken, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mascot_dag.lib.runtime.local_cluster import (  # noqa: E402
    BIN,
    free_port,
    start,
    stop_group,
    wait_healthy,
)

CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM = Path("/usr/bin/chromium")
MAX_BYTES = 1_000_000
LOCATIONS = ('{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus '
             'locationOrLoadError { __typename ... on PythonError { message } } } } } }')


def _graphql(base: str, query: str) -> dict:
    req = urllib.request.Request(f"{base}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["data"]


def wait_code_location(base: str, proc, log: Path, timeout_s: float) -> None:
    """Until the Dagster webserver answers and its code location has loaded (a load error is
    raised with its message)."""
    wait_healthy(f"{base}/server_info", proc, timeout_s, "dagster dev", log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            entries = _graphql(base, LOCATIONS)["workspaceOrError"]["locationEntries"]
        except (urllib.error.URLError, OSError, KeyError, TypeError):
            entries = []
        if entries and all(e["loadStatus"] == "LOADED" for e in entries):
            for e in entries:
                err = e["locationOrLoadError"] or {}
                if err.get("__typename") == "PythonError":
                    raise RuntimeError(f"code location {e['name']}: {err.get('message')}")
            return
        time.sleep(1)
    raise RuntimeError(f"dagster dev: code location not loaded after {timeout_s:.0f} s, log {log}")


def browser(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(90)
    return driver


def wait_for_text(driver, texts: list[str], timeout_s: float) -> bool:
    """Until the page's text holds every one of `texts` (True), or timeout_s passed (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = driver.execute_script("return document.body ? document.body.innerText : ''") or ""
        if all(t in body for t in texts):
            return True
        time.sleep(1)
    return False


def save_small(driver, png: Path) -> int:
    """Screenshot into png, re-encoded with 256 colours when over MAX_BYTES; returns its size."""
    png.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(png))
    if png.stat().st_size > MAX_BYTES:
        from PIL import Image

        with Image.open(png) as img:
            img.convert("RGB").quantize(colors=256).save(png, optimize=True)
    return png.stat().st_size


def mlflow_training_view(driver, mlflow_url: str) -> None:
    """Open MLflow's UI in its "Model training" view with the assistant panel closed: a fresh
    browser gets MLflow 3's GenAI view (runs listed as "Evaluations") and the assistant panel
    over a third of the page, whatever the experiment's `mlflow.experimentKind` tag says. Both
    are the UI's own settings in localStorage, the ones its toggle and close button write."""
    driver.get(f"{mlflow_url}/")
    driver.execute_script(
        "localStorage.setItem('mlflow.workflowType_v1', JSON.stringify('machine_learning'));"
        "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
        "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');")


def persona_run(tracking_uri: str, persona: str):
    """The newest run tagged persona=<persona> (a persona adapter's training run)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exps, f"tags.persona = '{persona}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise RuntimeError(f"no MLflow run tagged persona={persona} in {tracking_uri}")
    return runs[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", type=Path, default=Path(os.environ.get("MASCOT_HOME", ".mascot")))
    ap.add_argument("--dagster-home", type=Path, default=None, help="default: HOME/dagster")
    ap.add_argument("--profile", default=os.environ.get("MASCOT_PROFILE", "tiny"))
    ap.add_argument("--persona", default="anchor")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    ap.add_argument("--pages", choices=("all", "dagster", "mlflow"), default="all",
                    help="only the Dagster page, or only the MLflow pages")
    ap.add_argument("--timeout", type=float, default=240, help="per server start, seconds")
    args = ap.parse_args(argv)
    home = args.home.resolve()
    dagster_home = (args.dagster_home or home / "dagster").resolve()
    db = home / "mlflow.db"
    if not db.exists():
        print(f"{db} does not exist: run `mascot demo` into {home} first", file=sys.stderr)
        return 1
    logs = Path(tempfile.mkdtemp(prefix="screenshots-"))
    env = {"MASCOT_HOME": str(home), "DAGSTER_HOME": str(dagster_home),
           "MASCOT_PROFILE": args.profile, "HF_HUB_OFFLINE": "1"}
    dagster_url = f"http://127.0.0.1:{free_port()}"
    mlflow_port = free_port()
    mlflow_url = f"http://127.0.0.1:{mlflow_port}"
    procs, taken = [], []
    try:
        dagster_log = logs / "dagster_dev.log"
        procs.append(dagster := None if args.pages == "mlflow" else start(
            ["env", "--default-signal=INT,TERM", BIN / "dagster", "dev", "-h",
             "127.0.0.1", "-p", dagster_url.rsplit(":", 1)[1], "-m", "mascot_dag.definitions"],
            dagster_log, env))
        mlflow_log = logs / "mlflow.log"
        procs.append(mlflow := None if args.pages == "dagster" else start(
            [BIN / "mlflow", "server", "--host", "127.0.0.1", "--port", mlflow_port,
             "--workers", "1", "--backend-store-uri", f"sqlite:///{db}"], mlflow_log, env))
        if mlflow:
            wait_healthy(f"{mlflow_url}/health", mlflow, args.timeout, "mlflow server",
                         mlflow_log)
            run = persona_run(mlflow_url, args.persona)
        if dagster:
            wait_code_location(dagster_url, dagster, dagster_log, args.timeout)
        print(f"dagster dev on {dagster_url}, mlflow on {mlflow_url} (logs {logs})")

        driver = browser(1400, 2200)
        try:
            if dagster:
                eval_report_page(driver, dagster_url, args.out, taken)
            if mlflow:
                run_pages(driver, mlflow_url, run, args.out, taken)
        finally:
            driver.quit()
    finally:
        for proc in reversed(procs):
            if proc:
                stop_group(proc, 30)
    return 0 if taken and all(taken) else 1


def eval_report_page(driver, dagster_url: str, out: Path, taken: list) -> None:
    """The asset page of eval_report, once its materialization's metadata has rendered."""
    driver.set_window_size(1400, 2200)
    driver.get(f"{dagster_url}/assets/eval_report")
    ok = wait_for_text(driver, ["eval_report", "mlflow_run_id", "champion_decision"], 120)
    time.sleep(3)  # the metadata's markdown and the lineage graph settle
    from selenium.webdriver.common.by import By

    # a fresh browser gets Dagster's "Join the Dagster community" dialog over the page
    for button in driver.find_elements(By.XPATH, "//button[normalize-space(.)='Skip']"):
        button.click()
        time.sleep(1)
    png = out / "eval_report_asset_page.png"
    print(f"{png}: {save_small(driver, png)} bytes"
          + ("" if ok else " (metadata not seen: check the picture)"))
    taken.append(ok)


def run_pages(driver, mlflow_url: str, run, out: Path, taken: list) -> None:
    """The run's Overview (metrics, params, tags, registered version) and its Model metrics tab
    (every curve as a chart), in MLflow's training view."""
    mlflow_training_view(driver, mlflow_url)
    exp, run_id = run.info.experiment_id, run.info.run_id
    driver.set_window_size(1400, 2000)
    driver.get(f"{mlflow_url}/#/experiments/{exp}/runs/{run_id}")
    ok = wait_for_text(driver, [run.info.run_name or run_id, "Metrics"], 90)
    time.sleep(3)
    png = out / "mlflow_run_page.png"
    print(f"{png}: {save_small(driver, png)} bytes (run {run.info.run_name!r} {run_id})"
          + ("" if ok else " (run page not seen: check the picture)"))
    taken.append(ok)

    driver.set_window_size(1400, 1400)
    driver.get(f"{mlflow_url}/#/experiments/{exp}/runs/{run_id}/model-metrics")
    ok = wait_for_text(driver, ["reward"], 90)
    time.sleep(5)  # the charts draw after the data arrive
    png = out / "mlflow_run_curves.png"
    print(f"{png}: {save_small(driver, png)} bytes"
          + ("" if ok else " (curves not seen: check the picture)"))
    taken.append(ok)


if __name__ == "__main__":
    sys.exit(main())
