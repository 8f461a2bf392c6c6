"""A frozen or dead rank fails the job within a bounded time; the launcher's timeout leaves no process.

The job is launched the way the train task launches it (launcher.launch: torchrun_command +
start_logged / run_logged, own process group). Once both ranks have logged steps, the test signals
one rank from outside: SIGSTOP (frozen — alive, sockets open, answering nothing: the case where a
missing timeout hangs forever) or SIGKILL (dead). The documented bound (worker/watchdog.py):
    exit within collective_timeout_s + STOP_GRACE_S (torchrun's fixed SIGTERM→SIGKILL wait for a
    worker that cannot handle SIGTERM) + start-up slack.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from launcher.launch import Launch, kill_group, run_logged, start_logged, torchrun_command
from planner.specs.runspec import RunSpec
from tests.worker.conftest import wait_for_steps
from worker.watchdog import STOP_GRACE_S

pytestmark = pytest.mark.dist

COLLECTIVE_TIMEOUT_S = 10.0
MARGIN_S = 30.0  # generous: 2 shared cores, interpreter teardown, torchrun's own polling


def _rank_pids(run_dir: Path) -> dict[int, int]:
    """{rank: pid} of this job's live ranks (torchrun gives each rank its own session, so by cmdline)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
        if b"worker.train" in cmd and str(run_dir).encode() in cmd and rank is not None and _state(int(d.name)) != "Z":
            out[rank] = int(d.name)
    return out


def _rank_pid(run_dir: Path, rank: int) -> int:
    pid = _rank_pids(run_dir).get(rank)
    if pid is None:
        raise LookupError(f"no rank {rank} of the job in {run_dir} is running")
    return pid


def _launch(tmp_path: Path, make_plan, timeout_s: float = COLLECTIVE_TIMEOUT_S) -> list[str]:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(make_plan([(0, 2), (2, 4)])))
    launch = Launch(
        plan_path=str(plan_path),
        run_dir=str(tmp_path),
        run_id="hang",
        spec=RunSpec(
            steps=1_000_000,
            data="synthetic",
            optimizer="sgd",
            lr=0.1,
            collective_timeout_s=timeout_s,
            checkpoint_every=0,
        ),
    )
    return torchrun_command(launch)


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["frozen", "dead"])
def test_a_frozen_or_dead_rank_fails_the_job_within_the_bound(tmp_path, make_plan, sig):
    log = tmp_path / "torchrun.log"
    proc = start_logged(_launch(tmp_path, make_plan), log)
    try:
        wait_for_steps(tmp_path, 3)
        os.kill(_rank_pid(tmp_path, 1), sig)
        t0 = time.monotonic()
        bound = COLLECTIVE_TIMEOUT_S + STOP_GRACE_S + MARGIN_S
        rc = proc.wait(timeout=bound + 30)  # past the bound the assertion below reports it
        elapsed = time.monotonic() - t0
    finally:
        kill_group(proc)
    print(f"{sig.name}: job exited rc={rc} {elapsed:.1f} s after the fault (bound {bound:.0f} s)")
    text = log.read_text(errors="replace")
    assert rc != 0, text[-3000:]
    assert elapsed < bound, f"took {elapsed:.1f} s\n{text[-3000:]}"
    if sig == signal.SIGSTOP:  # the surviving rank says why it gave up
        assert "watchdog" in text or "timed out" in text.lower() or "timeout" in text.lower(), text[-3000:]
    assert _rank_pids(tmp_path) == {}, "no rank may outlive its job"


def test_launcher_timeout_kills_the_whole_process_group_even_with_a_frozen_rank(tmp_path, make_plan):
    """run_logged's outer timeout (the train task's) SIGTERMs then SIGKILLs agent and every rank."""
    cmd = _launch(tmp_path, make_plan, timeout_s=600)  # only the launcher's timeout may end this job
    ranks: dict[int, int] = {}

    def freeze_rank_1() -> None:  # like a hung GPU: frozen, so the agent's SIGTERM cannot end it
        try:
            wait_for_steps(tmp_path, 2)
            ranks.update(_rank_pids(tmp_path))
            os.kill(ranks[1], signal.SIGSTOP)
        except (AssertionError, LookupError, OSError, KeyError):
            pass

    t = threading.Thread(target=freeze_rank_1, daemon=True)
    t.start()
    with pytest.raises(TimeoutError, match="process group was killed"):
        run_logged(cmd, tmp_path / "torchrun.log", timeout_s=30)  # start-up (~10 s) + the freeze
    t.join(timeout=5)
    assert set(ranks) == {0, 1}, "the ranks never started and froze, so the test proved nothing"
    assert _rank_pids(tmp_path) == {}, "ranks outlived the launcher's timeout"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
