"""Best-first exploration of the outer search space, with exact pruning at every depth.

The space is a tree: shape × micro-batch size → × sharding → × schedule (× virtual stages) →
candidates (one recompute prefix each), whose inner problem `inner.solve_split` or
`replicas.solve_replicas` solves. A shape × micro-batch size node bounds its sharding children
from the stages' local terms alone (`Bounds.optimistic`, `Bounds.optimistic_replicas`), so a
sharding that cannot win is pruned before its data-parallel coefficients are priced. Every node carries a lower bound on the step time of every
candidate below it (`bounds.py`), and the frontier is two heaps on those bounds, candidates and
nodes. A candidate that can still enter the kept top-k is solved as soon as it exists (a dive:
good plans come early, so pruning bites and a budget cut keeps them); otherwise the node with the
smallest bound is expanded into children with tighter bounds. When the smallest bound left cannot
beat the top-k found so far, nothing left can, and the search is complete. A budget cut leaves only
the frontier, and `unexplored_bound_s` is its smallest bound: the exact gap of what was not explored.

Pruning keeps the candidate set of an exhaustive enumeration: a candidate is dropped only when its
bound shows it cannot enter the kept set, or by the recompute dominance rule
(`Bounds.recompute_dominated`), which the enumeration applied the same way.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from planner.cost.devices import cross_node_link
from planner.search.arrays import Pricer, SegmentSpec, StageSpec, mix_prefix, pipeline_arrays
from planner.search.bounds import (
    Bounds,
    ShapeTable,
    capped_replica_bounds,
    prefix_bounds,
    prefix_row_bound,
    shape_table,
)
from planner.search.build import Choice, balanced_microbatches
from planner.search.inner import StageArrays, solve_split
from planner.search.interleave import chunk_layers, interleaved_arrays
from planner.search.replicas import solve_replicas
from planner.search.space import SearchSpace, Shape, recompute_prefixes

# bounds are floating-point sums in another order than the costs they bound: a bound exactly equal
# to a candidate's cost may round above it, so every bound is lowered by this relative margin
BOUND_MARGIN = 1e-9


@dataclass(frozen=True, slots=True)
class Found:
    cost_s: float
    shape: Shape
    choice: Choice


@dataclass
class Counts:
    """What the exploration did (SearchStats takes these fields)."""

    shapes: int = 0
    candidates: int = 0
    pruned: int = 0
    infeasible: int = 0
    inner_solves: int = 0


@dataclass
class Explorer:
    pr: Pricer
    bounds: Bounds
    space: SearchSpace
    global_batch: int
    keep: int
    counts: Counts = field(default_factory=Counts)

    def __post_init__(self) -> None:
        sp = self.space
        self.L = self.pr.model.num_layers
        self.mbs_opts = [b for b in sp.micro_batch_sizes if self.global_batch % b == 0]
        # GPipe prices like 1F1B and holds more activations, so it is searched only without 1F1B
        self.primary = "1f1b" if "1f1b" in sp.schedules else ("gpipe" if "gpipe" in sp.schedules else None)
        self.interleaved = "interleaved-1f1b" in sp.schedules
        self.shardings = [s for s in sp.shardings if not (s == "zero1" and "zero2" in sp.shardings)]
        self.prefixes = (lambda pp: recompute_prefixes(pp, sp.exhaustive_below)) if sp.recompute else (lambda pp: [0])
        self.found: list[tuple[float, int, Found]] = []  # max-heap of the best `keep` by internal cost
        # nodes still to expand and candidates still to solve, each a heap on its lower bound
        self.nodes: list[tuple[float, int, Callable[[], None]]] = []
        self.leaves: list[tuple[float, int, Callable[[], None]]] = []
        # tie-breaks of the heaps; explorers that share the heaps (search.py) share it too
        self.ticket: Iterator[int] = itertools.count(1)
        # what record() does to a Choice: search.py tags it with the pass's stack
        self.tag: Callable[[Choice], Choice] = lambda c: c
        self.expanded: set[Shape] = set()
        self.loosest: dict[tuple, StageArrays | None] = {}
        self.capped: dict[tuple, tuple | None] = {}
        self.seg_memo: dict[Shape, list[SegmentSpec]] = {}

    # the kept set and its bound -------------------------------------------------------------------

    def bound(self) -> float:
        return -self.found[0][0] if len(self.found) >= self.keep else math.inf

    def record(self, cost: float, shape: Shape, choice: Choice) -> None:
        item = (-cost, next(self.ticket), Found(cost, shape, self.tag(choice)))
        if len(self.found) < self.keep:
            heapq.heappush(self.found, item)
        elif cost < -self.found[0][0]:
            heapq.heapreplace(self.found, item)

    def push(self, lb: float, run: Callable[[], None], leaf: bool = False) -> None:
        lb *= 1 - BOUND_MARGIN
        if lb >= self.bound():
            self.counts.pruned += 1
            return
        heapq.heappush(self.leaves if leaf else self.nodes, (lb, next(self.ticket), run))

    def _push_leaf(self, lb: float, run: Callable[[], None]) -> None:
        """A candidate: +inf bound when no split fits in memory (counted infeasible, never solved)."""
        if math.isinf(lb):
            self.counts.infeasible += 1
            return
        self.push(lb, run, leaf=True)

    # the loop ---------------------------------------------------------------------------------------

    def share(self, other: Explorer) -> None:
        """Explore together with `other` (another pass: stack variant, cp degree): one kept set, one
        frontier, so nodes of every pass are expanded best-first against the best plan of any pass,
        and a budget cut's smallest bound left covers every pass."""
        self.found, self.nodes, self.leaves, self.ticket = other.found, other.nodes, other.leaves, other.ticket

    def seed(self, shapes: list[Shape], table: ShapeTable | None = None) -> None:
        """Put every shape × micro-batch size on the frontier, bounded by Bounds.shape: all bounds at
        once (Bounds.shape_bounds over `table`, the shapes' ShapeTable, which passes may share),
        sorted, behind one frontier entry that pushes the next shape node each time it is expanded
        (its bound is the smallest left), so shape nodes that cannot win are never built."""
        tab = table if table is not None else shape_table(shapes)
        lbs = np.concatenate([self.bounds.shape_bounds(tab, mbs) for mbs in self.mbs_opts] or [np.zeros(0)])
        order = np.argsort(lbs, kind="stable")
        order = order[np.isfinite(lbs[order])]  # +inf: more replicas than micro-batches, no candidate
        n = len(shapes)
        # bounds in frontier order; a shape node is built only when popped (most never are: building
        # every (bound, shape, mbs) tuple up front cost more than the search of a 4-kind cluster's rest)
        lbl = lbs[order].tolist()
        at = order.tolist()
        pos = 0

        def stream() -> None:
            nonlocal pos
            lb, i = lbl[pos], at[pos]
            pos += 1
            self.push(lb, self._shape_node(shapes[i % n], self.mbs_opts[i // n], lb))
            if pos < len(at):
                if lbl[pos] * (1 - BOUND_MARGIN) >= self.bound():
                    self.counts.pruned += len(at) - pos  # sorted: none left can win
                else:
                    self.push(lbl[pos], stream)

        if at:
            self.push(lbl[0], stream)

    def run(
        self, shapes: list[Shape], over_budget: Callable[[], bool], table: ShapeTable | None = None
    ) -> float | None:
        """Explore until the frontier is empty or cannot beat the kept set (None), or the budget cuts
        it: then the smallest bound left on the frontier (shared: every sharing explorer's)."""
        self.seed(shapes, table)
        while self.nodes or self.leaves:
            # candidates before nodes: a candidate that can still enter the kept set is solved as soon
            # as it exists (a depth-first dive), so good plans come early and a budget cut keeps them;
            # nodes are expanded best-first
            heap = self.leaves if self.leaves else self.nodes
            lb = min(h[0][0] for h in (self.nodes, self.leaves) if h)
            if lb >= self.bound():
                self.counts.pruned += len(self.nodes) + len(self.leaves)  # every bound left is ≥ lb
                self.nodes.clear()
                self.leaves.clear()
                break
            if over_budget():
                return lb
            if heap[0][0] >= self.bound():
                heapq.heappop(heap)  # a candidate the kept set has outgrown since it was pushed
                self.counts.pruned += 1
                continue
            heapq.heappop(heap)[2]()
        return None

    # expanders --------------------------------------------------------------------------------------

    def _shape_node(self, shape: Shape, mbs: int, shape_lb: float) -> Callable[[], None]:
        """`shape_lb`: Bounds.shape(shape, mbs), which every child bound takes the max with."""

        def run() -> None:
            if shape not in self.expanded:
                self.expanded.add(shape)
                self.counts.shapes += 1
            total_mb = self.global_batch // mbs
            if shape.family == "pipeline":
                self._pipeline_shape(shape, mbs, total_mb, shape_lb)
                return
            self._replica_shape(shape, mbs, total_mb, shape_lb)

        return run

    def segments(self, shape: Shape) -> list[SegmentSpec]:
        out = self.seg_memo.get(shape)
        if out is None:
            out = self.seg_memo[shape] = []
            for seg in shape.segments:
                w = shape.dp * seg.tp
                out.append(SegmentSpec(seg.cls, seg.tp, seg.stages, w, self.pr.dp_link(seg.cls, w, seg.tp)))
        return out

    def _interleaved_ok(self, shape: Shape, total_mb: int) -> bool:
        pp = shape.pp
        return self.interleaved and pp >= 2 and total_mb % shape.dp == 0 and (total_mb // shape.dp) % pp == 0

    def _pipeline_shape(self, shape: Shape, mbs: int, total_mb: int, shape_lb: float) -> None:
        """Per sharding, a node for the 1F1B (or GPipe) candidates and one per interleaved v, bounded
        first from the stages' local terms alone (Bounds.optimistic: no dp context priced), so a
        sharding that cannot win costs no coefficients; a node refines its bound when expanded."""
        segs = self.segments(shape)
        m, dp = math.ceil(total_mb / shape.dp), shape.dp
        # ZeRO needs more than one rank holding the parameters: dp replicas × cp ranks (planner.search.cp)
        shardings = self.shardings if dp * self.pr.stack.cp > 1 else ["none"]
        vs = [v for v in self.space.virtual_stages if v >= 2 and self.L >= shape.pp * v]
        vs = vs if vs and self._interleaved_ok(shape, total_mb) else []
        prim, inter = self.bounds.optimistic(segs, m, mbs, self.primary, shardings, dp, [1.0 / v for v in vs])
        if self.primary is not None and math.isinf(prim):
            # no sharding's full recompute fits (Bounds.optimistic's caps are above capped_pipeline's)
            self.counts.infeasible += len(shardings)
            if self.space.recompute:
                return  # no prefix fits, and interleaved holds more
        for sharding in shardings:
            if self.primary is not None and not math.isinf(prim):
                self.push(max(shape_lb, prim), lambda s=sharding: self._primary_node(shape, segs, mbs, s, m, shape_lb))
            for v, lb in zip(vs, inter, strict=True):
                run = lambda s=sharding, v=v: self._interleaved_node(shape, segs, mbs, s, total_mb, shape_lb, v)  # noqa: E731
                self.push(max(shape_lb, lb), run)

    def _caps(self, shape: Shape, segs, m: int, mbs: int, sharding: str, v: int = 1):
        """Bounds.pipeline_caps of a shape × mbs × sharding (v > 1: interleaved, v chunks), memoised
        (the primary and interleaved nodes of a sharding read the primary's)."""
        key = (shape, mbs, sharding, v)
        if key not in self.capped:
            assert self.primary is not None
            sched = self.primary if v == 1 else "interleaved-1f1b"
            self.capped[key] = self.bounds.pipeline_caps(segs, m, mbs, sched, sharding, shape.dp, v)
        return self.capped[key]

    def _capped(self, shape: Shape, segs, m: int, mbs: int, sharding: str) -> float:
        """Bounds.capped_pipeline of a shape × mbs × sharding (+inf: not even full recompute fits)."""
        parts = self._caps(shape, segs, m, mbs, sharding)
        return math.inf if parts is None else prefix_row_bound(parts, self.prefixes(shape.pp), self.L, 1, m)

    def _primary_node(self, shape: Shape, segs, mbs: int, sharding: str, m: int, shape_lb: float) -> None:
        """The 1F1B (or GPipe) candidates of a sharding, bounded under their memory caps."""
        capped = self._capped(shape, segs, m, mbs, sharding)
        if math.isinf(capped):
            self.counts.infeasible += 1  # not even full recompute fits
            return
        # capped ≥ Bounds.pipeline (its slopes are no larger than the rows', caps and b ≥ 0 only add)
        lb = max(shape_lb, capped)
        total_mb = self.global_batch // mbs
        self.push(lb, lambda: self._primary(shape, segs, mbs, sharding, total_mb))

    def _interleaved_node(self, shape: Shape, segs, mbs: int, sharding: str, total_mb: int, shape_lb: float, v: int):
        """Interleaved candidates with v chunks per rank; none when 1F1B's full recompute does not fit
        (interleaved holds even more). Bounded under memory too (bounds.interleaved_row): rank j runs
        a chunk in stage j's context plus others (times, bytes ≥ 0) and a block's terms do not depend
        on its context, so stage j's row at the interleaved in-flight count has a, b no larger and a
        cap no smaller than rank j's (Bounds.pipeline_caps with v); rank 0's slope is its interior
        one, at least its local terms' (Bounds.local_slope: dp time ≥ 0 on top). That bound is at least
        Bounds.pipeline's, which bounds the node only without a primary schedule."""
        m = math.ceil(total_mb / shape.dp)
        lb = shape_lb
        if self.primary is None:
            lb = max(lb, self.bounds.pipeline(segs, m, 1.0 / v, mbs, sharding, shape.dp))
        else:
            parts = self._caps(shape, segs, m, mbs, sharding)
            if parts is None and self.space.recompute:
                return  # 1F1B's full recompute does not fit: interleaved holds even more
            if parts is None:
                lb = max(lb, self.bounds.pipeline(segs, m, 1.0 / v, mbs, sharding, shape.dp))
            else:
                inter = self._caps(shape, segs, m, mbs, sharding, v)
                if inter is None:
                    self.counts.infeasible += 1  # no rank's full recompute fits at interleaved's in-flight
                    return
                a0 = self.bounds.local_slope(segs[0], mbs, True, len(segs) == 1, shape.pp)
                lb = max(lb, prefix_row_bound(inter, self.prefixes(shape.pp), self.L, v, m, a0))
        self.push(lb, lambda: self._interleaved(shape, segs, mbs, sharding, total_mb, v))

    def _loosest(self, shape: Shape, segs, mbs: int, sharding: str, m: int) -> StageArrays | None:
        """The primary schedule's full-recompute arrays, memoised (both of a sharding's nodes read
        them), or None when even they hold no split."""
        key = (shape, mbs, sharding)
        if key not in self.loosest:
            kw = dict(mbs=mbs, schedule=self.primary, sharding=sharding, dp=shape.dp, m=m)
            arr = pipeline_arrays(self.pr, segs, self.L, recompute=self.space.recompute, **kw)[0]
            caps = arr.mem_ok.sum(axis=1)
            self.loosest[key] = None if (caps < 1).any() or caps.sum() < self.L else arr
        return self.loosest[key]

    def _primary(self, shape, segs, mbs, sharding, total_mb) -> None:
        L, pp, m = self.L, shape.pp, math.ceil(total_mb / shape.dp)
        full = self._loosest(shape, segs, mbs, sharding, m)
        if full is None:
            self.counts.infeasible += 1  # not even full recompute fits: skip every prefix
            return
        kw = dict(mbs=mbs, schedule=self.primary, sharding=sharding, dp=shape.dp, m=m)
        none = pipeline_arrays(self.pr, segs, L, recompute=False, **kw)[0] if self.space.recompute else full
        ks = self._kept_prefixes(pp, none, self.bounds.recompute_dominated(shape, mbs))
        for k, lb in zip(ks, prefix_bounds(none, full, ks, L, 1.0, m - 1.0), strict=True):
            self.counts.candidates += 1
            self._push_leaf(float(lb), self._split_leaf(shape, none, full, L, m, k, mbs, sharding))

    def _kept_prefixes(self, pp: int, none: StageArrays, dominated: bool) -> list[int]:
        """Recompute prefixes to try: only k = 0 when memory never binds without recompute and
        recomputing can only add time (Bounds.recompute_dominated)."""
        ks = self.prefixes(pp)
        return ks[:1] if dominated and bool(none.mem_ok.all()) else ks

    def _split_leaf(self, shape, none, full, L: int, m: int, k: int, mbs: int, sharding: str):
        def run() -> None:
            self.counts.inner_solves += 1
            sol = solve_split(mix_prefix(none, full, k), L, m, self.bound())
            if sol is None:
                self.counts.infeasible += 1
                return
            mb = balanced_microbatches(self.global_batch // mbs, shape.dp)
            self.record(sol.cost_s, shape, Choice(mbs, self.primary, sharding, k, sol.layers, mb))

        return run

    def _interleaved(self, shape, segs, mbs, sharding, total_mb, v) -> None:
        """Interleaved 1F1B candidates of a pipeline shape (Megatron needs m divisible by pp, equal m per
        replica); none when 1F1B with full recompute does not fit (interleaved holds even more)."""
        pp, L = shape.pp, self.L
        m = total_mb // shape.dp
        if self.primary is not None and self.space.recompute and self._loosest(shape, segs, mbs, sharding, m) is None:
            return
        dominated = self.bounds.recompute_dominated(shape, mbs)
        ranks = [StageSpec(sg.cls, sg.tp, s, sg.width) for sg in segs for s in range(sg.stages)]
        links = [sg.dplink for sg in segs for _ in range(sg.stages)]
        kw = dict(mbs=mbs, sharding=sharding, dp=shape.dp, m=m, v=v)
        full = interleaved_arrays(self.pr, ranks, links, L, recompute=self.space.recompute, **kw)
        caps = full.mem_ok.sum(axis=1)
        n_eff = L - pp * (v - 1)
        if (caps < 1).any() or caps.sum() < n_eff:
            self.counts.infeasible += 1  # not even full recompute fits
            return
        none = interleaved_arrays(self.pr, ranks, links, L, recompute=False, **kw) if self.space.recompute else full
        w_sum, w_max = 1.0 / v, m - 1.0 / v
        ks = self._kept_prefixes(pp, none, dominated)
        for k, lb in zip(ks, prefix_bounds(none, full, ks, n_eff, w_sum, w_max), strict=True):
            self.counts.candidates += 1

            def run(k=k) -> None:
                self.counts.inner_solves += 1
                sol = solve_split(mix_prefix(none, full, k), n_eff, m, self.bound(), w_sum, w_max)
                if sol is None:
                    self.counts.infeasible += 1
                    return
                per_rank = tuple(n + v - 1 for n in sol.layers)
                mb = balanced_microbatches(total_mb, shape.dp)
                layers = chunk_layers(per_rank, v)
                self.record(sol.cost_s, shape, Choice(mbs, "interleaved-1f1b", sharding, k, layers, mb, v))

            self._push_leaf(float(lb), run)

    # kind-pure replicas -----------------------------------------------------------------------------

    def _replica_shape(self, shape: Shape, mbs: int, total_mb: int, shape_lb: float) -> None:
        """A node per sharding, bounded first from the stages' local terms alone
        (Bounds.optimistic_replicas), as `_pipeline_shape` does for pipelines."""
        if self.primary is None:
            return
        tp, pp = shape.segments[0].tp, shape.pp
        link = self.pr.intern(cross_node_link([self.pr.classes[c].spec for c, _ in shape.groups]))
        segs = [SegmentSpec(c, tp, pp, n * tp, link) for c, n in shape.groups]
        counts = [n for _, n in shape.groups]
        shardings = self.shardings if shape.dp * self.pr.stack.cp > 1 else ["none"]
        opt = self.bounds.optimistic_replicas(segs, counts, total_mb, mbs, shardings, shape.dp)
        if math.isinf(opt):
            self.counts.infeasible += len(shardings)  # no split fits every class, whatever the sharding
            return
        for sharding in shardings:
            run = lambda s=sharding: self._replica_sharding(shape, segs, counts, mbs, s, total_mb, shape_lb)  # noqa: E731
            self.push(max(shape_lb, opt), run)

    def _replica_sharding(self, shape, segs, counts, mbs: int, sharding: str, total_mb: int, shape_lb: float) -> None:
        lb = max(self.bounds.replicas(segs, counts, total_mb, mbs, sharding), shape_lb)
        self.push(lb, lambda: self._replica_arrays(shape, segs, counts, mbs, sharding, total_mb))

    def _replica_arrays(self, shape, segs, counts, mbs, sharding, total_mb) -> None:
        L, pp = self.L, shape.pp
        m_guess = math.ceil(total_mb / shape.dp)
        memo: dict[tuple, tuple] = {}

        def arrays(i: int, m: int, rc: bool):
            key = (i, m, rc)
            if key not in memo:
                kw = dict(mbs=mbs, schedule=self.primary, sharding=sharding, dp=shape.dp, m=m)
                memo[key] = pipeline_arrays(self.pr, [segs[i]], L, recompute=rc, **kw)
            return memo[key]

        mixes: dict[tuple, tuple[StageArrays, list]] = {}

        def mixed(i: int, k: int, m: int) -> tuple[StageArrays, list]:
            """Group i's arrays with full recompute on stages [0, k) (arrays.mix_prefix)."""
            key = (i, k, m)
            if key not in mixes:
                if k == 0:
                    mixes[key] = arrays(i, m, False)
                elif k >= pp:
                    mixes[key] = arrays(i, m, True)
                else:
                    none, full = arrays(i, m, False), arrays(i, m, True)
                    mixes[key] = (mix_prefix(none[0], full[0], k), full[1][:k] + none[1][k:])
            return mixes[key]

        def lbs(ks: list[int]) -> list[float]:
            """capped_replica_bound of each prefix k in `ks` (bounds.capped_replica_bounds, all at once)."""
            groups = range(len(segs))
            rec = any(k > 0 for k in ks)  # full recompute arrays only when some prefix uses them
            none = [arrays(i, m_guess, False)[0] for i in groups]
            none1 = [arrays(i, 1, False)[0] for i in groups]
            full = [arrays(i, m_guess, True)[0] for i in groups] if rec else none
            full1 = [arrays(i, 1, True)[0] for i in groups] if rec else none1
            return capped_replica_bounds(none, full, none1, full1, ks, counts, L, total_mb)

        dominated = self.bounds.recompute_dominated(shape, mbs)
        prefixes = self.prefixes(pp)

        def leaf(k: int) -> Callable[[], None]:
            def run() -> None:
                self.counts.inner_solves += 1
                res = solve_replicas(
                    shape, lambda i, m: mixed(i, k, m), m_guess=m_guess, total_mb=total_mb, num_layers=L
                )
                loose = False
                if res is None:
                    self.counts.infeasible += 1
                else:
                    self.record(res[0], shape, Choice(mbs, self.primary, sharding, k, res[1], res[2]))
                    loose = res[3]
                if k == 0:
                    expand(skip=res is not None and loose and dominated)

            return run

        def expand(skip: bool) -> None:
            if skip:
                return  # memory never binds: recomputing can only add time
            ks = prefixes[1:]
            for k, lb in zip(ks, lbs(ks) if ks else [], strict=True):
                self.counts.candidates += 1
                self._push_leaf(lb, leaf(k))

        self.counts.candidates += 1
        lb0 = lbs([0])[0]
        if math.isinf(lb0):  # no split fits every class: solve_replicas would find none
            self.counts.infeasible += 1
            expand(skip=False)
        elif lb0 >= self.bound():
            self.counts.pruned += 1
            loose = all(bool(mixed(i, 0, m_guess)[0].mem_ok.all()) for i in range(len(segs)))
            expand(skip=loose and dominated)
        else:
            self.push(lb0, leaf(0), leaf=True)
