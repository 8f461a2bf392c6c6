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

A group given `Measured` samples (what its serving ranks and the router logged per request,
planner/serve/calibrate.py) draws each request's times from them, i.i.d., instead of using one mean
per stage: queueing depends on the service times' variance (M/G/1, Pollaczek–Khinchine), which a
mean-only model misses. The first stage takes a request `front` seconds after both it has arrived
and the stage is free (router → rank); stage s takes the activation when stage s-1 is done with it
and stage s is free, and the hand-off lasts `hop` seconds holding both (blocking send/recv); the
reply reaches the client `back` seconds after the last stage's forward, and the last stage is free
`tail` seconds after it. Requests that queued for the first stage draw from the samples of requests
that queued (the ranks and front end then share the CPUs: slower), the others from the rest, and
every drawn time is scaled by the box's measured speed around the request's arrival (other
processes come and go). Such a group serves one request at a time, as meshplan's ranks do, and drops
a request whose drawn finish passes its deadline (the ranks drop on their start-up estimate: the
same rule where the two agree); `replicate` runs several seeds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from planner.serve.workload import Trace


def _pick(rng: np.random.Generator, x: np.ndarray) -> float:
    return float(x[rng.integers(len(x))]) if len(x) else 0.0


@dataclass
class Service:
    """Per-request samples (seconds): `front` arrival (or the first stage's previous request) → the
    first stage takes it; `work[m][s]` stage s's work on a request of model m; `hop[s]` the hand-off
    from stage s to s+1; `back` last stage's forward done → reply; `tail` last stage's forward done →
    free for the next request (the reply's send)."""

    front: np.ndarray
    work: dict[int, list[np.ndarray]]
    hop: list[np.ndarray]
    back: np.ndarray
    tail: np.ndarray

    def draw(self, rng: np.random.Generator, m: int) -> tuple[tuple[float, ...], tuple[float, ...], float, float]:
        work = tuple(_pick(rng, w) for w in self.work[m])
        return work, tuple(_pick(rng, h) for h in self.hop), _pick(rng, self.back), _pick(rng, self.tail)


@dataclass
class Measured:
    """What a group's ranks and the router measured per request: the service of requests that found
    the first stage free (`idle`) and of those that queued for it (`queued`). While a group works off
    a queue its ranks and the front end are all busy and share the CPUs, so its service is slower
    than when requests come alone; a draw takes the set that matches the simulated request's state."""

    idle: Service
    queued: Service
    # the box's speed over the trace (seconds of trace time → factor on every drawn time; samples are
    # stored divided by it): other processes come and go, so service is slower in some seconds than
    # others, and a burst's wait depends on the speed while it lasts. Empty: 1 throughout.
    speed_at: np.ndarray = field(default_factory=lambda: np.zeros(0))
    speed: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def speed_of(self, t: float) -> float:
        return float(np.interp(t, self.speed_at, self.speed)) if len(self.speed) else 1.0

    def service(self, m: int, waited: bool) -> Service:
        first, other = (self.queued, self.idle) if waited else (self.idle, self.queued)
        return first if m in first.work else other


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
    dropped: int = 0  # requests dropped so far (a budgeted run stops once they pass its budget)
    queued_s: float = 0.0  # first-stage seconds of the queued requests (the routing backlog)
    measured: Measured | None = None  # per-request samples: draw each request's times (module docstring)
    seed: int = 0
    _draws: dict = field(default_factory=dict, repr=False)
    _rng: np.random.Generator | None = field(default=None, repr=False)

    def reset(self) -> None:
        self.free = [0.0] * self.pp
        self.queue = deque()
        self.busy_s = 0.0
        self.queued_s = 0.0
        self.dropped = 0
        self._draws = {}
        self._rng = np.random.default_rng(self.seed)


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
    if g.measured is not None:
        _advance_measured(g, until, arrival, model, deadline, out)
        return
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
                g.dropped += 1
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


def _advance_measured(g: SimGroup, until: float, arrival: list, model: list, deadline: list, out: list) -> None:
    """`_advance` for a group with measured samples: one request at a time, drawn times (module docstring)."""
    q, free, meas, rng = g.queue, g.free, g.measured, g._rng
    assert meas is not None and rng is not None
    while q:
        head = q[0]
        a = arrival[head]
        waited = free[0] > a
        m = model[head]
        draw = g._draws.get(head)
        if draw is None or draw[0] != waited:  # drawn once per state: a request is looked at until it starts
            draw = g._draws[head] = (waited, _pick(rng, meas.service(m, waited).front) * meas.speed_of(a))
        start = max(free[0], a) + draw[1]
        if start > until:
            return
        q.popleft()
        del g._draws[head]
        g.queued_s -= g.times[m][0][0]
        work, hop, back, tail = meas.service(m, waited).draw(rng, m)
        k = meas.speed_of(a)
        work, hop, back, tail = tuple(k * w for w in work), tuple(k * h for h in hop), k * back, k * tail
        e = start + work[0]
        ends = [e]
        for s in range(1, len(work)):
            b = max(e, free[s]) + hop[s - 1]  # stage s takes the activation; the hand-off holds stage s-1 too
            ends[s - 1] = b
            e = b + work[s]
            ends.append(e)
        if e + back > deadline[head]:
            continue  # dropped: latency stays NaN
        ends[-1] += tail
        free[: len(ends)] = ends
        g.busy_s += ends[0] - start
        out[head] = e + back - a


def replicate(
    groups: list[SimGroup], routes: dict[int, list[int]], trace: Trace, slo_s: np.ndarray, names: list[str], seeds: int
) -> list[dict]:
    """Per model, the median over `seeds` seeded runs of each figure of `SimResult.per_model` (groups
    with measured samples draw different times per seed; the median is stabler than one run's p99)."""
    runs = []
    for seed in range(seeds):
        for g in groups:
            g.seed = seed
        runs.append(simulate(groups, routes, trace, slo_s).per_model(names))
    out = []
    for rows in zip(*runs, strict=True):
        row = dict(rows[0])
        for k, v in row.items():
            if isinstance(v, float):
                row[k] = float(np.median([r[k] for r in rows]))
        out.append(row)
    return out


def simulate(groups: list[SimGroup], routes: dict[int, list[int]], trace: Trace, slo_s: np.ndarray) -> SimResult:
    """Serve `trace` on `groups`; `routes[m]` = the groups hosting model m (none: its requests drop)."""
    r = simulate_within(groups, routes, trace, slo_s, None)
    assert r is not None
    return r


def simulate_within(
    groups: list[SimGroup], routes: dict[int, list[int]], trace: Trace, slo_s: np.ndarray, max_dropped: int | None
) -> SimResult | None:
    """`simulate`, stopped early: None as soon as more than `max_dropped` requests are dropped (for
    groups of one request per batch, no measured samples, every request routed: a served request
    then meets its deadline, so good = requests − dropped) — a candidate that cannot beat an
    incumbent is not simulated to the end."""
    arrival, model = trace.arrival_s, trace.model
    deadline = arrival + slo_s[model]
    out = [float("nan")] * len(arrival)
    for g in groups:
        g.reset()
    arr_list, mod_list = arrival.tolist(), model.tolist()
    dl_list = deadline.tolist()
    for r in range(len(arr_list)):
        if max_dropped is not None and not r & 63 and sum(g.dropped for g in groups) > max_dropped:
            return None
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
    if max_dropped is not None and sum(g.dropped for g in groups) > max_dropped:
        return None
    return SimResult(np.array(out), model, slo_s, trace.duration_s, [g.busy_s for g in groups])
