"""`meshplan` as a user runs it: a real CLI process on a state folder of the test's own."""

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
