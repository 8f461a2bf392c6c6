"""Placement search: which groups, which parallel configuration each, which models each hosts.

AlpaServe's method (Li et al., OSDI'23 §4.3): enumerate partitions of the cluster into equal groups
and each group's configuration (pp stages × tp ranks on its device kind); for each, start from
empty groups and greedily add the (model, group) replica that most raises the number of requests
the simulator says meet their SLO, within the group's memory, until no replica helps; keep the
best. Speed comes from locality: a replica only changes the requests of the models connected to it
through shared groups (a component of the model–group graph), so a candidate's gain needs only its
component simulated, and components are memoised by a canonical key — (config, hosted models) per
group, groups being interchangeable — so unchanged candidates cost nothing the next round and empty
groups of one configuration are simulated once. The search screens every partition on a short head
of the trace, searches the best few again on a longer one, and scores the result on all of it.

Baselines in the same code: selective replication (Clockwork-style: no model parallelism, each
replica on the smallest tp group every model fits, replicas added by the same greedy, i.e. by load)
and one model per group (equal groups, the busiest models one each, the best configuration each).
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from planner.errors import MeshplanError
from planner.limits import MAX_TRACE_S
from planner.serve.cost import Config, ServeCost
from planner.serve.simulate import Measured, SimGroup, SimResult, replicate, simulate
from planner.serve.workload import ServedModel, Trace, Workload

METHODS = ("meshplan", "selective-replication", "one-model-per-group")


class GroupPlacement(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    devices: tuple[int, ...] = Field(min_length=1)
    kind: str
    pp: int = Field(gt=0)
    tp: int = Field(gt=0)
    models: tuple[str, ...] = ()


class Placement(BaseModel):
    """What `meshplan serve` starts: the models (self-contained specs) and the groups hosting them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    cluster: str
    dtype: str = "fp16"
    max_batch: int = Field(default=1, ge=1)
    models: tuple[ServedModel, ...]
    groups: tuple[GroupPlacement, ...]
    attainment: float | None = None
    search_s: float = 0.0

    def config(self, g: GroupPlacement) -> Config:
        return Config(g.kind, g.pp, g.tp)


@dataclass
class Slot:
    """A group before models are placed: its devices and configuration."""

    devices: tuple[int, ...]
    cfg: Config


@dataclass
class Problem:
    """Everything a placement is scored against: models, trace, SLOs and the cost model."""

    workload: Workload
    cost: ServeCost
    trace: Trace
    slo_s: np.ndarray
    _by_model: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_model = [np.flatnonzero(self.trace.model == i) for i in range(len(self.workload.models))]

    @property
    def models(self) -> tuple[ServedModel, ...]:
        return self.workload.models

    def times(self, m: int, cfg: Config) -> list[tuple[float, ...]]:
        sm = self.models[m]
        return [
            self.cost.stage_times(sm.name, sm.spec, cfg, b * sm.batch, sm.tokens)
            for b in range(1, self.workload.max_batch + 1)
        ]

    def fits(self, m: int, cfg: Config) -> bool:
        sm = self.models[m]
        return self.cost.supports(sm.spec, cfg) and self.cost.weight_bytes(sm.spec, cfg) <= self.cost.capacity_bytes(
            cfg.kind
        )

    def sub_trace(self, models: list[int]) -> Trace:
        idx = np.sort(np.concatenate([self._by_model[m] for m in models]))
        return Trace(self.trace.arrival_s[idx], self.trace.model[idx], self.trace.duration_s)

    def run(
        self, cfgs: list[Config], hosts: list[list[int]], trace: Trace | None = None, overhead_s: float = 0.0
    ) -> SimResult:
        groups = [
            SimGroup(c.pp, {m: self.times(m, c) for m in h}, self.workload.max_batch, overhead_s)
            for c, h in zip(cfgs, hosts, strict=True)
        ]
        routes: dict[int, list[int]] = {}
        for gi, h in enumerate(hosts):
            for m in h:
                routes.setdefault(m, []).append(gi)
        return simulate(groups, routes, trace if trace is not None else self.trace, self.slo_s)


def single_device_latency(problem_cost: ServeCost, sm: ServedModel, kind: str) -> float:
    return sum(problem_cost.stage_times(sm.name, sm.spec, Config(kind, 1, 1), sm.batch, sm.tokens))


