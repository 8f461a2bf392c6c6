"""Placement search: which groups, which parallel configuration each, which models each hosts.

meshplan's search (`search`) starts from AlpaServe's (Li et al., OSDI'23 §4.3): partitions of the
cluster into groups, each group's configuration (pp stages × tp ranks on its device kind), and
replicas placed by AlpaServe's fast greedy (simulate; a replica of the model losing the most
requests onto the least loaded group with room; until memory is full). It plans against a sampled
trace of at least a few thousand requests (`planning_problem`: a burst of one short sample must not
decide the placement), fills every equal partition × configuration on it (a latency bound skips
configurations that cannot win), adds partitions giving the large models groups of their own
configuration (`mixed_slots`, filled bucket by bucket as AlpaServe's search does: `bucket_fill`),
moves replicas towards the models that lose requests (`improve`), fills memory while the planning
trace does not lose (`fill`), gives every model that fits a replica (`serve_everyone`), and chooses
among its finalists on held-in traces it never planned on (`held_in_problem`). Simulation is
incremental (`Evaluator`): a placement is simulated component by component (groups joined by a
shared model), memoised by the component's canonical key — (config, hosted models) per group, groups
interchangeable — so a step re-simulates only the component it touches.

AlpaServe's own algorithms (its model-parallel greedy, its group-partition search, selective
replication) are in planner/serve/alpaserve.py, as baselines; `selective_replication` and
`one_model_per_group` below are the older marginal-gain baselines `serve-plan` prints.
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
from planner.serve.simulate import Measured, SimGroup, SimResult, replicate, simulate_within
from planner.serve.workload import ServedModel, Trace, Workload, make_trace

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
    unserved: tuple[str, ...] = ()  # models left without a replica: none of this partition's groups fits them

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
        r = self.run_within(cfgs, hosts, trace, overhead_s, None)
        assert r is not None
        return r

    def run_within(
        self,
        cfgs: list[Config],
        hosts: list[list[int]],
        trace: Trace | None = None,
        overhead_s: float = 0.0,
        max_dropped: int | None = None,
    ) -> SimResult | None:
        """`run`; None once more than `max_dropped` requests are dropped (simulate.simulate_within)."""
        groups = [
            SimGroup(
                c.pp, {m: self.times(m, c) for m in h}, self.workload.max_batch, overhead_s + self.cost.reply_s(c.kind)
            )
            for c, h in zip(cfgs, hosts, strict=True)
        ]
        routes: dict[int, list[int]] = {}
        for gi, h in enumerate(hosts):
            for m in h:
                routes.setdefault(m, []).append(gi)
        return simulate_within(groups, routes, trace if trace is not None else self.trace, self.slo_s, max_dropped)


def single_device_latency(problem_cost: ServeCost, sm: ServedModel, kind: str) -> float:
    """A request's latency alone on one device: its stage time (front end included) and the reply."""
    return sum(problem_cost.stage_times(sm.name, sm.spec, Config(kind, 1, 1), sm.batch, sm.tokens)) + (
        problem_cost.reply_s(kind)
    )


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


