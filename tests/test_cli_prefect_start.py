"""Prefect's temporary server past its startup allowance (the "discover hang at 60 s" seen under load).

Outside tests/flows: no session Prefect harness to start first (it is what a busy machine delays).
"""

from __future__ import annotations

import subprocess

from tests.support.cli import meshplan


def test_prefect_server_past_its_startup_allowance_is_one_line_naming_the_setting(tmp_path, monkeypatch):
    """Prefect's first temporary server start migrates a fresh SQLite DB (≈ 10 s quiet, past 60 s seen
    under load): past PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS the command says so in one
    line, never Prefect's RuntimeError traceback, and leaves no server behind."""
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "1")
    out = meshplan(tmp_path, "discover", "--cluster", "examples/clusters/custom-links.toml", timeout=240)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and lines[0].startswith("error: PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=1: ")
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "prefect")], capture_output=True, text=True).stdout
    assert not left.strip(), left


def test_a_startup_allowance_prefect_cannot_read_is_one_line(tmp_path, monkeypatch):
    """Prefect reads the allowance as whole seconds: `0.1` was its settings traceback at the first flow run."""
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "0.1")
    out = meshplan(tmp_path, "discover", "--cluster", "examples/clusters/custom-links.toml", timeout=240)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS='0.1': "), (
        lines
    )
