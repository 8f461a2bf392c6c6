"""Replay a trace round by round (no ranks): every policy on the same jobs, cluster and speed source.

Each round (`round_s`, 300 s in the Arena/Crius study) the simulator runs `decide` and applies
its actions; a started or resized job makes no progress for its priced warm-up (`relaunch_s`, or
the full switch cost after a resize), then advances `1 / iter_time_s` iterations per second. A job
finishes at the exact second its last iteration ends; its devices come back at the next round.
`decide` is called only in rounds where something changed (an arrival, a finish or a resize):
with the queue, the free devices and the speeds unchanged, it would choose the same again.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from planner.errors import MeshplanError
from planner.scheduler.decide import Policy, decide
from planner.scheduler.speed import SpeedSource
from planner.scheduler.types import ClusterState, Job, RunningJob


@dataclass
class JobOutcome:
    job_id: str
    submit_s: float
    start_s: float | None = None
    finish_s: float | None = None
    resizes: int = 0
    rejected: str = ""
    segments: list[tuple[float, float, str, int]] = field(default_factory=list)  # (start, end, kind, count)

    @property
    def jct_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.submit_s

    @property
    def queue_s(self) -> float | None:
        return None if self.start_s is None else self.start_s - self.submit_s


@dataclass
class SimResult:
    policy: str
    jobs: list[JobOutcome]
    kinds: list[str]
    kind_totals: dict[str, int]
    round_s: float
    times_s: list[float] = field(default_factory=list)  # round starts
    busy: dict[str, list[int]] = field(default_factory=dict)  # GPUs held per kind, per round
    samples_per_s: list[float] = field(default_factory=list)  # cluster throughput, per round
    decide_calls: list[tuple[int, int, float]] = field(default_factory=list)  # (queued, running, wall_s)
    decide_cpu_s: list[float] = field(default_factory=list)  # each call's CPU time (a loaded machine inflates wall)
    wall_s: float = 0.0

    def _jcts(self) -> list[float]:
        return sorted(j.jct_s for j in self.jobs if j.jct_s is not None)

    @property
    def finished(self) -> int:
        return len(self._jcts())

    @property
    def rejected(self) -> int:
        return sum(1 for j in self.jobs if j.rejected)

    @property
    def avg_jct_s(self) -> float:
        v = self._jcts()
        return sum(v) / len(v) if v else math.nan

    @property
    def p99_jct_s(self) -> float:
        v = self._jcts()
        return v[min(len(v) - 1, math.ceil(0.99 * len(v)) - 1)] if v else math.nan

    @property
    def avg_queue_s(self) -> float:
        v = [j.queue_s for j in self.jobs if j.queue_s is not None]
        return sum(v) / len(v) if v else math.nan

    @property
    def makespan_s(self) -> float:
        ends = [j.finish_s for j in self.jobs if j.finish_s is not None]
        return max(ends) - min(j.submit_s for j in self.jobs) if ends else math.nan

    @property
    def resizes(self) -> int:
        return sum(j.resizes for j in self.jobs)

    @property
    def decide_s(self) -> float:
        return sum(w for _, _, w in self.decide_calls)

    def utilisation(self, kind: str) -> float:
        b = self.busy.get(kind, [])
        return sum(b) / (len(b) * self.kind_totals[kind]) if b else 0.0


def simulate(
    jobs: list[Job],
    cluster: ClusterState,
    policy: Policy,
    speed: SpeedSource,
    *,
    round_s: float = 300.0,
    max_rounds: int = 1_000_000,
    until_s: float | None = None,
) -> SimResult:
    """Replay `jobs` (by submit time) on a copy of `cluster` until every job finished or was rejected
    (or, with `until_s`, until the round that reaches that time: a cut, later jobs left unfinished)."""
    if round_s <= 0:
        raise MeshplanError("round_s", round_s, "must be positive")
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise MeshplanError("job_id", dup, "job ids must be unique in a trace")
    t_wall = time.perf_counter()
    cl = cluster.copy()
    pending = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
    out = {j.job_id: JobOutcome(j.job_id, j.submit_s) for j in jobs}
    res = SimResult(policy.name, list(out.values()), cl.kinds, {k: cl.total(k) for k in cl.kinds}, round_s)
    res.busy = {k: [] for k in cl.kinds}
    queue: list[Job] = []
    running: dict[str, RunningJob] = {}
    t0 = t = pending[0].submit_s if pending else 0.0  # rounds start at the first arrival, every round_s
    changed, nxt = True, 0
    for _ in range(max_rounds):
        if until_s is not None and t >= until_s:
            break
        while nxt < len(pending) and pending[nxt].submit_s <= t:
            queue.append(pending[nxt])
            nxt, changed = nxt + 1, True
        if not (queue or running):
            if nxt >= len(pending):
                break
            t = max(
                t, t0 + math.ceil((pending[nxt].submit_s - t0) / round_s) * round_s
            )  # idle: skip to the next arrival
            continue
        resized = False
        if changed and (queue or running):
            w0, c0 = time.perf_counter(), time.process_time()
            d = decide(cl, queue, list(running.values()), policy, speed, t)
            res.decide_calls.append((len(queue), len(running), time.perf_counter() - w0))
            res.decide_cpu_s.append(time.process_time() - c0)
            _apply(d, cl, queue, running, out, policy, t)
            resized = any(a.kind != "start" for a in d.actions) or bool(d.rejections)
        res.times_s.append(t)
        for k in cl.kinds:
            res.busy[k].append(cl.busy(k))
        res.samples_per_s.append(_advance(running, cl, out, t, round_s))
        changed = _reap(running, cl, out, t + round_s) or bool(resized)
        t += round_s
    res.wall_s = time.perf_counter() - t_wall
    return res


def _apply(
    d, cl: ClusterState, queue: list[Job], running: dict[str, RunningJob], out, policy: Policy, t: float
) -> None:
    rejected = {r.job_id: r.reason for r in d.rejections}
    for jid, why in rejected.items():
        out[jid].rejected = why
    resizes = [a for a in d.actions if a.kind != "start"]
    for a in resizes:  # devices a resize gives back are free before anything new takes them
        cl.release(running[a.job_id].placement)
    for a in resizes:
        r = running[a.job_id]
        _close_segment(out[a.job_id], t)
        cl.take(a.placement)
        r.placement, r.iter_time_s, r.plan = a.placement, a.iter_time_s, a.plan
        r.warmup_left_s = policy.switch_s(r.job)
        out[a.job_id].resizes += 1
        out[a.job_id].segments.append((t, math.nan, a.placement.alloc.kind, a.placement.alloc.count))
    by_id = {j.job_id: j for j in queue}
    for a in d.actions:
        if a.kind != "start":
            continue
        cl.take(a.placement)
        running[a.job_id] = RunningJob(
            by_id[a.job_id], a.placement, a.iter_time_s, 0.0, t, policy.relaunch_s, a.base or a.placement.alloc, a.plan
        )
        out[a.job_id].start_s = t
        out[a.job_id].segments.append((t, math.nan, a.placement.alloc.kind, a.placement.alloc.count))
    gone = set(rejected) | {a.job_id for a in d.actions if a.kind == "start"}
    queue[:] = [j for j in queue if j.job_id not in gone]


def _close_segment(o: JobOutcome, end_s: float) -> None:
    if o.segments and math.isnan(o.segments[-1][1]):
        s, _, k, c = o.segments[-1]
        o.segments[-1] = (s, end_s, k, c)


def _advance(running: dict[str, RunningJob], cl: ClusterState, out, t: float, round_s: float) -> float:
    """Progress every running job through [t, t + round_s); returns the round's mean samples/s."""
    samples = 0.0
    for r in running.values():
        warm = min(r.warmup_left_s, round_s)
        r.warmup_left_s -= warm
        work_s = round_s - warm
        left = r.remaining_iterations
        iters = min(left, work_s / r.iter_time_s)
        r.done_iterations += iters
        samples += iters * r.job.global_batch
        if r.remaining_iterations <= 1e-9:
            out[r.job.job_id].finish_s = t + warm + left * r.iter_time_s
    return samples / round_s


def _reap(running: dict[str, RunningJob], cl: ClusterState, out, round_end_s: float) -> bool:
    done = [jid for jid, r in running.items() if r.remaining_iterations <= 1e-9]
    for jid in done:
        r = running.pop(jid)
        cl.release(r.placement)
        _close_segment(out[jid], out[jid].finish_s or round_end_s)
    return bool(done)