class Evaluator:
    """Good requests per model and load per group of a placement on `p`'s trace, simulated component
    by component (groups joined by a shared model; the others cannot change each other's requests)
    and memoised by each component's canonical key — (config, hosted models) per group, groups of one
    key interchangeable — so a step that adds or moves a replica re-simulates only the component it
    touches (incremental simulation); `sims` counts the simulations run."""

    def __init__(self, p: Problem, slots: list[Slot], cache: dict | None = None) -> None:
        self.p, self.slots = p, slots
        # shareable between evaluators of one search whose problems give each model the same requests
        # (a trace and its sub-traces): a key names configs and models only, not slots
        self.cache: dict[tuple, tuple[dict[int, int], list[float]]] = {} if cache is None else cache
        self.upper: dict[tuple, int] = {}  # good requests a stopped component is known not to exceed
        self.sims = 0
        self.requests = np.bincount(p.trace.model, minlength=len(p.models))

    def components(self, hosts: list[list[int]]) -> list[list[int]]:
        """Groups hosting something, split into the components of the model–group graph."""
        parent = list(range(len(hosts)))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        first: dict[int, int] = {}
        for g, h in enumerate(hosts):
            for m in h:
                if m in first:
                    parent[find(g)] = find(first[m])
                else:
                    first[m] = g
        comps: dict[int, list[int]] = {}
        for g, h in enumerate(hosts):
            if h:
                comps.setdefault(find(g), []).append(g)
        return list(comps.values())

    def _key(self, groups: list[int], hosts: list[list[int]]) -> tuple[list[int], tuple]:
        keyed = sorted(
            groups, key=lambda g: (self.slots[g].cfg.kind, self.slots[g].cfg.pp, self.slots[g].cfg.tp, sorted(hosts[g]))
        )
        key = tuple(
            (self.slots[g].cfg.kind, self.slots[g].cfg.pp, self.slots[g].cfg.tp, tuple(sorted(hosts[g]))) for g in keyed
        )
        return keyed, key

    def _component(self, groups: list[int], hosts: list[list[int]]) -> tuple[dict[int, int], list[float]]:
        keyed, key = self._key(groups, hosts)
        hit = self.cache.get(key)
        if hit is None:
            models = sorted({m for g in groups for m in hosts[g]})
            self.sims += 1
            r = self.p.run(
                [self.slots[g].cfg for g in keyed], [sorted(hosts[g]) for g in keyed], self.p.sub_trace(models)
            )
            good = r.good()
            hit = ({m: int(good[r.model == m].sum()) for m in models}, list(r.group_busy_s))
            self.cache[key] = hit
        good_m, busy = hit
        return good_m, [busy[keyed.index(g)] for g in groups]

    def at_least(self, hosts: list[list[int]], target: int) -> int | None:
        """Good requests of `hosts` when ≥ `target`, else None: cached components first, the others
        simulated with a drop budget (each assumed to serve all its requests but what the budget
        allows) and stopped once they cannot reach `target` — a stopped run is not cached."""
        if self.p.workload.max_batch != 1:
            total = int(self(hosts)[0].sum())
            return total if total >= target else None
        comps = self.components(hosts)
        total, todo = 0, []
        for comp in comps:
            hit = self.cache.get(self._key(comp, hosts)[1])
            if hit is None:
                todo.append(comp)
            else:
                total += sum(hit[0].values())
        routed = [int(sum(self.requests[m] for m in {m for g in comp for m in hosts[g]})) for comp in todo]
        # a component stopped before is known to serve no more than `upper`
        optimistic = total + sum(
            min(n, self.upper.get(self._key(c, hosts)[1], n)) for c, n in zip(todo, routed, strict=True)
        )
        for comp, n in zip(todo, routed, strict=True):
            keyed, key = self._key(comp, hosts)
            n_opt = min(n, self.upper.get(key, n))
            budget = optimistic - target + n - n_opt  # drops this component may have and still reach the target
            if optimistic < target or budget < 0:
                return None
            models = sorted({m for g in comp for m in hosts[g]})
            self.sims += 1
            r = self.p.run_within(
                [self.slots[g].cfg for g in keyed],
                [sorted(hosts[g]) for g in keyed],
                self.p.sub_trace(models),
                0.0,
                budget,
            )
            if r is None:
                self.upper[key] = min(self.upper.get(key, n), n - budget - 1)
                return None
            good = r.good()
            self.cache[key] = ({m: int(good[r.model == m].sum()) for m in models}, list(r.group_busy_s))
            optimistic -= n_opt - int(good.sum())
        return optimistic if optimistic >= target else None

    def __call__(self, hosts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """(good requests per model, first-stage busy seconds per group)."""
        good = np.zeros(len(self.p.models), dtype=np.int64)
        busy = np.zeros(len(hosts))
        for comp in self.components(hosts):
            gm, b = self._component(comp, hosts)
            for m, v in gm.items():
                good[m] = v
            busy[comp] = b
        return good, busy


def _weights(p: Problem, slots: list[Slot]) -> tuple[dict[tuple[int, int], float], list[float]]:
    """Per (model, group) that can host it, the model's bytes on the group's busiest device; each group's capacity."""
    weight = {
        (m, g): p.cost.weight_bytes(p.models[m].spec, s.cfg)
        for m in range(len(p.models))
        for g, s in enumerate(slots)
        if p.fits(m, s.cfg)
    }
    return weight, [p.cost.capacity_bytes(s.cfg.kind) for s in slots]


def fast_greedy(
    p: Problem,
    slots: list[Slot],
    hosts: list[list[int]] | None = None,
    ev: Evaluator | None = None,
    only: list[int] | None = None,
) -> list[list[int]]:
    """AlpaServe's fast replica placement (Li et al., OSDI'23 §4.3, its "fast greedy"): simulate,
    then add a replica of the model with the most requests unserved to the least loaded group that
    has room for it (not hosting it yet), and again, until no model fits anywhere — memory is filled
    whatever the marginal gain. One (incremental) simulation per replica; load here is the group's
    first-stage busy seconds (AlpaServe counts its requests). `only`: place these models only."""
    ev = ev or Evaluator(p, slots)
    weight, cap = _weights(p, slots)
    hosts = [list(h) for h in hosts] if hosts is not None else [[] for _ in slots]
    used = [sum(weight[(m, g)] for m in h) for g, h in enumerate(hosts)]
    pool = list(range(len(p.models))) if only is None else list(only)
    while True:
        if not any(
            m not in hosts[g] and used[g] + weight[(m, g)] <= cap[g]
            for m in pool
            for g in range(len(slots))
            if (m, g) in weight
        ):
            return hosts  # memory full: no simulation needed to know it (the caller may not need one)
        good, busy = ev(hosts)
        unserved = ev.requests - good
        models = sorted(pool, key=lambda m: (-unserved[m], m))
        pick = None
        for g in sorted(range(len(slots)), key=lambda g: (busy[g], g)):
            for m in models:
                w = weight.get((m, g))
                if w is not None and m not in hosts[g] and used[g] + w <= cap[g]:
                    pick = (m, g)
                    break
            if pick:
                break
        if pick is None:
            return hosts
        m, g = pick
        hosts[g].append(m)
        used[g] += weight[(m, g)]


def fill(p: Problem, slots: list[Slot], hosts: list[list[int]], ev: Evaluator) -> list[list[int]]:
    """Add replicas while memory allows and the gain on the planning trace is ≥ 0: the model with the
    most requests unserved first, each on the group with room where it gains most (the least loaded
    one on ties); a model all of whose requests are met takes spare memory too (a zero gain is
    accepted: on an unseen trace a spare replica absorbs bursts the planning one did not have)."""
    weight, cap = _weights(p, slots)
    hosts = [list(h) for h in hosts]
    used = [sum(weight[(m, g)] for m in h) for g, h in enumerate(hosts)]
    while True:
        good, busy = ev(hosts)
        unserved = ev.requests - good
        base = int(good.sum())
        placed = False
        for m in sorted(range(len(p.models)), key=lambda m: (-unserved[m], m)):
            opts = [
                g
                for g in range(len(slots))
                if (m, g) in weight and m not in hosts[g] and used[g] + weight[(m, g)] <= cap[g]
            ]
            best = None
            for g in sorted(opts, key=lambda g: (busy[g], g)):
                hosts[g].append(m)  # kept when it gains ≥ 0 and more than the best so far: others stop early
                got = ev.at_least(hosts, base if best is None else base + best[0] + 1)
                hosts[g].pop()
                if got is not None:
                    best = (got - base, g)
                if unserved[m] == 0:  # nothing to gain: the least loaded group that does not lose
                    if best is not None:
                        break
            if best is not None:
                hosts[best[1]].append(m)
                used[best[1]] += weight[(m, best[1])]
                placed = True
                break
        if not placed:
            return hosts


def serve_everyone(p: Problem, slots: list[Slot], hosts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Give a replica to every model that has none and fits a group of `slots`: into free memory, else
    in place of replicas of models that keep another replica (the most replicated first). Returns the
    hosts and the models still unserved (none of these groups can hold them)."""
    weight, cap = _weights(p, slots)
    hosts = [list(h) for h in hosts]
    left = []
    for m in range(len(p.models)):
        if any(m in h for h in hosts):
            continue
        done = False
        for g in sorted(
            (g for g in range(len(slots)) if (m, g) in weight), key=lambda g: sum(weight[(x, g)] for x in hosts[g])
        ):
            keep = list(hosts[g])
            used = sum(weight[(x, g)] for x in keep)
            count = {x: sum(x in h for h in hosts) for x in keep}
            evict = sorted((x for x in keep if count[x] > 1), key=lambda x: (-count[x], -weight[(x, g)]))
            while used + weight[(m, g)] > cap[g] and evict:
                x = evict.pop(0)
                keep.remove(x)
                used -= weight[(x, g)]
            if used + weight[(m, g)] <= cap[g]:
                hosts[g] = keep + [m]
                done = True
                break
        if not done:
            left.append(m)
    return hosts, left


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


def planning_problem(p: Problem, min_requests: int = 4000) -> Problem:
    """What meshplan plans against: `p`'s trace when it has ≥ `min_requests` requests or its models'
    traffic is not all given by rates (a CSV trace); else `p`'s trace followed by more traces drawn
    from the same rates and CVs with seeds the scored trace did not use, until ≥ `min_requests` —
    so a burst of the one sample does not decide the placement (the top percentiles settle)."""
    w = p.workload
    if len(p.trace) >= min_requests or not all(m.rate > 0 for m in w.models):
        return p
    return Problem(w, p.cost, _drawn(p, min_requests, 1, p.trace), p.slo_s)


def held_in_problem(p: Problem, min_requests: int = 4000) -> Problem | None:
    """Traces the search does not plan on, to choose among its finished candidates: drawn from `p`'s
    rates and CVs with seeds neither `p`'s trace nor `planning_problem` uses (≥ `min_requests`
    requests, several traces joined end to end); None for a CSV trace (no rates to draw from)."""
    w = p.workload
    if not all(m.rate > 0 for m in w.models):
        return None
    return Problem(w, p.cost, _drawn(p, min_requests, 65), p.slo_s)


def _drawn(p: Problem, min_requests: int, first: int, start: Trace | None = None) -> Trace:
    """`start` (or nothing) followed by traces of `p`'s workload drawn with seeds seed + 7919·k,
    k = first, first + 1, …, until `min_requests` requests (the last trace cut to its head; 64 traces
    at most)."""
    w = p.workload
    times = [start.arrival_s] if start is not None else []
    models = [start.model] if start is not None else []
    t_end = start.duration_s if start is not None else 0.0
    total = len(start) if start is not None else 0
    k = first - 1
    while total < min_requests and k < first + 63:
        k += 1
        extra = make_trace(w.model_copy(update={"seed": w.seed + 7919 * k}))
        if total + len(extra) > min_requests:  # the last one's head: no more than needed
            extra = _head(extra, min_requests - total)
        times.append(extra.arrival_s + t_end)
        models.append(extra.model)
        t_end += extra.duration_s
        total += len(extra)
    return Trace(np.concatenate(times), np.concatenate(models), t_end)


def latency_bound(p: Problem, slots: list[Slot]) -> int:
    """Requests that could meet their SLO on these groups at all: those of models that fit a group on
    which they alone, with no queue, finish within the SLO — no placement on `slots` does better."""
    kinds = {s.cfg for s in slots}
    ok = [
        any(p.fits(m, c) and sum(p.times(m, c)[0]) + p.cost.reply_s(c.kind) <= p.slo_s[m] + 1e-12 for c in kinds)
        for m in range(len(p.models))
    ]
    return int(np.bincount(p.trace.model, minlength=len(p.models))[np.array(ok, dtype=bool)].sum())


def improve(p: Problem, slots: list[Slot], hosts: list[list[int]], ev: Evaluator, tries: int) -> list[list[int]]:
    """Local search from a filled placement: replace a replica of a model that has another and loses
    few requests by one of the model losing the most, where memory allows, keep it when the planning
    trace gains, and refill the memory it frees (fast_greedy). The model losing the most first; a
    candidate is skipped without simulation when the requests it could win (the model's unserved
    ones) cannot beat what the evicted model has to lose — a bound, not a guess. Stops after `tries`
    simulated moves without a gain."""
    weight, cap = _weights(p, slots)
    hosts = [list(h) for h in hosts]
    good, _ = ev(hosts)
    best = int(good.sum())
    misses = 0
    while misses < tries:
        unserved = ev.requests - good
        count = np.zeros(len(p.models), dtype=np.int64)
        for h in hosts:
            for m in h:
                count[m] += 1
        moved = False
        for m_in in sorted(range(len(p.models)), key=lambda m: -unserved[m]):
            if unserved[m_in] == 0 or misses >= tries:
                break
            for g in range(len(slots)):
                if m_in in hosts[g] or (m_in, g) not in weight:
                    continue
                used = sum(weight[(x, g)] for x in hosts[g])
                for x in sorted((x for x in hosts[g] if count[x] > 1), key=lambda x: unserved[x]):
                    if used - weight[(x, g)] + weight[(m_in, g)] > cap[g]:
                        continue
                    trial = [list(h) for h in hosts]
                    trial[g] = [y for y in trial[g] if y != x] + [m_in]
                    trial = fast_greedy(p, slots, trial, ev)
                    if ev.at_least(trial, best + 1) is not None:  # a loser stops early
                        t_good, _ = ev(trial)
                        hosts, good, best, moved = trial, t_good, int(t_good.sum()), True
                        break
                    misses += 1
                    if misses >= tries:
                        break
                if moved or misses >= tries:
                    break
            if moved or misses >= tries:
                break
        if not moved:
            break
    return hosts


def mixed_slots(
    p: Problem, screen: Problem, shapes: set[tuple[int, int]] | None = None, cache: dict | None = None
) -> list[tuple[int, list[Slot], list[tuple[list[int], list[int]]]]]:
    """Partitions mixing configurations, on a cluster of one node group: the models cut by size into
    a small and a large bucket (at each size-class boundary), the devices split between them by
    their load (Σ requests × single-device seconds, rounded), each bucket's devices cut into the
    equal groups and pp × tp (among `shapes`, default all) that serve its models best under the fast
    greedy on `screen`. Returns (screened good requests, slots, buckets: (models, slot indices) each)
    per candidate — AlpaServe's bucketed search (planner/serve/alpaserve.py) restricted to the splits
    the load points at; `bucket_fill` places its replicas as that search does, bucket by bucket."""
    nodes = p.cost.cluster.nodes
    if len(nodes) != 1 or len(p.models) < 2:
        return []
    node = nodes[0]
    n, kind, per_node = p.cost.cluster.num_devices, node.device_kind, node.num_devices
    sizes = sorted({m.spec.num_params() for m in p.models})
    reqs = np.bincount(screen.trace.model, minlength=len(p.models))
    load = [
        reqs[m] * sum(p.times(m, Config(kind, 1, 1))[0]) if p.fits(m, Config(kind, 1, 1)) else reqs[m] * 1e9
        for m in range(len(p.models))
    ]
    memo: dict[tuple[tuple[int, ...], int], tuple[int, Config | None]] = {}

    def best(models: list[int], d: int) -> tuple[int, Config | None]:
        key = (tuple(models), d)
        if key not in memo:
            out: tuple[int, Config | None] = (-1, None)
            sub = Problem(screen.workload, screen.cost, screen.sub_trace(models), screen.slo_s)
            for size in range(1, d + 1):
                if d % size or (size > per_node and size % per_node):
                    continue
                for pp, tp in configs(size, per_node):
                    cfg = Config(kind, pp, tp)
                    if (shapes is not None and (pp, tp) not in shapes) or not all(sub.fits(m, cfg) for m in models):
                        continue
                    slots = [Slot((), cfg) for _ in range(d // size)]
                    ev = Evaluator(sub, slots, cache)
                    good = int(ev(fast_greedy(sub, slots, ev=ev, only=models))[0].sum())
                    if good > out[0]:
                        out = (good, cfg)
            memo[key] = out
        return memo[key]

    out = []
    for cut in sizes[1:]:
        small = [m for m in range(len(p.models)) if p.models[m].spec.num_params() < cut]
        large = [m for m in range(len(p.models)) if p.models[m].spec.num_params() >= cut]
        share = sum(load[m] for m in large) / max(sum(load), 1e-12)
        d0 = int(round(share * n))
        # the cut that isolates the largest models: one device either way too (the load share is the
        # planning trace's; its best split may round the other way)
        for d in sorted({d0, d0 - 1, d0 + 1} if cut == sizes[-1] else {d0}):
            if not 1 <= d <= n - 1:
                continue
            (gs, cs), (gl, cl) = best(small, n - d), best(large, d)
            if cs is None or cl is None:
                continue
            slots, at, buckets = [], 0, []
            for models, cfg, devs in ((small, cs, n - d), (large, cl, d)):
                idx = []
                for _ in range(devs // cfg.size):
                    idx.append(len(slots))
                    slots.append(Slot(tuple(range(at, at + cfg.size)), cfg))
                    at += cfg.size
                buckets.append((models, idx))
            out.append((gs + gl, slots, buckets))
    return out


def bucket_fill(
    p: Problem, slots: list[Slot], buckets: list[tuple[list[int], list[int]]], cache: dict | None = None
) -> list[list[int]]:
    """The fast greedy per bucket: each bucket's models on its own groups only, on their requests
    (AlpaServe's bucketed placement: the small models do not crowd the large ones' groups). `cache`:
    an Evaluator cache of `p`'s trace (a bucket's sub-trace gives its models the same requests)."""
    hosts: list[list[int]] = [[] for _ in slots]
    for models, idx in buckets:
        sub = Problem(p.workload, p.cost, p.sub_trace(models), p.slo_s)
        sl = [slots[g] for g in idx]
        for g, h in zip(idx, fast_greedy(sub, sl, ev=Evaluator(sub, sl, cache), only=models), strict=True):
            hosts[g] = h
    return hosts


def search(
    p: Problem,
    screen_share: float = 1.0,
    finalists: int = 2,
    tries: int = 8,
    plan_requests: int = 4000,
    mixed_share: float = 0.5,
    mixed_finalists: int = 2,
    held_in: int = 3,
) -> Placement:
    """meshplan's placement. Plans against `planning_problem(p)` (several sampled traces unless `p`'s
    is long enough) and scores the result on `p`'s trace:

    1. every equal partition × pp × tp is filled by AlpaServe's fast greedy (memory filled) on the
       planning trace (the first `screen_share` of it, when < 1), in order of `latency_bound`,
       skipping a configuration whose bound is below the best result so far (it cannot win); the
       `mixed_slots` partitions (small and large models on groups of their own configuration) are
       screened on its first `mixed_share`;
    2. the `finalists` best, and the `mixed_finalists` best mixed partitions (isolating the large
       models) filled bucket by bucket on the whole planning trace, then `fill`ed; for the best,
    3. `improve` moves replicas towards the models that lose requests (incremental simulation: only
       the components a move touches are simulated again; bounded candidates skipped), refilling
       freed memory, and `fill` adds replicas while memory allows and the planning trace does not lose;
    4. the improved placement and the finalists' plain fills, each after `serve_everyone` (any model
       left out gets a replica where one fits; Placement.unserved names those that fit no group), are
       scored on held-in traces (`held_in_problem`: `held_in` × `plan_requests` requests drawn with
       seeds the planning never used) and the best kept."""
    t0 = time.monotonic()
    plan = planning_problem(p, plan_requests)
    slot_sets = candidate_slots(plan)
    _check_fits(plan, slot_sets)
    screen = (
        plan
        if screen_share >= 1
        else Problem(
            plan.workload, plan.cost, _head(plan.trace, max(200, int(len(plan.trace) * screen_share))), plan.slo_s
        )
    )
    bounds = [latency_bound(screen, slots) for slots in slot_sets]
    # one simulation cache per trace, shared by every evaluator on it (and on its sub-traces)
    plan_cache: dict = {}
    screen_cache = plan_cache if screen is plan else {}
    # (good requests on the screen, order, slots, hosts, evaluator)
    ranked: list[tuple[int, int, list[Slot], list[list[int]] | None, Evaluator | None]] = []
    for i in sorted(range(len(slot_sets)), key=lambda i: -bounds[i]):
        if ranked and bounds[i] < max(r[0] for r in ranked):
            continue  # cannot beat what is already screened
        slots = slot_sets[i]
        ev = Evaluator(screen, slots, screen_cache)
        hosts = fast_greedy(screen, slots, ev=ev)
        ranked.append((int(ev(hosts)[0].sum()), -i, slots, hosts, ev))
    ranked.sort(key=lambda r: (r[0], r[1]), reverse=True)
    shapes = {(r[2][0].cfg.pp, r[2][0].cfg.tp) for r in ranked[:4]}  # the best screened shapes
    # partitions mixing configurations, screened on the planning trace's head (`mixed_share`)
    head = Problem(
        plan.workload, plan.cost, _head(plan.trace, max(200, int(len(plan.trace) * mixed_share))), plan.slo_s
    )
    mixed = mixed_slots(plan, head, shapes, plan_cache if head.trace is plan.trace else {})
    buckets = {-len(slot_sets) - j: b for j, (_, _, b) in enumerate(mixed)}
    ranked += [(good, -len(slot_sets) - j, slots, None, None) for j, (good, slots, _) in enumerate(mixed)]
    ranked.sort(key=lambda r: (r[0], r[1]), reverse=True)
    # the finalists: the best screened uniform and mixed partitions, each filled by the fast greedy on
    # the whole planning trace (the screen's fill reused when the screen is the whole trace); the
    # best of them improved and filled again
    picks = ranked[:finalists]
    # the partitions isolating the large models always reach the final (their screen is a head)
    picks += [r for r in ranked if r[1] <= -len(slot_sets) and r not in picks][:mixed_finalists]
    done: list[tuple[int, list[Slot], list[list[int]], Evaluator]] = []
    for good, order, slots, hosts, ev in picks:
        if hosts is None or ev is None or screen is not plan:
            ev = Evaluator(plan, slots, plan_cache)
            if order in buckets:  # bucket by bucket, then the memory a bucket left where the plan gains
                hosts = fill(plan, slots, bucket_fill(plan, slots, buckets[order], plan_cache), ev)
            else:
                hosts = fast_greedy(plan, slots, ev=ev)
            good = int(ev(hosts)[0].sum())
        done.append((good, slots, hosts, ev))
    done.sort(key=lambda d: -d[0])
    _, slots, hosts, ev = done[0]
    hosts = improve(plan, slots, hosts, ev, tries)
    hosts = fill(plan, slots, hosts, ev)
    finals = [(slots, hosts)] + [(s, h) for _, s, h, _ in done]
    # choose on held-in traces the search never planned on (a gain on the planning trace may be its
    # own bursts: the finalists' plain fills generalise differently from the improved one)
    held = held_in_problem(p, held_in * plan_requests)
    scored = []
    top = -1  # a later finalist must beat the best so far (ties keep the earlier): losers stop early
    for j, (s, h) in enumerate(finals):
        h, left = serve_everyone(plan, s, h)
        if held is None:
            good = -j
        else:  # the whole placement (as before: the Evaluator's group order breaks routing ties otherwise)
            routed = int(np.isin(held.trace.model, sorted({m for x in h for m in x})).sum())
            r = held.run_within([x.cfg for x in s], h, max_dropped=routed - top - 1)
            good = -1 if r is None else int(r.good().sum())
            top = max(top, good)
        scored.append((good, -j, s, h, left))
    _, _, slots, hosts, left = max(scored, key=lambda x: (x[0], x[1]))
    pl = _placement("meshplan", p, slots, hosts, _score(p, slots, hosts), time.monotonic() - t0)
    return pl.model_copy(update={"unserved": tuple(p.models[m].name for m in left)})


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
