"""The per-phase watchdog (worker/watchdog.py) ends a stuck process, and only a stuck one.

Each case runs in a child process, because firing means os._exit of the whole process.
"""

from __future__ import annotations

import subprocess
import sys

from worker.watchdog import WATCHDOG_EXIT_CODE, phase_deadline_s

CHILD = """
import sys, time
from worker.watchdog import Watchdog
dog = Watchdog(float(sys.argv[1]), " rank 7").start()
for i in range(int(sys.argv[2])):  # phases that each finish well inside the deadline
    dog.beat(f"step {i}")
    time.sleep(0.05)
dog.beat("final barrier")
time.sleep(float(sys.argv[3]))  # a phase that never ends while > deadline: a dead peer's barrier
dog.stop()
print("finished", flush=True)
"""


def _run(deadline_s: float, steps: int, hang_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(deadline_s), str(steps), str(hang_s)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_phase_past_its_deadline_exits_with_the_phase_and_stacks():
    proc = _run(0.5, 3, 30.0)
    assert proc.returncode == WATCHDOG_EXIT_CODE and "finished" not in proc.stdout
    assert "watchdog rank 7: stuck in 'final barrier'" in proc.stderr
    assert "time.sleep" in proc.stderr or "<string>" in proc.stderr  # the stack dump shows where


def test_phases_that_beat_in_time_are_left_alone():
    proc = _run(1.0, 40, 0.2)  # 40 × 50 ms = 2 s in total: longer than the deadline, but each phase is short
    assert proc.returncode == 0 and "finished" in proc.stdout and "watchdog" not in proc.stderr


def test_deadline_leaves_gloo_time_to_report_first():
    assert phase_deadline_s(10.0) > 10.0 + 10.0 and phase_deadline_s(300.0) == 630.0
