"""Serve a `meshplan` deployment command against a real local Prefect server and run it once on demand
(the shared harness of the CLI tests for `meshplan schedule` and `meshplan schedule-cluster`)."""

import asyncio
import json
import signal
import socket
import time
from pathlib import Path

from prefect import get_client
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.server import start_server, stop_server
from launcher import group
from tests.support.procs import start


def free_port() -> int:
    """A TCP port on the loopback that was free a moment ago (the one helper every test that serves uses)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _wait_for_deployment(name: str, serve: group.Process):
    deadline = time.monotonic() + 120
    async with get_client() as client:
        while True:
            try:
                return await client.read_deployment_by_name(name)
            except Exception:
                assert serve.poll() is None, serve.stdout.read()
                assert time.monotonic() < deadline, "the deployment never appeared"
                await asyncio.sleep(1)


def serve_and_run_once(state_dir: Path, command: list[str], deployment: str, env: dict, interval_s: float) -> None:
    """Start a server in `state_dir`, serve `command` (it must serve `deployment` every `interval_s`),
    run the deployment once and assert the run completed; the server and the serving process are
    stopped whatever happens."""
    server = start_server(state_dir, port=free_port())
    api_url = json.loads((state_dir / "prefect-server.json").read_text())["api_url"]
    serve = start(command, env=env, capture=True, merge_stderr=True)
    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            found = asyncio.run(_wait_for_deployment(deployment, serve))
            assert found.schedules[0].schedule.interval.total_seconds() == interval_s
            run = run_deployment(deployment, timeout=180)
            assert run.state.is_completed(), run.state
    finally:
        group.send(serve, signal.SIGTERM)
        serve.wait(60)
        stop_server(server, state_dir)
