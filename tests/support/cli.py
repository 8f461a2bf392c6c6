"""`meshplan` as a user runs it: a real CLI process on a state folder of the test's own, or the same
entry point in the test's process (`meshplan_main`), where it uses the test session's Prefect server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def meshplan(
    tmp_path: Path, *args: str, timeout: float = 300, prefect_api_url: str | None = None
) -> subprocess.CompletedProcess:
    """`python -m cli --state-dir tmp_path ARGS` with its own Prefect home, one thread, and no
    Prefect server inherited (each command finds its own, as a user's shell would) unless
    `prefect_api_url` names one, as a user's PREFECT_API_URL does: pass `session_prefect_api()` where
    what the test proves is not Prefect's temporary server, to spare the command starting one."""
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"), OMP_NUM_THREADS="1")
    env.pop("PREFECT_API_URL", None)
    if prefect_api_url:
        env["PREFECT_API_URL"] = prefect_api_url
    return subprocess.run(
        [sys.executable, "-m", "cli", "--state-dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def session_prefect_api() -> str:
    """The API URL of the Prefect server this test process runs its flows on (tests/flows: the session's
    prefect_test_harness server)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    assert url, "no Prefect server in this test process (tests/flows/conftest.py starts one)"
    return url


def meshplan_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`meshplan ARGS` through cli.main.main in this process (so it uses the test's Prefect server
    instead of starting one per command): (exit code, stdout, stderr)."""
    from cli.main import main

    monkeypatch.setattr("sys.argv", ["meshplan", *args])
    capsys.readouterr()
    try:
        main()
        rc = 0
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return rc, out.out, out.err
