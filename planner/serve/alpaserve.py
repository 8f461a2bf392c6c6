"""AlpaServe's placement algorithms (Li et al., OSDI'23 §4.3), as baselines for meshplan's search.

- `alpaserve_greedy`: its model-parallel greedy on uniform groups — every equal partition of the
  cluster × every pp × tp of the group, each filled by its fast greedy replica placement
  (placement.fast_greedy: simulate, add a replica of the most-unserved model to the least loaded
  group with room, until memory is full), the best on the planning trace kept.
- `alpaserve_search`: its group-partition and parallel-configuration search (Algorithm 2): models
  are split into buckets of similar size (contiguous in size order: all in one, or cut between
  size classes), the devices split among the buckets, and each bucket's devices cut into equal
  groups of the pp × tp that serves its models best under the fast greedy; the best combination on
  the planning trace kept.
- `selective_replication`: Clockwork-style selective replication as AlpaServe evaluates it — no
  model parallelism, one device per group, replicas by the same fast greedy.

Each plans on the trace it is given (AlpaServe draws a long planning trace from the models' rates
and CVs); placement.search is meshplan's.
"""

from __future__ import annotations

import itertools
import time

from planner.serve.cost import Config
from planner.serve.placement import (
    Evaluator,
    Placement,
    Problem,
    Slot,
    _check_fits,
    _placement,
    _score,
    candidate_slots,
    configs,
    fast_greedy,
)


def _best_uniform(p: Problem, slot_sets: list[list[Slot]]) -> tuple[int, list[Slot], list[list[int]]]:
    best: tuple[int, list[Slot], list[list[int]]] | None = None
    for slots in slot_sets:
        ev = Evaluator(p, slots)
        hosts = fast_greedy(p, slots, ev=ev)
        good = int(ev(hosts)[0].sum())
        if best is None or good > best[0]:
            best = (good, slots, hosts)
    assert best is not None
    return best


def alpaserve_greedy(p: Problem, train: Problem | None = None) -> Placement:
    """Uniform groups, every configuration, fast greedy replicas; planned on `train` (default `p`),
    scored on `p`."""
    t0 = time.monotonic()
    train = train or p
    slot_sets = candidate_slots(train)
    _check_fits(train, slot_sets)
    _, slots, hosts = _best_uniform(train, slot_sets)
    took = time.monotonic() - t0
    return _placement("alpaserve-greedy", p, slots, hosts, _score(p, slots, hosts), took)


def selective_replication(p: Problem, train: Problem | None = None) -> Placement:
    """One device per group, replicas by the fast greedy (models too large for a device go unserved)."""
    t0 = time.monotonic()
    train = train or p
    slot_sets = [ss for ss in candidate_slots(train, pp_allowed=False) if ss[0].cfg.size == 1]
    _check_fits(train, candidate_slots(train))
    slots = slot_sets[0]
    hosts = fast_greedy(train, slots)
    took = time.monotonic() - t0
    return _placement("selective-replication", p, slots, hosts, _score(p, slots, hosts), took)


def _buckets(p: Problem) -> list[list[list[int]]]:
    """Ways to cut the models, in size order, into contiguous buckets between size classes."""
    sizes = sorted({m.spec.num_params() for m in p.models})
    classes = [[i for i, m in enumerate(p.models) if m.spec.num_params() == s] for s in sizes]
    out = []
    for cuts in itertools.product((False, True), repeat=len(classes) - 1):
        buckets, cur = [], list(classes[0])
        for cut, nxt in zip(cuts, classes[1:], strict=True):
            if cut:
                buckets.append(cur)
                cur = []
            cur = cur + nxt
        out.append(buckets + [cur])
    return out


def _splits(n: int, k: int) -> list[tuple[int, ...]]:
    """Ordered splits of n devices into k positive parts."""
    return [c for c in itertools.product(range(1, n + 1), repeat=k) if sum(c) == n]


def alpaserve_search(p: Problem, train: Problem | None = None) -> Placement:
    """AlpaServe's Algorithm 2 on a single node group (module docstring); falls back to the greedy
    on clusters of several node groups."""
    t0 = time.monotonic()
    train = train or p
    nodes = train.cost.cluster.nodes
    if len(nodes) != 1:
        pl = alpaserve_greedy(p, train)
        return pl.model_copy(update={"method": "alpaserve-search", "search_s": time.monotonic() - t0})
    _check_fits(train, candidate_slots(train))
    node = nodes[0]
    n, kind, per_node = train.cost.cluster.num_devices, node.device_kind, node.num_devices
    memo: dict[tuple[tuple[int, ...], int], tuple[int, list[Config], list[list[int]]]] = {}

    def bucket_best(models: list[int], devices: int) -> tuple[int, list[Config], list[list[int]]]:
        key = (tuple(models), devices)
        if key in memo:
            return memo[key]
        sub = Problem(train.workload, train.cost, train.sub_trace(models), train.slo_s)
        best: tuple[int, list[Config], list[list[int]]] = (-1, [], [])
        for size in range(1, devices + 1):
            if devices % size or (size > per_node and size % per_node):
                continue
            for pp, tp in configs(size, per_node):
                cfg = Config(kind, pp, tp)
                if not all(sub.fits(m, cfg) for m in models):
                    continue
                slots = [Slot((), cfg) for _ in range(devices // size)]
                ev = Evaluator(sub, slots)
                hosts = fast_greedy(sub, slots, ev=ev, only=models)
                good = int(ev(hosts)[0].sum())
                if good > best[0]:
                    best = (good, [cfg] * len(slots), hosts)
        memo[key] = best
        return best

    best: tuple[int, list[Config], list[list[int]]] | None = None
    for buckets in _buckets(train):
        for split in _splits(n, len(buckets)):
            parts = [bucket_best(b, d) for b, d in zip(buckets, split, strict=True)]
            if any(good < 0 for good, _, _ in parts):
                continue
            good = sum(g for g, _, _ in parts)
            if best is None or good > best[0]:
                best = (good, [c for _, cs, _ in parts for c in cs], [h for _, _, hs in parts for h in hs])
    if best is None:
        pl = alpaserve_greedy(p, train)
        return pl.model_copy(update={"method": "alpaserve-search", "search_s": time.monotonic() - t0})
    _, cfgs, hosts = best
    slots, d = [], 0
    for c in cfgs:
        slots.append(Slot(tuple(range(d, d + c.size)), c))
        d += c.size
    took = time.monotonic() - t0
    return _placement("alpaserve-search", p, slots, hosts, _score(p, slots, hosts), took)
