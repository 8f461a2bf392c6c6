"""Discrete-event serving simulator: requests through groups of pipelined stages, FCFS, SLO drops.

Each group has one queue. When its first stage is free it takes the request at the head of the
queue and, with it, up to `max_batch - 1` more queued requests of the same model that have arrived
(a batch runs at the stage times of its size). A batch moves through the stages in order; stage s
starts it when both the batch has left stage s-1 and stage s is free, so a group overlaps up to pp
batches — pipelined execution; stage s-1 is held until stage s takes the batch (no buffer between
stages: meshplan's ranks hand activations over with blocking gloo/NCCL send/recv), as AlpaServe's simulator (OSDI'23 §4.2) and meshplan's serving ranks
run it. A request whose finish time, computed when it would start, exceeds its deadline is dropped
instead (it would waste the group); drops count as SLO misses. A model placed on several groups
sends each request to the group where it would start first (shortest backlog).

Runs in O(requests · (replicas + pp)); a group's state advances lazily to each arrival.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from planner.serve.workload import Trace


@dataclass
class SimGroup:
    """A group as the simulator sees it: stage count and, per hosted model, stage times per batch
    size (`times[m][b - 1]` = the b-request batch's seconds per stage)."""

    pp: int
    times: dict[int, list[tuple[float, ...]]]
    max_batch: int = 1
    overhead_s: float = 0.0  # per request, outside the stages (front end, sockets): delays, occupies nothing
    free: list[float] = field(default_factory=list)
    queue: deque = field(default_factory=deque)
    busy_s: float = 0.0  # first-stage busy time (utilisation)
    queued_s: float = 0.0  # first-stage seconds of the queued requests (the routing backlog)

    def reset(self) -> None:
        self.free = [0.0] * self.pp
        self.queue = deque()
        self.busy_s = 0.0
        self.queued_s = 0.0


@dataclass
class SimResult:
    """Per request: latency (NaN = dropped); per group: first-stage busy seconds."""

    latency_s: np.ndarray
    model: np.ndarray
    slo_s: np.ndarray  # per model
    duration_s: float
    group_busy_s: list[float]

    def good(self) -> np.ndarray:
        """Whether each request finished within its model's SLO."""
        lat = self.latency_s
        with np.errstate(invalid="ignore"):
            return ~np.isnan(lat) & (lat <= self.slo_s[self.model] + 1e-12)

    def attainment(self) -> float:
        return float(self.good().mean()) if len(self.latency_s) else 1.0

    def per_model(self, names: list[str]) -> list[dict]:
        """attainment, p50/p99 latency of served requests, goodput (good requests/s), drops, per model."""
        good = self.good()
        rows = []
        for i, name in enumerate(names):
            sel = self.model == i
            rows.append(_stats(name, self.latency_s[sel], good[sel], self.duration_s))
        rows.append(_stats("all", self.latency_s, good, self.duration_s))
        return rows


def _stats(name: str, lat: np.ndarray, good: np.ndarray, duration_s: float) -> dict:
    served = lat[~np.isnan(lat)]
    return {
        "model": name,
        "requests": int(len(lat)),
        "attainment": float(good.mean()) if len(lat) else 1.0,
        "p50_s": float(np.percentile(served, 50)) if len(served) else float("nan"),
        "p99_s": float(np.percentile(served, 99)) if len(served) else float("nan"),
        "goodput_rps": float(good.sum() / duration_s) if duration_s > 0 else 0.0,
        "dropped": int(len(lat) - len(served)),
    }


def _finish(free: list[float], start: float, stages: tuple[float, ...]) -> float:
    e = start
    for s, t in enumerate(stages):
        e = max(e, free[s]) + t
    return e


def _advance(g: SimGroup, until: float, arrival: list, model: list, deadline: list, out: list) -> None:
    """Start every batch of `g` whose start time is ≤ `until` (later arrivals cannot join it)."""
    q, free = g.queue, g.free
    if g.max_batch == 1:  # the common case, kept tight: the placement search runs thousands of these
        while q:
            head = q[0]
            a = arrival[head]
            start = free[0] if free[0] > a else a
            if start > until:
                return
            q.popleft()
            stages = g.times[model[head]][0]
            g.queued_s -= stages[0]
            e = start
            ends = []
            for s, t in enumerate(stages):
                f = free[s]
                b = e if e > f else f
                if s:
                    ends[s - 1] = b  # the hand-off: stage s-1 is held until stage s takes the request
                e = b + t
                ends.append(e)
            if e + g.overhead_s > deadline[head]:
                continue  # dropped: latency stays NaN
            free[: len(ends)] = ends
            g.busy_s += stages[0]
            out[head] = e + g.overhead_s - a
        return
    while q:
        head = q[0]
        start = max(free[0], arrival[head])
        if start > until:
            return
        m = model[head]
        # the batch: the head and queued requests of its model already here, FCFS, up to max_batch;
        # one that would miss its deadline even alone is dropped
        batch: list[int] = []
        for r in list(q):
            if len(batch) == g.max_batch:
                break
            if model[r] != m or arrival[r] > start:
                continue
            if _finish(free, start, g.times[m][0]) + g.overhead_s > deadline[r]:
                q.remove(r)
                g.queued_s -= g.times[m][0][0]
                continue  # dropped: latency stays NaN
            trial = batch + [r]
            if _finish(free, start, g.times[m][len(trial) - 1]) + g.overhead_s <= min(deadline[x] for x in trial):
                batch = trial
        if not batch:
            continue
        for r in batch:
            q.remove(r)
            g.queued_s -= g.times[m][0][0]
        e = start
        for s, t in enumerate(g.times[m][len(batch) - 1]):
            b = max(e, free[s])
            if s:
                free[s - 1] = b  # blocking hand-off, as above
            e = b + t
            free[s] = e
        g.busy_s += g.times[m][len(batch) - 1][0]
        for r in batch:
            out[r] = e + g.overhead_s - arrival[r]


def simulate(groups: list[SimGroup], routes: dict[int, list[int]], trace: Trace, slo_s: np.ndarray) -> SimResult:
    """Serve `trace` on `groups`; `routes[m]` = the groups hosting model m (none: its requests drop)."""
    arrival, model = trace.arrival_s, trace.model
    deadline = arrival + slo_s[model]
    out = [float("nan")] * len(arrival)
    for g in groups:
        g.reset()
    arr_list, mod_list = arrival.tolist(), model.tolist()
    dl_list = deadline.tolist()
    for r in range(len(arr_list)):
        t, m = arr_list[r], mod_list[r]
        hosts = routes.get(m)
        if not hosts:
            continue
        if len(hosts) == 1:
            g = groups[hosts[0]]
        else:  # the replica where it would start first: backlog = first-stage work queued ahead
            best, g = float("inf"), groups[hosts[0]]
            for h in hosts:
                cand = groups[h]
                _advance(cand, t, arr_list, mod_list, dl_list, out)
                backlog = max(cand.free[0], t) + cand.queued_s
                if backlog < best:
                    best, g = backlog, cand
        g.queue.append(r)
        g.queued_s += g.times[m][0][0]
        _advance(g, t, arr_list, mod_list, dl_list, out)
    for g in groups:
        _advance(g, float("inf"), arr_list, mod_list, dl_list, out)
    return SimResult(np.array(out), model, slo_s, trace.duration_s, [g.busy_s for g in groups])
