"""A per-phase deadline for a torchrun rank, so no dead or frozen peer can hang a run forever.

gloo's collective timeout (`--timeout-s`) already fails a blocked send/recv/all-reduce, but not
everything honours it: `init_process_group(timeout=…)` has been seen to hang for good on a
re-rendezvous. So each rank runs one daemon thread holding a deadline that the training loop
re-arms at every phase ("rendezvous", "step 12", "checkpoint 12", "final barrier"). A phase that
outlives its deadline prints which phase and how long, dumps every thread's stack (to show where it
hung), and ends the process with os._exit(WATCHDOG_EXIT_CODE): no finally-blocks or atexit hooks
that could block on the same dead peer. torchrun then sees a failed worker and stops the rest.

The bound, from the moment a peer freezes (SIGSTOP) or dies, until torchrun has exited non-zero:
    gloo:      collective_timeout_s                           (the usual path; measured in the tests)
    backstop:  phase_deadline_s(collective_timeout_s)         (if gloo does not fire)
  + STOP_GRACE_S: torchrun SIGTERMs the remaining workers and waits this long before SIGKILL — a
    frozen worker cannot act on SIGTERM, so this wait is always paid in the frozen case.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

WATCHDOG_EXIT_CODE = 124  # the same as timeout(1): "ran past its deadline"
STOP_GRACE_S = 30.0  # torch.distributed.elastic LocalElasticAgent._stop_workers: _shutdown(timeout=30)


def phase_deadline_s(collective_timeout_s: float) -> float:
    """Deadline of one phase: longer than one blocked collective can legitimately take (so gloo's
    own, more precise error comes first) plus room for a phase's compute."""
    return 2.0 * collective_timeout_s + 30.0


class Watchdog:
    def __init__(self, deadline_s: float, label: str = "") -> None:
        self.deadline_s = deadline_s
        self._label = label
        self._lock = threading.Lock()
        self._phase, self._since = "start", time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="meshplan-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def beat(self, phase: str) -> None:
        """Enter `phase`: its own full deadline starts now."""
        with self._lock:
            self._phase, self._since = phase, time.monotonic()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        poll_s = min(1.0, self.deadline_s / 10)
        while not self._stopped.wait(poll_s):
            with self._lock:
                phase, waited = self._phase, time.monotonic() - self._since
            if waited > self.deadline_s:
                self._fire(phase, waited)

    def _fire(self, phase: str, waited: float) -> None:
        print(
            f"watchdog{self._label}: stuck in {phase!r} for {waited:.0f} s (deadline {self.deadline_s:.0f} s): "
            "a peer is dead or frozen; exiting so the job fails instead of hanging",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(WATCHDOG_EXIT_CODE)


_current: Watchdog | None = None


def start(collective_timeout_s: float, label: str = "") -> Watchdog:
    """Start this process's watchdog (once); beat() re-arms it from anywhere in the rank."""
    global _current
    if _current is None:
        _current = Watchdog(phase_deadline_s(collective_timeout_s), label).start()
    return _current


def beat(phase: str) -> None:
    if _current is not None:
        _current.beat(phase)


def stop() -> None:
    global _current
    if _current is not None:
        _current.stop()
        _current = None