def resolve_slos(w: Workload, cost: ServeCost) -> np.ndarray:
    """Seconds per model: slo_s, or slo_scale × the model's latency alone on one device of the
    cluster's fastest kind (AlpaServe's SLO scale)."""
    kinds = {n.device_kind: n for n in cost.cluster.nodes}
    fastest = max(kinds, key=lambda k: kinds[k].peak_flop_per_s(w.dtype))
    return np.array(
        [m.slo_s if m.slo_s is not None else m.slo_scale * single_device_latency(cost, m, fastest) for m in w.models]  # type: ignore[operator]
    )


def partition(cost: ServeCost, size: int) -> list[tuple[tuple[int, ...], str, int]] | None:
    """Groups of `size` devices, none mixing node groups: (device ids, kind, devices per node) each;
    None when some node group cannot be cut into groups of `size` (a group inside one node, or
    whole nodes)."""
    out = []
    base = 0
    for n in cost.cluster.nodes:
        total = n.count * n.num_devices
        ok = (size <= n.num_devices and n.num_devices % size == 0) or (size % n.num_devices == 0 and total % size == 0)
        if not ok:
            return None
        for start in range(0, total, size):
            out.append((tuple(range(base + start, base + start + size)), n.device_kind, n.num_devices))
        base += total
    return out


