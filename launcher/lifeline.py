"""Nothing outlives the command that started it, SIGKILL included: a lifeline and its watchdog (stdlib only).

`tie_children()` (the `meshplan` entry point calls it once) labels this process's environment with
a fresh `MESHPLAN_LIFELINE` value — inherited by every descendant: torchrun agents and ranks (which
torchrun puts in sessions of their own), profilers, Prefect's temporary uvicorn server — and starts
a watchdog process holding the read end of a pipe whose write end only this process has. When this
process ends, however it ends (a SIGKILL runs no handler), the kernel closes the write end, the
watchdog's read returns, and it stops every process bearing the label (launcher.group.stop_labelled:
SIGTERM, then SIGKILL until /proc shows none). A process meant to outlive the command (a job's
elastic runner, which the scheduler's DuckDB rows track) is started without the label
(`launcher.group.start(detached=True)`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

LIFELINE_TAG = "MESHPLAN_LIFELINE"
_tied: list[int] = []  # the write end, kept open for this process's life


def tie_children() -> str:
    """Label this process's future children and start their watchdog (once per process); the label."""
    if _tied:
        return os.environ[LIFELINE_TAG]
    tag = uuid.uuid4().hex
    read_end, write_end = os.pipe()  # not inheritable: no other child holds the write end
    env = {k: v for k, v in os.environ.items() if k != LIFELINE_TAG}
    subprocess.Popen(
        [sys.executable, "-m", "launcher.lifeline", tag, str(read_end)],
        pass_fds=(read_end,),
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the terminal's group does not reach it
    )
    os.close(read_end)
    _tied.append(write_end)
    os.environ[LIFELINE_TAG] = tag
    return tag


def watch(tag: str, fd: int) -> int:
    """Block until the parent is gone (EOF on `fd`), then stop what it left; how many there were."""
    from launcher.group import stop_labelled

    while os.read(fd, 1):
        pass
    return stop_labelled(LIFELINE_TAG, tag)


if __name__ == "__main__":
    watch(sys.argv[1], int(sys.argv[2]))
