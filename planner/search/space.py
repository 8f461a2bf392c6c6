"""The outer search space: which shapes (device classes, order, tp, dp, stage counts) to try.

Tiny instances are enumerated exhaustively (every count ≤ 8, every stage count of a class of ≤ 8
devices), so the oracle and the fast search cover the same space. Beyond that, counts are sampled
geometrically (×1.5) plus their maximum, multi-class pipelines and kind-pure replicas use each
class fully (leaving devices idle is reached through subsets of classes and fewer replicas).
A stage's tp lives inside one node (tp divides devices per node), divides the attention heads and
divides the KV heads (Megatron-LM's rule; replicating KV heads for tp > kv is left to hand-written
plans). dp × tp is node-aligned (it divides, or is a multiple of, devices per node) so that every
replica sees the same links — the Megatron rank order tp → dp → pp inside each class.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations, permutations, product

from planner.search.classes import DeviceClass
from planner.specs.model import ModelSpec


@dataclass(frozen=True)
class SearchSpace:
    """Dimensions the search enumerates (tests shrink it so the oracle stays small)."""

    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    schedules: tuple[str, ...] = ("1f1b", "gpipe", "interleaved-1f1b")
    virtual_stages: tuple[int, ...] = (2,)
    shardings: tuple[str, ...] = ("none", "zero1", "zero2", "zero3")
    recompute: bool = True
    families: tuple[str, ...] = ("pipeline", "replicas")
    max_classes: int = 3
    tps: tuple[int, ...] = (1, 2, 4, 8, 16)
    exhaustive_below: int = 8
    # sequence parallelism on every GPU stage with tp > 1: it never costs more than plain tp in the
    # cost model (the all-reduce becomes a reduce-scatter + all-gather of the same bytes; norms,
    # residuals and their activations shrink to s/t), so on is the dominant value and off need not
    # be searched. Not on CPU ranks, whose calibration measured the runtime without it
    sequence_parallel: bool = True
    # full recompute of one block in every k on the recomputed stages (StagePlan.recompute_every);
    # 1 = every block. Each k > 1 is one more pass of the exact search, seeded with the best so far
    recompute_every: tuple[int, ...] = (1, 2)
    # fp8 linears (Plan.fp8), searched when every device class has an fp8 peak
    fp8: bool = False
    # context-parallel degrees (StagePlan.cp); cp > 1 searched only from seq ≥ cp_min_seq, or when no
    # plan without cp is feasible (planner.search.cp states the rule)
    context_parallel: tuple[int, ...] = (1, 2, 4, 8)
    cp_min_seq: int = 8192
    # only plans on exactly this many devices (None: any subset): `plan` after a multi-node discovery
    # plans on every discovered device, the nodes × ranks a node `train --executor slurm` launches
    num_devices: int | None = None


@dataclass(frozen=True, slots=True)
class Segment:
    cls: int
    stages: int
    tp: int


@dataclass(frozen=True, slots=True)
class Shape:
    """pipeline: every replica runs `segments` in order; replicas: replica groups per class, kind-pure."""

    family: str
    segments: tuple[Segment, ...]
    dp: int
    groups: tuple[tuple[int, int], ...] = ()  # replicas family: (class, replicas)

    @property
    def pp(self) -> int:
        return sum(s.stages for s in self.segments)

    @property
    def devices(self) -> int:
        """Devices the shape runs on (replicas: dp is the sum of the groups' replicas)."""
        return self.dp * sum(s.stages * s.tp for s in self.segments)


def count_options(nmax: int, exhaustive_below: int = 8) -> list[int]:
    if nmax <= exhaustive_below:
        return list(range(1, nmax + 1))
    out, v = set(range(1, exhaustive_below + 1)), float(exhaustive_below)
    while v < nmax:
        out.add(int(v))
        v *= 1.5
    out.add(nmax)
    return sorted(out)


def recompute_prefixes(pp: int, exhaustive_below: int = 8) -> list[int]:
    """Full recompute on stages [0, k): under 1F1B the early stages hold the most micro-batches."""
    if pp <= exhaustive_below:
        return list(range(pp + 1))
    out, k = {0, pp}, 1
    while k < pp:
        out.add(k)
        k *= 2
    return sorted(out)


def valid_tps(model: ModelSpec, cls: DeviceClass, space: SearchSpace) -> list[int]:
    g = cls.devices_per_node
    return [t for t in space.tps if g % t == 0 and model.num_heads % t == 0 and model.kv_heads % t == 0]


def _few(nmax: int, exhaustive_below: int, class_devices: int) -> list[int]:
    """Stage counts that use a class fully: idle devices only pay off through other shapes (fewer
    replicas, a subset of classes); every count for classes of at most `exhaustive_below` devices."""
    if class_devices <= exhaustive_below:
        return list(range(1, nmax + 1))
    return [nmax]


def pipeline_shapes(model: ModelSpec, classes: list[DeviceClass], space: SearchSpace, max_dp: int) -> Iterator[Shape]:
    """Ordered class segments, replicated dp times. One class: every (tp, pp) with the largest aligned dp
    (and half of it). Several classes: every order, tp per class (one tp for 3+ classes), every dp, and
    stage counts that use each class fully; all counts when they are small (exhaustive for the oracle)."""
    L, ex = model.num_layers, space.exhaustive_below
    for size in range(1, min(space.max_classes, len(classes)) + 1):
        for subset in combinations(classes, size):
            tp_sets = [valid_tps(model, c, space) for c in subset]
            if size == 1:
                c = subset[0]
                for tp in tp_sets[0]:
                    for pp in count_options(min(L, c.num_devices // tp), ex):
                        cap = min(c.num_devices // (pp * tp), max_dp)
                        dps = dp_options(cap, [c.devices_per_node // tp], ex)
                        for dp in dps if cap <= ex else _few_aligned(dps):
                            yield Shape("pipeline", (Segment(c.index, pp, tp),), dp)
                continue
            if size >= 3:
                common = sorted(set.intersection(*map(set, tp_sets)))
                tp_choices = [tuple([t] * size) for t in common]
            else:
                tp_choices = list(product(*tp_sets))
            for perm_idx in permutations(range(size)):
                perm = [subset[i] for i in perm_idx]
                for tps0 in tp_choices:
                    tps = [tps0[i] for i in perm_idx]
                    dp_cap = min(min(c.num_devices // t for c, t in zip(perm, tps, strict=True)), max_dp)
                    for dp in dp_options(dp_cap, [c.devices_per_node // t for c, t in zip(perm, tps, strict=True)], ex):
                        smax = [min(c.num_devices // (dp * t), L) for c, t in zip(perm, tps, strict=True)]
                        for counts in product(*[_few(s, ex, c.num_devices) for s, c in zip(smax, perm, strict=True)]):
                            if sum(counts) > L:
                                continue
                            segs = tuple(Segment(c.index, k, t) for c, k, t in zip(perm, counts, tps, strict=True))
                            yield Shape("pipeline", segs, dp)


def dp_options(cap: int, units: list[int], exhaustive_below: int) -> list[int]:
    """Replica counts d ≤ cap with d·tp node-aligned for every class (d divides or is a multiple of
    each unit = devices per node / tp): all of them up to `exhaustive_below`, geometric beyond."""
    if cap < 1:
        return []
    return list(_dp_options(cap, tuple(units), exhaustive_below))


@lru_cache(maxsize=8192)
def _dp_options(cap: int, units: tuple[int, ...], exhaustive_below: int) -> tuple[int, ...]:
    """`dp_options`, memoised: a four-kind search asks ~20,000 times for a few hundred distinct answers."""
    step = math.lcm(*units)
    vals = set(range(1, min(cap, exhaustive_below) + 1))
    vals.update((v // step) * step for v in count_options(cap, exhaustive_below))
    vals.add((cap // step) * step)
    return tuple(sorted(d for d in vals if d >= 1 and all(u % d == 0 or d % u == 0 for u in units)))


def _few_aligned(dps: list[int]) -> list[int]:
    if not dps:
        return []
    top = dps[-1]
    return sorted({top, max((d for d in dps if d <= top // 2), default=top)})


def replica_shapes(model: ModelSpec, classes: list[DeviceClass], space: SearchSpace, max_dp: int) -> Iterator[Shape]:
    """Kind-pure replicas of ≥ 2 classes sharing pp, tp and the split; unequal batch shares."""
    L, ex = model.num_layers, space.exhaustive_below
    for size in range(2, min(space.max_classes, len(classes)) + 1):
        for subset in combinations(classes, size):
            tps = set.intersection(*[set(valid_tps(model, c, space)) for c in subset])
            for tp in sorted(tps):
                for pp in count_options(min(L, min(c.num_devices // tp for c in subset)), ex):
                    per = []
                    for c in subset:
                        cap = min(c.num_devices // (pp * tp), max_dp)
                        ok = dp_options(cap, [c.devices_per_node // tp], ex)
                        per.append(ok if c.num_devices <= ex else ok[-1:])  # large classes: every replica that fits
                    for ns in product(*per):
                        if sum(ns) > max_dp:
                            continue
                        segs = (Segment(subset[0].index, pp, tp),)
                        groups = tuple((c.index, n) for c, n in zip(subset, ns, strict=True))
                        yield Shape("replicas", segs, sum(ns), groups)
