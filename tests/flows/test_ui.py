"""`meshplan ui`: a loopback Prefect server for the state folder; commands find it; port clashes are one line."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support import procs
from tests.support.served import free_port

MESHPLAN = [sys.executable, "-m", "cli"]


def _env() -> dict:
    env = dict(os.environ)
    for k in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH"):
        env.pop(k, None)
    return env


def test_ui_serves_on_loopback_commands_report_to_it_and_it_stops_cleanly(tmp_path):
    port = free_port()
    proc = procs.start(
        [*MESHPLAN, "--state-dir", str(tmp_path), "ui", "--port", str(port)],
        env=_env(),
        capture=True,
        merge_stderr=True,
    )
    info_file = tmp_path / "prefect-server.json"
    deadline = time.monotonic() + 150
    try:
        while not info_file.exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "prefect server did not start"
            time.sleep(0.5)
        info = json.loads(info_file.read_text())
        _check_running_server(tmp_path, port, info)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert not info_file.exists()
    time.sleep(1)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more
    assert Path(tmp_path / "prefect-server.log").exists()


def _check_running_server(state: Path, port: int, info: dict) -> None:
    assert info["api_url"] == f"http://127.0.0.1:{port}/api"
    with urllib.request.urlopen(info["api_url"] + "/health", timeout=10) as r:
        assert r.status == 200
    # a second server on the same port is refused with one line naming the fix
    again = subprocess.run(
        [*MESHPLAN, "--state-dir", str(state), "ui", "--port", str(port)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 1
    assert "already in use; pass another --port" in again.stderr and "Traceback" not in again.stderr
    # meshplan's Prefect settings now point at this server
    code = (
        "import os; from cli.app import load_settings, prefect_env; "
        f"prefect_env(load_settings(['state.dir=\"{state}\"'])); print(os.environ['PREFECT_API_URL'])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == info["api_url"], out.stderr
