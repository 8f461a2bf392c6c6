"""Serving ranks on the launcher: one torchrun per placement group, restarted when one of its ranks dies.

`Serving` starts every group of a placement as its own process group (launcher/group.py, the one way
to start and stop processes): `python -m worker.agent --nproc-per-node pp×tp -m worker.serve
<ServeSpec flags>` (`serve_command`), its output appended to `rundir.serve_log(run, group)`. Groups
share nothing but the router (launcher/router.py), so a dead rank takes down its group only: the
router answers 503 for the group's models while it is down (or routes them to another group hosting
them), and a watcher thread stops what is left of the group and starts it again as the next
generation (the router ignores connections of older generations), at most `max_restarts` times per
group; past that the group stays down and its models are refused (503) until the run ends.
`stop` asks every group to finish its pipeline, waits for the ranks to end (they end through
worker/teardown.exit_now), and stops whatever is left.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import rundir
from launcher import group as procs
from launcher.router import Router
from planner.serve.placement import Placement
from planner.specs.servespec import ServeSpec

MAX_RESTARTS = 5  # per group and run


def serve_command(spec: ServeSpec, nproc: int, python: str = sys.executable) -> list[str]:
    """One group's torchrun: the agent on loopback, the ranks told `spec` and nothing else."""
    cmd = [python, "-m", "worker.agent", "--nproc-per-node", str(nproc), "--max-restarts", "0"]
    return [*cmd, "-m", "worker.serve", *spec.to_argv()]


def group_specs(pl: Placement, run_dir: str, router: str, **options) -> list[ServeSpec]:
    """Each group's ServeSpec (generation 0): its index and first rank in the placement's order."""
    out, base = [], 0
    for gi, g in enumerate(pl.groups):
        placement = str(rundir.serve_placement_path(run_dir))
        out.append(ServeSpec(placement=placement, router=router, run_dir=run_dir, group=gi, base_rank=base, **options))
        base += g.pp * g.tp
    return out


@dataclass
class GroupEvent:
    group: int
    generation: int
    event: str  # died | restarted | gave-up
    at_s: float  # seconds since the serving run started
    returncode: int | None = None


@dataclass
class Serving:
    """The placement's ranks, group by group (module docstring)."""

    pl: Placement
    router: Router
    run_dir: str
    options: dict = field(default_factory=dict)  # ServeSpec fields every group shares (calib_reps, seed, ...)
    max_restarts: int = MAX_RESTARTS
    events: list[GroupEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.specs = group_specs(self.pl, self.run_dir, self.router.rank_address, **self.options)
        self.procs: list[subprocess.Popen | None] = [None] * len(self.specs)
        self.restarts = [0] * len(self.specs)
        self.gave_up = [False] * len(self.specs)
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
        self.t0 = time.monotonic()
        self.router.on_down = self._on_down

    def _start(self, gi: int) -> None:
        spec = self.specs[gi]
        self.router.expect(gi, spec.generation)
        g = self.pl.groups[gi]
        log = rundir.serve_log(self.run_dir, gi)
        self.procs[gi] = procs.start(serve_command(spec, g.pp * g.tp), log)

    def start(self, timeout_s: float = 300.0) -> None:
        """Start every group and wait until each is up; a group whose ranks exit first fails the start."""
        with self.lock:
            for gi in range(len(self.specs)):
                self._start(gi)

        def alive() -> bool:
            return all(p is not None and p.poll() is None for p in self.procs)

        if not self.router.wait_up(list(range(len(self.specs))), timeout_s, alive):
            dead = [gi for gi, p in enumerate(self.procs) if p is not None and p.poll() is not None]
            self.stop(0.0)
            gi = dead[0] if dead else 0
            log = rundir.serve_log(self.run_dir, gi)
            why = f"exited {self.procs[gi].returncode}" if dead else f"did not connect within {timeout_s:.0f} s"
            raise RuntimeError(f"serving group {gi}'s ranks {why}; log {log}:\n{_tail(log)}")
        threading.Thread(target=self._watch, daemon=True, name="serving-watch").start()

    def _on_down(self, gi: int, generation: int) -> None:
        self.wake.set()  # the watcher looks at every group

    def _watch(self) -> None:
        while not self.stopping:
            self.wake.wait(0.2)
            self.wake.clear()
            with self.lock:
                if self.stopping:
                    return
                for gi, proc in enumerate(self.procs):
                    if self.gave_up[gi] or proc is None:
                        continue
                    lost = self.router.ever_up[gi] and not self.router.up[gi]  # connected once, not now
                    if proc.poll() is not None or lost:
                        self._restart(gi, proc)

    def _restart(self, gi: int, proc: subprocess.Popen) -> None:
        at = time.monotonic() - self.t0
        procs.stop(proc)  # what is left of the group: the agent, a rank blocked in a collective
        spec = self.specs[gi]
        self.events.append(GroupEvent(gi, spec.generation, "died", at, proc.returncode))
        if self.restarts[gi] >= self.max_restarts:
            self.gave_up[gi] = True
            self.events.append(GroupEvent(gi, spec.generation, "gave-up", at))
            return
        self.restarts[gi] += 1
        self.specs[gi] = spec.model_copy(update={"generation": spec.generation + 1})
        self._start(gi)
        self.events.append(GroupEvent(gi, spec.generation + 1, "restarted", time.monotonic() - self.t0))

    def alive(self) -> bool:
        """Some group is running (or being restarted)."""
        return not all(self.gave_up)

    def stop(self, wait_s: float = 60.0) -> list[int | None]:
        """End every group's pipeline, wait up to `wait_s` for its ranks to exit, stop what is left;
        each group's last generation's exit code (None: it was stopped)."""
        with self.lock:
            self.stopping = True
        self.router.stop_groups()
        deadline = time.monotonic() + wait_s
        codes: list[int | None] = []
        for proc in self.procs:
            if proc is None:
                codes.append(None)
                continue
            try:
                codes.append(proc.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
            procs.stop(proc)  # nothing of the group outlives the run, whatever its agent did
        return codes


def _tail(path, num_chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-num_chars:]
    except OSError:
        return ""