def configs(size: int, per_node: int) -> list[tuple[int, int]]:
    """(pp, tp) with pp·tp = size, tp inside a node (tensor parallelism needs the fast link)."""
    return [(size // tp, tp) for tp in range(1, size + 1) if size % tp == 0 and tp <= per_node and per_node % tp == 0]


class _Greedy:
    """The greedy replica placement on fixed slots (module docstring).

    Components of the model–group graph only ever merge (replicas are added, never removed), so each
    carries an id, renewed whenever it changes; a candidate's gain is reused while the ids of its
    model's and its group's components are the ones it was computed with."""

    def __init__(self, p: Problem, slots: list[Slot]) -> None:
        self.p, self.slots = p, slots
        n = len(p.models)
        self.hosts: list[list[int]] = [[] for _ in slots]
        self.used = [0.0] * len(slots)
        self.cache: dict[tuple, int] = {}
        self.gains: dict[tuple[int, int], tuple[int, int, int]] = {}
        self.comp_m = list(range(n))
        self.comp_g = [n + g for g in range(len(slots))]
        self.members: dict[int, tuple[frozenset[int], frozenset[int]]] = {
            i: (frozenset([i]), frozenset()) for i in range(n)
        }
        self.members.update({n + g: (frozenset(), frozenset([g])) for g in range(len(slots))})
        self.next_id = n + len(slots)
        self.sims = 0

    def good(self, models: frozenset[int], groups: frozenset[int], extra: tuple[int, int] | None = None) -> int:
        """Requests of `models` meeting their SLO on `groups` (with the `extra` replica added)."""
        hosts = {g: list(self.hosts[g]) for g in groups}
        if extra is not None:
            hosts[extra[1]].append(extra[0])
        served = sorted({m for h in hosts.values() for m in h})
        unserved = tuple(sorted(m for m in models if m not in served))
        cfgs = {g: self.slots[g].cfg for g in groups}
        key = (
            tuple(sorted((cfgs[g].kind, cfgs[g].pp, cfgs[g].tp, tuple(sorted(hosts[g]))) for g in groups if hosts[g])),
            unserved,
        )
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        live = [g for g in sorted(groups) if hosts[g]]
        value = 0
        if served:
            self.sims += 1
            r = self.p.run([cfgs[g] for g in live], [sorted(hosts[g]) for g in live], self.p.sub_trace(served))
            value = int(r.good().sum())
        self.cache[key] = value
        return value

    def gain(self, m: int, g: int) -> int:
        """Good requests gained by adding model m to group g: their merged component after, less
        the components of m and of g before (one, when they are already connected)."""
        cm, cg = self.comp_m[m], self.comp_g[g]
        hit = self.gains.get((m, g))
        if hit is not None and hit[0] == cm and hit[1] == cg:
            return hit[2]
        mm, mg = self.members[cm]
        before = self.good(mm, mg)
        if cg != cm:
            gm, gg = self.members[cg]
            before += self.good(gm, gg)
            mm, mg = mm | gm, mg | gg
        value = self.good(mm, mg, (m, g)) - before
        self.gains[(m, g)] = (cm, cg, value)
        return value

    def add(self, m: int, g: int) -> None:
        cm, cg = self.comp_m[m], self.comp_g[g]
        mm, mg = self.members.pop(cm)
        if cg != cm:
            gm, gg = self.members.pop(cg)
            mm, mg = mm | gm, mg | gg
        new = self.next_id
        self.next_id += 1
        self.members[new] = (mm, mg)
        for x in mm:
            self.comp_m[x] = new
        for x in mg:
            self.comp_g[x] = new
        self.hosts[g].append(m)

    def run(self) -> list[list[int]]:
        """Lazy greedy (CELF, Leskovec et al. KDD'07): candidates wait in a heap under their last
        gain; the top one is accepted when its gain is current (its components unchanged since it
        was computed), else recomputed and pushed back. Exact greedy would recompute every affected
        candidate each step; gains here rarely rise when other replicas are added, so the order holds."""
        n_models = len(self.p.models)
        fit = {(m, g): self.p.fits(m, s.cfg) for m in range(n_models) for g, s in enumerate(self.slots)}
        weight = {
            (m, g): self.p.cost.weight_bytes(self.p.models[m].spec, self.slots[g].cfg)
            for (m, g), ok in fit.items()
            if ok
        }
        cap = [self.p.cost.capacity_bytes(s.cfg.kind) for s in self.slots]
        heap = [(-self.gain(m, g), m, g) for (m, g), ok in fit.items() if ok and weight[(m, g)] <= cap[g]]
        heapq.heapify(heap)
        while heap:
            neg, m, g = heapq.heappop(heap)
            if m in self.hosts[g] or self.used[g] + weight[(m, g)] > cap[g]:
                continue  # placed already, or the group filled up: never feasible again
            gain = self.gain(m, g)
            if gain != -neg and heap and gain < -heap[0][0]:
                heapq.heappush(heap, (-gain, m, g))
                continue
            if gain <= 0:
                if heap and gain != -neg:
                    heapq.heappush(heap, (-gain, m, g))
                    continue
                break
            self.add(m, g)
            self.used[g] += weight[(m, g)]
        return self.hosts


def _score(p: Problem, slots: list[Slot], hosts: list[list[int]]) -> float:
    return p.run([s.cfg for s in slots], hosts).attainment()


def _check_fits(p: Problem, slot_sets: list[list[Slot]]) -> None:
    """A model that fits no group of any candidate partition: one line naming it and the fix."""
    for m, sm in enumerate(p.models):
        if not any(p.fits(m, s.cfg) for slots in slot_sets for s in slots):
            raise MeshplanError(
                f"models.{sm.name}",
                sm.preset or sm.spec.name,
                "fits no group of this cluster (too large for the memory of any group, or its heads / layers "
                "do not divide over tp / pp); add devices, use a smaller model or a smaller dtype",
            )


def _placement(
    method: str, p: Problem, slots: list[Slot], hosts: list[list[int]], score: float, took: float
) -> Placement:
    names = [m.name for m in p.models]
    return Placement(
        method=method,
        cluster=p.cost.cluster.name,
        dtype=p.workload.dtype,
        max_batch=p.workload.max_batch,
        models=p.models,
        groups=tuple(
            GroupPlacement(
                devices=s.devices, kind=s.cfg.kind, pp=s.cfg.pp, tp=s.cfg.tp, models=tuple(names[m] for m in sorted(h))
            )
            for s, h in zip(slots, hosts, strict=True)
        ),
        attainment=score,
        search_s=took,
    )


def candidate_slots(p: Problem, pp_allowed: bool = True) -> list[list[Slot]]:
    """Every uniform partition × configuration (pp × tp per group)."""
    out = []
    n = p.cost.cluster.num_devices
    for size in [s for s in range(1, n + 1) if n % s == 0 or s <= n]:
        parts = partition(p.cost, size)
        if parts is None:
            continue
        per_node = min(pn for _, _, pn in parts)
        for pp, tp in configs(size, per_node):
            if pp > 1 and not pp_allowed:
                continue
            out.append([Slot(d, Config(k, pp, tp)) for d, k, _ in parts])
    return out


def _head(trace: Trace, requests: int) -> Trace:
    """The trace's first `requests` requests (all of them if fewer)."""
    if len(trace) <= requests:
        return trace
    return trace.head(float(trace.arrival_s[requests]))


def search(p: Problem, requests: int = 2000, screen_requests: int = 400, finalists: int = 3) -> Placement:
    """meshplan's placement (module docstring). Every partition × configuration is screened by the
    greedy on the trace's first `screen_requests` requests; the `finalists` best are searched again
    on the first `requests`, and the best of those is scored on the whole trace."""
    t0 = time.monotonic()
    slot_sets = candidate_slots(p)
    _check_fits(p, slot_sets)
    screen = Problem(p.workload, p.cost, _head(p.trace, screen_requests), p.slo_s)
    ranked = []
    for i, slots in enumerate(slot_sets):
        hosts = _Greedy(screen, slots).run()
        ranked.append((_score(screen, slots, hosts), -i, slots))
    ranked.sort(key=lambda r: (r[0], r[1]), reverse=True)
    small = Problem(p.workload, p.cost, _head(p.trace, requests), p.slo_s)
    best: tuple[float, list[Slot], list[list[int]]] | None = None
    for _, _, slots in ranked[:finalists]:
        hosts = _Greedy(small, slots).run()
        score = _score(small, slots, hosts)
        if best is None or score > best[0] + 1e-9:
            best = (score, slots, [list(h) for h in hosts])
    assert best is not None
    _, slots, hosts = best
    return _placement("meshplan", p, slots, hosts, _score(p, slots, hosts), time.monotonic() - t0)


def selective_replication(p: Problem, requests: int = 2000) -> Placement:
    """No model parallelism: replicas on the smallest tp group (pp = 1) every model fits, added greedily."""
    t0 = time.monotonic()
    slot_sets = [s for s in candidate_slots(p, pp_allowed=False)]
    slot_sets.sort(key=lambda ss: ss[0].cfg.size)
    small = Problem(p.workload, p.cost, _head(p.trace, requests), p.slo_s)
    _check_fits(p, slot_sets)
    # the smallest groups every model fits; else the smallest ones (models too large go unserved)
    slots = next(
        (ss for ss in slot_sets if all(any(small.fits(m, s.cfg) for s in ss) for m in range(len(p.models)))),
        slot_sets[0],
    )
    hosts = _Greedy(small, slots).run()
    return _placement("selective-replication", p, slots, hosts, _score(p, slots, hosts), time.monotonic() - t0)


def one_model_per_group(p: Problem) -> Placement:
    """Equal groups, as many as models if the devices allow (else fewer: the least loaded models go
    unserved); the busiest models first, each on the configuration of its group that serves it best."""
    t0 = time.monotonic()
    n, k = p.cost.cluster.num_devices, len(p.models)
    load = [
        float((p.trace.model == m).sum()) * sum(p.times(m, Config(p.cost.cluster.nodes[0].device_kind, 1, 1))[0])
        for m in range(k)
    ]
    order = sorted(range(k), key=lambda m: -load[m])
    for size in range(max(1, n // k), 0, -1):  # the largest equal groups that give each model one
        parts = partition(p.cost, size)
        if parts is None:
            continue
        slots: list[Slot] = []
        hosts: list[list[int]] = []
        queue = list(order)
        for d, kind, per_node in parts:
            placed = False
            for m in list(queue):
                opts = [Config(kind, pp, tp) for pp, tp in configs(size, per_node) if p.fits(m, Config(kind, pp, tp))]
                if not opts:
                    continue
                best = max(opts, key=lambda c: p.run([c], [[m]], p.sub_trace([m])).good().sum())
                slots.append(Slot(d, best))
                hosts.append([m])
                queue.remove(m)
                placed = True
                break
            if not placed:
                pp, tp = configs(size, per_node)[0]
                slots.append(Slot(d, Config(kind, pp, tp)))
                hosts.append([])
        if len(queue) < k:
            return _placement("one-model-per-group", p, slots, hosts, _score(p, slots, hosts), time.monotonic() - t0)
    _check_fits(p, candidate_slots(p))
    raise MeshplanError("models", len(p.models), "no equal partition of this cluster fits any model alone")


def simulate_placement(pl: Placement, cost: ServeCost, trace: Trace, overhead_s: float = 0.0) -> SimResult:
    """Serve `trace` on a placement (SLOs resolved against `cost`'s cluster)."""
    w = Workload(
        name="placement",
        models=pl.models,
        duration_s=min(max(trace.duration_s, 1e-9), MAX_TRACE_S),
        max_batch=pl.max_batch,
        dtype=pl.dtype,
    )
    p = Problem(w, cost, trace, resolve_slos(w, cost))
    idx = {m.name: i for i, m in enumerate(pl.models)}
    return p.run(
        [pl.config(g) for g in pl.groups], [[idx[n] for n in g.models] for g in pl.groups], overhead_s=overhead_s
    )


def replay_placement(
    pl: Placement, cost: ServeCost, trace: Trace, measured: dict[int, Measured], seeds: int = 15
) -> list[dict]:
    """Serve `trace` on a placement as its ranks ran it: groups with `measured` samples draw each
    request's times from them and serve one request at a time (the runtime does not batch); per
    model, the median figures over `seeds` runs (simulate.replicate)."""
    w = Workload(
        name="placement", models=pl.models, duration_s=min(max(trace.duration_s, 1e-9), MAX_TRACE_S), dtype=pl.dtype
    )
    p = Problem(w, cost, trace, resolve_slos(w, cost))
    idx = {m.name: i for i, m in enumerate(pl.models)}
    groups, routes = [], {}
    for gi, g in enumerate(pl.groups):
        hosted = [idx[n] for n in g.models]
        times = {m: p.times(m, pl.config(g)) for m in hosted}
        meas = measured.get(gi)
        if meas is not None:
            missing = [m for m in hosted if m not in meas.idle.work and m not in meas.queued.work]
            if missing:  # a model the group served no request of: its calibrated stage times
                work = dict(meas.idle.work) | {m: [np.array([t]) for t in times[m][0]] for m in missing}
                meas = dataclasses.replace(meas, idle=dataclasses.replace(meas.idle, work=work))
            # the routing backlog prices a request at its mean measured first-stage work
            times = {m: [tuple(float(np.mean(x)) for x in meas.service(m, False).work[m])] for m in hosted}
        groups.append(SimGroup(g.pp, times, 1, measured=meas))
        for m in hosted:
            routes.setdefault(m, []).append(gi)
    return replicate(groups, routes, trace, p.slo_s, [m.name for m in pl.models], seeds)


def check_placement(pl: Placement, cost: ServeCost) -> None:
    """A placement file must fit: known models, devices of the cluster, each device's memory."""
    names = {m.name: m for m in pl.models}
    n = cost.cluster.num_devices
    seen: set[int] = set()
    for i, g in enumerate(pl.groups):
        if len(g.devices) != g.pp * g.tp:
            raise MeshplanError(f"groups[{i}].devices", list(g.devices), f"needs pp×tp = {g.pp * g.tp} devices")
        for d in g.devices:
            if not 0 <= d < n or d in seen:
                raise MeshplanError(f"groups[{i}].devices", d, f"device ids must be distinct and in 0..{n - 1}")
            seen.add(d)
        used = 0.0
        for name in g.models:
            if name not in names:
                raise MeshplanError(
                    f"groups[{i}].models", name, f"not a model of the placement; one of {', '.join(names)}"
                )
            cfg = pl.config(g)
            if not cost.supports(names[name].spec, cfg):
                raise MeshplanError(
                    f"groups[{i}].tp", g.tp, f"{name} cannot be split {g.pp}×{g.tp}; use a tp dividing its heads"
                )
            used += cost.weight_bytes(names[name].spec, cfg)
        cap = cost.capacity_bytes(g.kind)
        if used > cap:
            raise MeshplanError(
                f"groups[{i}].models",
                list(g.models),
                f"weights need {used / 2**30:.2f} GiB per device, a {g.kind} gives {cap / 2**30:.2f} GiB; "
                "host fewer models on this group or raise its pp×tp",
            )
