"""The Prefect UI in a real headless browser (Debian's chromium) shows a plan flow run and its artifact.

`meshplan ui` serves on 127.0.0.1; `meshplan plan --flow` reports to it; chromium renders the flow
run's Artifacts tab, and the rendered page must name the plan-ranking artifact. The screenshot
stays in the test's temp folder.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.support import procs
from tests.support.served import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MESHPLAN = [sys.executable, "-m", "cli"]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=30000",
    "--window-size=1400,1000",
]


def _chromium(tmp_path, *args: str) -> str:
    profile = tmp_path / f"chromium-{time.monotonic_ns()}"
    out = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=180
    )
    return out.stdout


# CI installs chromium (.ci/run), so there a missing browser fails the test instead of skipping it.
@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="Debian's chromium is not installed")
def test_flow_run_page_shows_the_plan_artifact_in_a_real_browser(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    port = free_port()
    ui = procs.start([*MESHPLAN, "--state-dir", str(tmp_path), "ui", "--port", str(port)], env=env, quiet=True)
    try:
        info_file = tmp_path / "prefect-server.json"
        deadline = time.monotonic() + 150
        while not info_file.exists():
            assert ui.poll() is None and time.monotonic() < deadline, "meshplan ui did not start"
            time.sleep(0.5)
        api = json.loads(info_file.read_text())["api_url"]
        plan = subprocess.run(
            [
                *MESHPLAN,
                "--state-dir",
                str(tmp_path),
                "plan",
                "--model",
                "gpt3-13b",
                "--cluster",
                "examples/clusters/mixed-a100-v100-t4.toml",
                "--global-batch",
                "64",
                "--flow",
                "--json",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert plan.returncode == 0, plan.stderr
        req = urllib.request.Request(
            f"{api}/flow_runs/filter", data=b'{"flow_runs": {"name": {}}}', headers={"content-type": "application/json"}
        )
        runs = json.loads(urllib.request.urlopen(req, timeout=30).read())
        run_id = runs[0]["id"]
        page = f"http://127.0.0.1:{port}/v2/runs/flow-run/{run_id}?tab=Artifacts"
        dom = _chromium(tmp_path, "--dump-dom", page)
        assert "plan-ranking" in dom and runs[0]["name"] in dom
        _chromium(tmp_path, f"--screenshot={tmp_path / 'flow-run.png'}", page)
        assert (tmp_path / "flow-run.png").stat().st_size > 10_000
    finally:
        ui.send_signal(signal.SIGTERM)
        ui.wait(60)
