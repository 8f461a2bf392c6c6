"""A frozen or dead rank fails the job within a bounded time; the launcher's timeout leaves no process.

The job is launched the way the train task launches it (launcher.launch: torchrun_command +
start_logged / run_logged, own process group). Once both ranks have logged steps, the test signals
one rank from outside: SIGSTOP (frozen — alive, sockets open, answering nothing: the case where a
missing timeout hangs forever) or SIGKILL (dead). The frozen, the dead and the outer-timeout jobs run
at the same time (the `faults` fixture), since each mostly waits. The documented bound (worker/watchdog.py):
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


LAUNCHER_TIMEOUT_S = 45.0  # start-up (~10 s alone, more beside the other two jobs) + the freeze


def _signal_rank_1(run_dir: Path, make_plan, sig: signal.Signals) -> dict:
    """Launch a job in `run_dir`, SIGSTOP or SIGKILL its rank 1 once both ranks logged steps, wait for the job."""
    run_dir.mkdir()
    log = run_dir / "torchrun.log"
    proc = start_logged(_launch(run_dir, make_plan), log)
    try:
        wait_for_steps(run_dir, 3)
        os.kill(_rank_pid(run_dir, 1), sig)
        t0 = time.monotonic()
        bound = COLLECTIVE_TIMEOUT_S + STOP_GRACE_S + MARGIN_S
        rc = proc.wait(timeout=bound + 30)  # past the bound the assertion below reports it
        elapsed = time.monotonic() - t0
    finally:
        kill_group(proc)
    print(f"{sig.name}: job exited rc={rc} {elapsed:.1f} s after the fault (bound {bound:.0f} s)")
    return {
        "rc": rc,
        "elapsed": elapsed,
        "bound": bound,
        "log": log.read_text(errors="replace"),
        "left": _rank_pids(run_dir),
    }


def _outer_timeout_with_a_frozen_rank(run_dir: Path, make_plan) -> dict:
    """run_logged's outer timeout (the train task's) on a job whose rank 1 freezes after 2 steps."""
    run_dir.mkdir()
    cmd = _launch(run_dir, make_plan, timeout_s=600)  # only the launcher's timeout may end this job
    ranks: dict[int, int] = {}

    def freeze_rank_1() -> None:  # like a hung GPU: frozen, so the agent's SIGTERM cannot end it
        try:
            wait_for_steps(run_dir, 2)
            ranks.update(_rank_pids(run_dir))
            os.kill(ranks[1], signal.SIGSTOP)
        except (AssertionError, LookupError, OSError, KeyError):
            pass

    t = threading.Thread(target=freeze_rank_1, daemon=True)
    t.start()
    raised: Exception | None = None
    try:
        run_logged(cmd, run_dir / "torchrun.log", timeout_s=LAUNCHER_TIMEOUT_S)
    except TimeoutError as exc:
        raised = exc
    t.join(timeout=5)
    return {"raised": raised, "ranks": dict(ranks), "left": _rank_pids(run_dir)}


@pytest.fixture(scope="module")
def faults(tmp_path_factory, make_plan) -> dict[str, dict]:
    """The three faulted jobs run at once, each in a thread, each in its own folder: a job mostly waits
    (gloo's timeout, torchrun's grace for a frozen worker, the launcher's timeout), so together they take
    about as long as the slowest alone. What each job did is asserted by the tests below."""
    base = tmp_path_factory.mktemp("hang")
    jobs = {
        "frozen": lambda: _signal_rank_1(base / "frozen", make_plan, signal.SIGSTOP),
        "dead": lambda: _signal_rank_1(base / "dead", make_plan, signal.SIGKILL),
        "outer-timeout": lambda: _outer_timeout_with_a_frozen_rank(base / "outer-timeout", make_plan),
    }
    results: dict[str, dict] = {}

    def run(name: str) -> None:
        try:
            results[name] = jobs[name]()
        except BaseException as exc:  # re-raised by the test of that job
            results[name] = {"error": exc}

    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return results


def _result(faults: dict[str, dict], name: str) -> dict:
    res = faults.get(name)
    assert res is not None, f"the {name} job did not finish within 600 s"
    if "error" in res:
        raise res["error"]
    return res


@pytest.mark.parametrize("name", ["frozen", "dead"])
def test_a_frozen_or_dead_rank_fails_the_job_within_the_bound(faults, name):
    res = _result(faults, name)
    text = res["log"]
    assert res["rc"] != 0, text[-3000:]
    assert res["elapsed"] < res["bound"], f"took {res['elapsed']:.1f} s\n{text[-3000:]}"
    if name == "frozen":  # the surviving rank says why it gave up
        assert "watchdog" in text or "timed out" in text.lower() or "timeout" in text.lower(), text[-3000:]
    assert res["left"] == {}, "no rank may outlive its job"


def test_launcher_timeout_kills_the_whole_process_group_even_with_a_frozen_rank(faults):
    """run_logged's outer timeout (the train task's) SIGTERMs then SIGKILLs agent and every rank."""
    res = _result(faults, "outer-timeout")
    assert isinstance(res["raised"], TimeoutError), f"expected the launcher's TimeoutError, got {res['raised']!r}"
    assert "process group was killed" in str(res["raised"]), res["raised"]
    assert set(res["ranks"]) == {0, 1}, "the ranks never started and froze, so the test proved nothing"
    assert res["left"] == {}, "ranks outlived the launcher's timeout"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
