"""A local Prefect server for the UI and schedules, bound to loopback, owned by the state folder.

`meshplan ui` starts `prefect server start` with Prefect's home inside the state folder and
records its address in `<state>/prefect-server.json`; later meshplan commands find that file,
check the server answers, and send their flow runs there (PREFECT_API_URL) instead of an
ephemeral server, so every run shows up in the UI.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

from launcher import group
from planner.errors import MeshplanError
from rundir import StateDir

_SERVER_MODULE = "prefect.server.api.server"  # where Prefect starts its temporary uvicorn server


def temporary_server_in_own_session() -> None:
    """Prefect's temporary server (started when no PREFECT_API_URL is set) in a session of its own
    (launcher.group.own_sessions_for): a Ctrl-C at the terminal then reaches the command alone, which
    marks its flow run crashed on a server still up and stops it at exit (atexit), instead of hanging
    on a dead API for its retries and ending in httpx.ConnectError. A SIGKILLed command's server is
    stopped by its lifeline (launcher/lifeline.py), which the environment the server inherits carries."""
    group.own_sessions_for(_SERVER_MODULE)


def server_file(state_dir: str | Path) -> Path:
    return StateDir.of(state_dir).server_file


def healthy(api_url: str, timeout_s: float = 1.0) -> bool:
    import urllib.request  # here, not at the top: most commands never ask a server

    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_s) as r:
            return r.status == 200
    except OSError:
        return False


def running_api_url(state_dir: str | Path) -> str | None:
    """The API URL of this state folder's server, if one is recorded and answers."""
    f = server_file(state_dir)
    if not f.is_file():
        return None
    try:
        url = json.loads(f.read_text())["api_url"]
    except (ValueError, KeyError):
        return None
    return url if healthy(url) else None


def check_port_free(host: str, port: int) -> None:
    """Fail fast, naming the fix, when something already listens on host:port."""
    in_use = False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        in_use = s.connect_ex((host, port)) == 0
    if not in_use:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                in_use = True
    if in_use:
        raise MeshplanError("--port", port, f"{host}:{port} is already in use; pass another --port")


def start_server(
    state_dir: str | Path, host: str = "127.0.0.1", port: int = 4200, wait_s: float = 120.0
) -> group.Process:
    """Start `prefect server start` on host:port (a group of launcher/group.py, never told of another
    API: PREFECT_API_URL dropped) and wait until /api/health answers."""
    check_port_free(host, port)
    log = StateDir.of(state_dir).server_log
    proc = group.start(
        [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)],
        log_path=log,
        # the browser UI asks /ui-settings where the API is; without this it says port 4200
        extra_env={"PREFECT_UI_API_URL": f"http://{host}:{port}/api"},
        drop_env=("PREFECT_API_URL",),
    )
    api_url = f"http://{host}:{port}/api"
    deadline = time.monotonic() + wait_s
    while not healthy(api_url):
        if proc.poll() is not None:
            group.forget(proc)
            raise RuntimeError(f"prefect server exited with {proc.returncode}; see {log}")
        if time.monotonic() > deadline:
            group.stop(proc)
            raise RuntimeError(f"prefect server did not answer on {api_url} within {wait_s:.0f} s; see {log}")
        time.sleep(0.5)
    server_file(state_dir).write_text(
        json.dumps({"api_url": api_url, "pid": proc.pid, "ui_url": f"http://{host}:{port}"})
    )
    return proc


def stop_server(proc: group.Process, state_dir: str | Path) -> None:
    """Forget the server's address, then stop its group (SIGTERM, SIGKILL, until none is alive)."""
    server_file(state_dir).unlink(missing_ok=True)
    group.stop(proc)
