"""Fault injection for tests and demos: make a worker crash on its first attempt only.

`MESHPLAN_CRASH_ONCE=<dir>:<tag>[,<tag>…]` makes the worker that calls `crash_once(tag)` exit
with status 3 the first time (it leaves `<dir>/<tag>` behind), so the caller's retry finds a
healthy worker — the one-off failure a Prefect task's `retries` exist for. Unset, it does nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def crash_once(tag: str) -> None:
    spec = os.environ.get("MESHPLAN_CRASH_ONCE", "")
    folder, _, tags = spec.rpartition(":")
    if not folder or tag not in tags.split(","):
        return
    marker = Path(folder) / tag
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # only the first attempt wins
    except FileExistsError:
        return
    os.close(fd)
    print(f"injected crash ({tag}, first attempt)", file=sys.stderr, flush=True)
    os._exit(3)
