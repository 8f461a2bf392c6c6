"""Start processes in tests the one way the product does (launcher/group.py): a tagged group in a
session of its own, stopped by `group.stop`, signalled by `group.send`.

`start` takes a whole environment, as Popen does: what `env` lacks of this process's
environment is dropped (`drop_env`), what it adds or changes is set (`extra_env`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from launcher import group

MESHPLAN = [sys.executable, "-m", "cli"]  # the CLI as a user runs it


def start(cmd: list[str], env: dict[str, str] | None = None, **kw: Any) -> group.Process:
    """`group.start(cmd, **kw)` with `env` the child's whole environment (default: this one's)."""
    if env is not None:
        kw["extra_env"] = {k: v for k, v in env.items() if os.environ.get(k) != v}
        kw["drop_env"] = tuple(k for k in os.environ if k not in env)
    return group.start(cmd, **kw)


def meshplan(*args: str, env: dict[str, str] | None = None, **kw: Any) -> group.Process:
    """`meshplan ARGS` started as a user would (`python -m cli`), through `start`."""
    return start([*MESHPLAN, *args], env=env, **kw)
