"""This node's identity, read in a subprocess so that the flow process never imports torch.

`identify()` runs `python -m worker.probe --identity` (the OS for host, cores and memory; torch for
the CUDA devices' names as torch reports them) and returns its JSON: {"host": {...}, "gpus": [...]}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from planner.errors import MeshplanError
from planner.specs.config import IDENTIFY_TIMEOUT_S


def identify(timeout_s: float = IDENTIFY_TIMEOUT_S) -> dict[str, Any]:
    """Host facts and CUDA devices of this node (no measurement: about a torch import's time)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "worker.probe", "--identity"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=True).stdout
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"identity probe failed (exit {exc.returncode}): {tail[0]}") from None
    except subprocess.TimeoutExpired:
        raise MeshplanError("discover.identity", f"{timeout_s:.0f} s", "the identity probe hung; retry") from None
    return json.loads(out)


def local_capacity() -> tuple[int, int | None]:
    """(NVIDIA GPUs the driver lists, bytes of memory available) on this node, without importing
    torch: /proc/driver/nvidia/gpus and /proc/meminfo (None where the OS does not say)."""
    from pathlib import Path

    gpus_dir = Path("/proc/driver/nvidia/gpus")
    gpus = len(list(gpus_dir.iterdir())) if gpus_dir.is_dir() else 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return gpus, int(line.split()[1]) * 1024
    except OSError:
        pass
    return gpus, None
