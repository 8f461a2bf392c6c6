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

`serve_session` is one serving run from the flow process's side: the placement written once into the
run folder (what every rank reads), the ranks started and up, the router's HTTP front end, warm-up
requests, then the trace replayed (or serving for a while, or until interrupted), the router's rows
handed to `record` (the caller's DuckDB writer: the launcher holds no database) every second and at
the end — whatever ends the session, Ctrl-C included, the ranks are stopped and every row recorded.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import rundir
from launcher import group as procs
from launcher.router import Router, post, replay
from planner.serve.placement import Placement
from planner.serve.workload import Trace
from planner.specs.config import SERVE_START_TIMEOUT_S
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

    def start(self, timeout_s: float = SERVE_START_TIMEOUT_S) -> None:
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


@dataclass
class SessionResult:
    statuses: list[int]  # the replay's HTTP statuses, in trace order
    rows: list[dict]  # every request the router logged (with its monotonic times)
    recorded: int  # rows `record` wrote
    t0: float  # the router's clock at the trace's time 0
    codes: list[int | None]  # each group's last generation's exit code
    events: list[GroupEvent]
    gave_up: list[bool]


def serve_session(
    pl: Placement,
    run_dir: str,
    run_id: str,
    slo_s: dict[str, float],
    record: Callable[[list[dict]], int],
    trace: Trace | None = None,
    port: int = 0,
    warmup: int = 3,
    serve_s: float | None = None,
    start_timeout_s: float = SERVE_START_TIMEOUT_S,
) -> SessionResult:
    """One serving run (module docstring)."""
    placement = rundir.serve_placement_path(run_dir)
    placement.parent.mkdir(parents=True, exist_ok=True)
    placement.write_text(pl.model_dump_json())  # what every rank reads
    router = Router(pl, slo_s, run_id)
    ranks = Serving(pl, router, run_dir)
    names = [m.name for m in pl.models]
    rows: list[dict] = []
    statuses: list[int] = []
    recorded, t0 = 0, 0.0
    lock = threading.Lock()

    def flush() -> None:
        nonlocal recorded
        with lock:
            batch = router.take_rows()
            rows.extend(batch)
            recorded += record(batch)

    try:
        ranks.start(start_timeout_s)
        http_port = router.start_http(port)
        print(f"serving {', '.join(router.served)} on http://127.0.0.1:{http_port}/models/<name>", flush=True)
        router.phase = "warmup"
        for name in router.served:
            for _ in range(warmup):
                post(http_port, name, 60.0)
        router.phase = "serve"
        t0 = time.monotonic()
        if trace is not None:
            done = threading.Event()

            def meanwhile() -> None:  # rows reach the database while the replay runs
                while not done.wait(1.0):
                    flush()

            writer = threading.Thread(target=meanwhile, daemon=True)
            writer.start()
            try:
                statuses = replay(http_port, trace, names, t0=t0)
            finally:
                done.set()
                writer.join()
        else:
            end = t0 + serve_s if serve_s is not None else float("inf")
            while time.monotonic() < end and ranks.alive():
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
                flush()
        router.stop_http()
        codes = ranks.stop()
    except BaseException:
        router.stop_http()
        ranks.stop(0.0)
        raise
    finally:
        router.close()
        flush()
    return SessionResult(statuses, rows, recorded, t0, codes, list(ranks.events), list(ranks.gave_up))


def _tail(path, num_chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-num_chars:]
    except OSError:
        return ""
