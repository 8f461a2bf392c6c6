"""A local Prefect server for the UI and schedules, bound to loopback, owned by the state folder.

`meshplan ui` starts `prefect server start` with Prefect's home inside the state folder and
records its address in `<state>/prefect-server.json`; later meshplan commands find that file,
check the server answers, and send their flow runs there (PREFECT_API_URL) instead of an
ephemeral server, so every run shows up in the UI.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import types
import urllib.request
from pathlib import Path

from launcher.lifeline import tie_children  # noqa: F401 - the CLI's entry point ties what it starts to itself
from planner.errors import MeshplanError
from rundir import StateDir

_SERVER_MODULE = "prefect.server.api.server"  # where Prefect starts its temporary uvicorn server


def _own_session(module: object) -> None:
    """Make `module` start its subprocesses in a session of their own (its `subprocess` name only)."""
    import functools
    import types

    shim = types.SimpleNamespace(**vars(subprocess))
    shim.Popen = functools.partial(subprocess.Popen, start_new_session=True)
    module.subprocess = shim  # type: ignore[attr-defined]


class _ServerHook(importlib.abc.MetaPathFinder):
    """Patches Prefect's server module as it is imported (importing it costs seconds: only a command
    that starts the temporary server pays it)."""

    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != _SERVER_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run(module)
            _own_session(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def temporary_server_in_own_session() -> None:
    """Prefect's temporary server (started when no PREFECT_API_URL is set) in a session of its own: a
    Ctrl-C at the terminal then reaches the command alone, which marks its flow run crashed on a
    server still up and stops it at exit (atexit), instead of hanging on a dead API for its retries
    and ending in httpx.ConnectError. A SIGKILLed command's server is stopped by its lifeline
    (launcher/lifeline.py), which the environment the server inherits carries."""
    if _SERVER_MODULE in sys.modules:
        _own_session(sys.modules[_SERVER_MODULE])
    elif not any(isinstance(f, _ServerHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _ServerHook())


def server_file(state_dir: str | Path) -> Path:
    return StateDir.of(state_dir).server_file


def healthy(api_url: str, timeout_s: float = 1.0) -> bool:
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
) -> subprocess.Popen:
    """Start `prefect server start` on host:port and wait until /api/health answers."""
    check_port_free(host, port)
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)
    # the browser UI asks /ui-settings where the API is; without this it says port 4200
    env["PREFECT_UI_API_URL"] = f"http://{host}:{port}/api"
    log = open(StateDir.of(state_dir).server_log, "ab")  # noqa: SIM115 - the server owns it
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    api_url = f"http://{host}:{port}/api"
    deadline = time.monotonic() + wait_s
    while not healthy(api_url):
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with {proc.returncode}; see {log.name}")
        if time.monotonic() > deadline:
            proc.terminate()
            raise RuntimeError(f"prefect server did not answer on {api_url} within {wait_s:.0f} s; see {log.name}")
        time.sleep(0.5)
    server_file(state_dir).write_text(
        json.dumps({"api_url": api_url, "pid": proc.pid, "ui_url": f"http://{host}:{port}"})
    )
    return proc


def stop_server(proc: subprocess.Popen, state_dir: str | Path) -> None:
    server_file(state_dir).unlink(missing_ok=True)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
