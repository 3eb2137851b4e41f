"""The Dagster UI in a real browser: `dagster dev` serves the lineage, headless Chromium draws it.

The server is started as STACK.md says (`setsid env --default-signal=INT,TERM dagster dev ...`:
started in the background it otherwise ignores SIGINT/SIGTERM) and stopped by its own process
group id (= its pid, thanks to setsid), never by name.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import stop_group

from mascot_dag.definitions import all_assets

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
DAGSTER = Path(sys.executable).parent / "dagster"
START_TIMEOUT_S = float(os.environ.get("MASCOT_UI_START_TIMEOUT_S", "150"))  # 2 shared cores

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(base: str, query: str) -> dict:
    req = urllib.request.Request(
        f"{base}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        body = json.loads(r.read())
    assert "errors" not in body, f"GraphQL errors: {body['errors']}"
    return body["data"]


LOCATIONS = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
ASSET_NODES = "{ assetNodes { assetKey { path } groupName } }"


def _stop(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """TERM the server's process group (its pid, since setsid), KILL it if it does not exit."""
    stop_group(proc, timeout_s)


def _wait_ready(base: str, proc: subprocess.Popen, log: Path) -> list[dict]:
    """Wait for /server_info, then for the code location to load; returns the asset nodes."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert proc.poll() is None, f"dagster dev exited ({proc.returncode}):\n{log.read_text()}"
        assert time.monotonic() < deadline, (
            f"dagster dev not ready after {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}"
        )
        try:
            with urllib.request.urlopen(f"{base}/server_info", timeout=5):
                pass
            entries = _graphql(base, LOCATIONS)["workspaceOrError"]["locationEntries"]
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1)
            continue
        if entries and all(e["loadStatus"] == "LOADED" for e in entries):
            for e in entries:
                err = e["locationOrLoadError"]
                assert err and err["__typename"] != "PythonError", (
                    f"code location {e['name']} failed to load: {(err or {}).get('message')}"
                )
            return _graphql(base, ASSET_NODES)["assetNodes"]
        time.sleep(1)


@pytest.fixture(scope="module")
def dagster_ui(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui")
    home, dagster_home = tmp / "home", tmp / "home" / "dagster"
    dagster_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "MASCOT_HOME": str(home),
           "HF_HUB_OFFLINE": "1"}
    log = tmp / "dagster_dev.log"
    cmd = ["setsid", "env", "--default-signal=INT,TERM", str(DAGSTER), "dev",
           "-h", "127.0.0.1", "-p", str(port), "-m", "mascot_dag.definitions"]
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        nodes = _wait_ready(base, proc, log)
        print(f"\ndagster dev ready in {time.monotonic() - t0:.0f} s on {base}")
        yield {"base": base, "home": home, "tmp": tmp, "nodes": nodes}
    finally:
        t1 = time.monotonic()
        _stop(proc)
        print(f"dagster dev stopped in {time.monotonic() - t1:.1f} s")
    assert proc.returncode is not None


def test_asset_graph_holds_whole_lineage(dagster_ui):
    found = {"/".join(n["assetKey"]["path"]): n["groupName"] for n in dagster_ui["nodes"]}
    expected = sorted(k.to_user_string() for a in all_assets for k in a.keys)
    missing = [name for name in expected if name not in found]
    print(f"\nassets in the UI: {sorted(found)}\nmissing from the lineage: {missing}")
    assert found.get("contexts") == "contexts"
    assert not missing, f"the UI lacks {missing} (assets of mascot_dag.definitions)"


def _screenshot(url: str, png: Path, profile: Path, budget_ms: int) -> None:
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={profile}", "--window-size=1600,1000",
           f"--virtual-time-budget={budget_ms}", f"--screenshot={png}", url]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and png.is_file(), (
        f"chromium failed ({res.returncode}): {res.stderr[-2000:]}"
    )


def _graph_problem(png: Path) -> str | None:
    """Why the PNG is not a drawn asset graph, or None when it is."""
    import matplotlib.image as mpimg
    import numpy as np

    if png.stat().st_size < 20_000:
        return f"{png.stat().st_size} bytes: a blank page"
    rgb = mpimg.imread(png)[..., :3]
    q = (rgb[::4, ::4] * 255).astype(int)
    colours = len(np.unique(q[..., 0] * 65536 + q[..., 1] * 256 + q[..., 2]))
    if colours < 50:
        return f"only {colours} colours"
    # The graph canvas, right of the navigation and the group tree: white background, with the
    # asset nodes' dark labels. A modal dims it (median ~0.54); a spinner leaves it empty.
    lum = rgb[110:990, 560:1540].mean(axis=2)
    if np.median(lum) < 0.9:
        return f"canvas is dimmed (median luminance {np.median(lum):.2f}): a dialog covers it"
    dark = lum < 0.45
    # Node labels spread across the canvas; a spinner is one small blob. 40-px column bands.
    # The spread decides: with every group open the graph is zoomed out to fit, and its small
    # labels leave ~250 dark pixels (19 assets, 2026-12-04) spread over all 24 bands.
    bands = int(dark.any(axis=0)[:960].reshape(24, 40).any(axis=1).sum())
    if dark.sum() < 120 or bands < 8:
        return f"canvas: {dark.sum()} dark pixels in {bands} of 24 bands: no asset graph drawn"
    return None


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent "
                    "(apt-get install chromium; .ci/run installs it)")
def test_screenshot_of_asset_graph(dagster_ui):
    base, home, tmp = dagster_ui["base"], dagster_ui["home"], dagster_ui["tmp"]
    # The community sign-up dialog opens over every page on localhost until it is dismissed.
    assert _graphql(base, "mutation { setNuxSeen }")["setNuxSeen"] is True
    # The global lineage page collapses groups; `expanded` opens them so assets show.
    groups = sorted({n["groupName"] for n in dagster_ui["nodes"]})
    expanded = ",".join(f"global@global:{g}" for g in groups)
    url = f"{base}/asset-groups?" + urllib.parse.urlencode({"expanded": expanded})
    problem = "not taken"
    for attempt, budget in enumerate((15000, 30000), start=1):
        png = tmp / f"asset_graph_{attempt}.png"
        t0 = time.monotonic()
        _screenshot(url, png, tmp / f"chromium_{attempt}", budget)
        problem = _graph_problem(png)
        print(f"\nscreenshot {attempt} ({budget} ms virtual) in {time.monotonic() - t0:.0f} s: "
              f"{problem or 'asset graph drawn'}")
        if problem is None:
            break
    report = home / "reports" / "ui_asset_graph.png"
    report.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, report)
    print(f"screenshot: {report}")
    assert problem is None, f"{report}: {problem}"
