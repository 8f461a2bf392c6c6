"""`meshplan` as a user runs it: a real CLI process on a state folder of the test's own, or the same
entry point in the test's process (`meshplan_main`), where it uses the test session's Prefect server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def meshplan(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m cli --state-dir tmp_path ARGS` with its own Prefect home, one thread, and no
    Prefect server inherited (each command finds its own, as a user's shell would)."""
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"), OMP_NUM_THREADS="1")
    env.pop("PREFECT_API_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "cli", "--state-dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


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
