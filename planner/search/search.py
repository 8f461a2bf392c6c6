"""Plan search: outer enumeration of shapes × an exact inner split solver, anytime, top-k.

`search(model, cluster, profiles, global_batch=..., ...)` returns a `SearchResult` (ranked Plans
with `predicted` filled by `planner.cost.estimate`, baselines, statistics) or a `NoFeasiblePlan`
with reasons — never None. Devices are handled as classes (`classes.py`), so the work grows with
the number of classes and the count options, not with the number of GPUs. The enumeration is
best-first with exact bounds (`explore.py`, `bounds.py`): a search the budget did not cut is
complete, and a cut one reports the bound of what it left (SearchStats.gap_fraction).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from planner.cost import COST_MODEL_VERSION
from planner.cost.completion import ProfileNeed, complete_profiles, table_fingerprint
from planner.cost.devices import DeviceIndex
from planner.cost.memory import Stack
from planner.cost.runtimes import Pricing, price
from planner.errors import MeshplanError
from planner.measure.calibrate import Calibration
from planner.measure.profiles import ProfileTable
from planner.runtime import launchable_first
from planner.search.arrays import Pricer
from planner.search.bounds import Bounds, ShapeTable, shape_table
from planner.search.build import build_plan
from planner.search.classes import DeviceClass, device_classes
from planner.search.cp import Folding, cp_degrees, fold_classes, with_cp
from planner.search.explore import Explorer
from planner.search.infeasible import reasons, states_bytes, usable_bytes
from planner.search.space import (
    SearchSpace,
    pipeline_shapes,
    replica_shapes,
    valid_tps,
)
from planner.specs.cluster import ClusterSpec
from planner.specs.config import SEARCH_BUDGET_S
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan, Provenance

ALGORITHM = "meshplan-classes-dp-v1"


@dataclass
class SearchStats:
    shapes: int = 0
    candidates: int = 0
    pruned: int = 0
    infeasible: int = 0
    inner_solves: int = 0
    wall_s: float = 0.0
    timed_out: bool = False
    num_devices: int = 0
    num_classes: int = 0
    # complete: every candidate was priced or proven unable to win; when the budget cut the search,
    # unexplored_bound_s is the smallest lower bound of what was left and gap_fraction bounds how
    # much faster than the best plan found any unexplored plan can be: (best − bound) / best
    complete: bool = True
    best_s: float | None = None
    unexplored_bound_s: float | None = None
    gap_fraction: float = 0.0
    # found plans the final estimate rejected (infeasible): 0 when the search's own memory test and
    # estimate's agree, as they must (tests/planner/test_search_memory.py)
    rejected: int = 0

    def summary(self) -> str:
        """One line: complete, or how far the cut search's best plan can be from the optimum."""
        if self.complete:
            return "search complete: the best plan is optimal in the search space"
        if self.best_s is None or self.unexplored_bound_s is None:
            return "search cut by the time budget before any plan was found"
        return (
            f"search cut by time budget: best {_duration(self.best_s)}, "
            f"unexplored ≥ {_duration(self.unexplored_bound_s)} (gap ≤ {self.gap_fraction:.1%})"
        )


def _duration(seconds: float) -> str:
    """At most 9 characters, so the cut-search line fits 80 columns."""
    return f"{seconds * 1e3:.2f} ms" if seconds < 1.0 else f"{seconds:.4g} s"


@dataclass(frozen=True)
class SearchResult:
    plans: tuple[Plan, ...]
    stats: SearchStats
    baselines: dict[str, Plan | None] = field(default_factory=dict)

    feasible = True

    @property
    def best(self) -> Plan:
        return self.plans[0]

    def speedup(self, baseline: str) -> float | None:
        b = self.baselines.get(baseline)
        if b is None or b.predicted is None or not b.predicted.feasible:
            return None
        assert self.best.predicted is not None
        return b.predicted.step_time_s / self.best.predicted.step_time_s


@dataclass(frozen=True)
class NoFeasiblePlan:
    """The typed 'nothing fits' answer: one reason per violated constraint, with the numbers."""

    reasons: tuple[str, ...]
    stats: SearchStats
    feasible = False


def _needs(model: ModelSpec, classes: list[DeviceClass], space: SearchSpace, seq: int, dtype: str, gb: int):
    tps = {t for c in classes for t in valid_tps(model, c, space)}
    recs = (False, True) if space.recompute else (False,)
    return {ProfileNeed(b, seq, t, r, dtype) for b in space.micro_batch_sizes if gb % b == 0 for t in tps for r in recs}


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    profiles: ProfileTable | None = None,
    *,
    global_batch: int,
    seq: int | None = None,
    dtype: str = "bf16",
    top_k: int = 5,
    time_budget_s: float = SEARCH_BUDGET_S,
    space: SearchSpace | None = None,
    baselines: bool = True,
    calibration: Calibration | None = None,
    pricing: Pricing | None = None,
) -> SearchResult | NoFeasiblePlan:
    """The ranked plans of the space (module docstring), priced under `pricing` (a runtime's profile
    and calibrated figures, planner.cost.runtimes.Pricing; None: meshplan's plain estimate) from the
    stage terms the enumeration and its bounds read to the price of every plan returned."""
    t0 = time.perf_counter()
    space = space or SearchSpace()
    if pricing is not None and pricing.plain_on(cluster):
        pricing = None  # prices as estimate: the search is the plain one
    seq = seq or model.seq_len
    if global_batch <= 0:
        raise MeshplanError("global_batch", global_batch, "must be a positive number of samples")
    classes = device_classes(cluster)
    stats = SearchStats(num_devices=cluster.num_devices, num_classes=len(classes))
    if states_bytes(model, dtype) > usable_bytes(classes):
        # even ZeRO-3 over every device cannot hold weights, grads and Adam states: no need to search
        stats.wall_s = time.perf_counter() - t0
        return NoFeasiblePlan(reasons(model, cluster, classes, space, seq, dtype, global_batch, stats), stats)
    needs = _needs(model, classes, space, seq, dtype, global_batch)
    table = complete_profiles(model, cluster, profiles, needs, kernels=pricing.kernels if pricing else None)
    mbs_opts = [b for b in space.micro_batch_sizes if global_batch % b == 0]
    max_dp = max((global_batch // b for b in mbs_opts), default=0)
    shapes = _shapes(model, classes, space, max_dp)
    # one exact pass per stack variant (and, for context parallelism, per cp degree over the
    # cp-folded classes where planner.search.cp's rule says cp can help), all explored together on
    # one frontier (Explorer.share): best-first over every pass, pruned against the best plan of any
    plain: list[tuple[Folding | None, Stack, list]] = [
        (None, v, shapes) for v in stack_variants(space, classes, pricing)
    ]
    folds: dict[int, Folding] = {}

    def cp_passes(found_plain: bool) -> list[tuple[Folding | None, Stack, list]]:
        out: list[tuple[Folding | None, Stack, list]] = []
        for c in cp_degrees(space, classes, seq, found_plain):
            folds[c] = fo = fold_classes(classes, c)
            cp_shapes = _shapes(model, fo.classes, space, max_dp, c)
            out += [(fo, with_cp(v, c), cp_shapes) for v in stack_variants(space, fo.classes, pricing)]
        return out

    # from seq ≥ cp_min_seq cp is searched whatever the plain passes find: one group; below, only
    # when they find nothing (a second group)
    groups = [plain + cp_passes(True)]
    found: list = []
    left_s: float | None = None
    # the budget counts this thread's CPU seconds, not wall time: a search on a loaded machine (or
    # beside other threads of a flow process) goes as far, and so gives the same plans, as on a quiet one
    c0, w0 = time.thread_time(), time.perf_counter()

    def spent() -> float:
        # a thread's CPU time never exceeds the wall time it has run: while the wall clock (a cheap
        # read) is under the budget so is the CPU time, and the CPU clock (a system call, ~1 µs,
        # asked once per frontier step) is read only past it, so an unbudgeted search never reads it
        w = time.perf_counter() - w0
        return w if w <= time_budget_s else time.thread_time() - c0

    while groups and left_s is None:
        group = groups.pop(0)
        left_s = _explore(group, classes, model, table, space, seq, dtype, calibration, global_batch, top_k,
                          found, stats, spent, time_budget_s, pricing)  # fmt: skip
        if not found and left_s is None and not folds:
            groups = [g for g in [cp_passes(False)] if g]
    stats.timed_out = left_s is not None
    _gap(stats, left_s, [f.cost_s for _, _, f in found])
    stats.wall_s = time.perf_counter() - t0
    if not found:
        return NoFeasiblePlan(reasons(model, cluster, classes, space, seq, dtype, global_batch, stats), stats)
    prov = Provenance(
        algorithm=ALGORITHM,
        cost_model_version=COST_MODEL_VERSION,
        config_fingerprint=_fingerprint(global_batch, seq, dtype, top_k, space, calibration, pricing),
        profile_fingerprint=table_fingerprint(table),
        cluster_fingerprint=cluster.fingerprint(),
        model_fingerprint=model.fingerprint(),
    )
    idx = DeviceIndex(cluster)
    plans: dict[str, Plan] = {}
    for _, _, f in sorted(found, key=lambda x: (-x[0], x[1])):
        fo = folds.get(f.choice.cp)
        plan = build_plan(
            fo.classes if fo is not None else classes,
            f.shape,
            f.choice,
            model=model.name,
            cluster=cluster.name,
            seq=seq,
            dtype=dtype,
            provenance=prov,
            folding=fo,
        )
        if pricing is not None:
            plan = pricing.dress(plan)  # the runtime's stack, which the passes priced
        cost = price(plan, model, cluster, pricing, profiles=table, index=idx, calibration=calibration)
        if not cost.feasible:
            stats.rejected += 1
        elif plan.fingerprint() not in plans:
            plans[plan.fingerprint()] = plan.model_copy(update={"predicted": cost})
    if not plans:
        # every plan found failed estimate's check (seen once: a budget cut that had found only one);
        # answer "nothing fits" with the reason rather than an empty ranking
        why = f"the {len(found)} plan(s) found were rejected by the cost model's check (estimate)"
        return NoFeasiblePlan((*reasons(model, cluster, classes, space, seq, dtype, global_batch, stats), why), stats)
    # the top_k cheapest, launchable ones first (planner/runtime.py); a refused one keeps its reason in its notes
    ranked = launchable_first(sorted(plans.values(), key=lambda p: p.predicted.step_time_s)[:top_k], model)  # type: ignore[union-attr]
    base = {}
    if baselines:
        from planner.search.baselines import megatron_baseline, uniform_baseline

        base["megatron"] = megatron_baseline(
            model, cluster, table, global_batch=global_batch, seq=seq, dtype=dtype, index=idx, calibration=calibration,
            pricing=pricing,
        )  # fmt: skip
        base["uniform"] = uniform_baseline(ranked[0], model, cluster, table, idx, calibration, pricing)
    stats.wall_s = time.perf_counter() - t0
    return SearchResult(tuple(ranked), stats, base)


def _explore(
    passes: list[tuple[Folding | None, Stack, list]],
    classes: list[DeviceClass],
    model: ModelSpec,
    table: ProfileTable,
    space: SearchSpace,
    seq: int,
    dtype: str,
    calibration: Calibration | None,
    global_batch: int,
    top_k: int,
    found: list,
    stats: SearchStats,
    spent: Callable[[], float],
    budget_s: float,
    pricing: Pricing | None = None,
) -> float | None:
    """Explore the passes on one frontier (Explorer.share), adding their plans to `found` (a heap
    the explorers keep); None when complete, else the smallest lower bound left on the frontier."""
    exs: list[Explorer] = []
    # a pass recomputing every k-th block asks its stages without recompute of the k = 1 pass of its
    # folding (Pricer.plain): priced once for both
    plains: dict[tuple, Pricer] = {}
    for fold, variant, _ in passes:
        key = (id(fold), replace(variant, recompute_every=1))
        pr = Pricer(model, fold.classes if fold is not None else classes, table, dtype, seq, calibration, stack=variant,
                    plain=plains.get(key) if variant.recompute_every > 1 else None, pricing=pricing)  # fmt: skip
        if variant.recompute_every == 1:
            plains[key] = pr
        bounds = Bounds(pr, table, space, seq=seq, dtype=dtype, calibration=calibration, global_batch=global_batch)
        ex = Explorer(pr, bounds, space, global_batch, keep=top_k + 1)
        ex.found = found
        if exs:
            ex.share(exs[0])
        ex.tag = lambda c, v=variant: replace(
            c, recompute_every=v.recompute_every, sequence_parallel=v.sequence_parallel, fp8=v.fp8, cp=v.cp
        )
        if variant.recompute_every > 1:
            base = ex.prefixes
            ex.prefixes = lambda pp, base=base: [k for k in base(pp) if k > 0]  # k = 0 is the k = 1 pass's
        exs.append(ex)

    def over_budget() -> bool:
        # anytime: stop at the budget once something was found (a hard stop at 10× the budget)
        s = spent()
        return s > budget_s and (bool(found) or s > 10 * budget_s)

    tables: dict[int, ShapeTable] = {}  # passes of one folding share their shape list: encode it once
    for _, _, shapes in passes:
        if id(shapes) not in tables:
            tables[id(shapes)] = shape_table(shapes)
    for ex, (_, _, shapes) in zip(exs[1:], passes[1:], strict=True):
        ex.seed(shapes, tables[id(shapes)])
    left = exs[0].run(passes[0][2], over_budget, tables[id(passes[0][2])]) if exs else None
    for ex in exs:
        for name in ("shapes", "candidates", "pruned", "infeasible", "inner_solves"):
            setattr(stats, name, getattr(stats, name) + getattr(ex.counts, name))
    return left


def _shapes(model: ModelSpec, classes: list[DeviceClass], space: SearchSpace, max_dp: int, cp: int = 1) -> list:
    shapes = list(pipeline_shapes(model, classes, space, max_dp)) if "pipeline" in space.families else []
    if "replicas" in space.families:
        shapes += list(replica_shapes(model, classes, space, max_dp))
    if space.num_devices is not None:  # a folded device is cp physical ones
        shapes = [s for s in shapes if s.devices * cp == space.num_devices]
    return shapes


def stack_variants(space: SearchSpace, classes: list[DeviceClass], pricing: Pricing | None = None) -> list[Stack]:
    """The stacks the search prices, one exact pass each: recompute every k-th block (k = 1 first),
    with fp8 linears too when the space allows them and every class has an fp8 peak; sequence
    parallelism on (where tp > 1) when the space allows it and no class is CPU ranks, by dominance
    (SearchSpace). Under a runtime that brings its own stack (Pricing.restack) its attention, loss,
    dropout and sequence parallelism, as Pricing.dress puts them on the plans built; and its fp8
    weight cache where it keeps one (as estimate prices it)."""
    fp8s = [False] + ([True] if space.fp8 and all(c.spec.peak_fp8_flop_per_s for c in classes) else [])
    ks = [1] + sorted({k for k in space.recompute_every if k > 1} if space.recompute else set())
    sp = space.sequence_parallel and all(c.kind != "cpu" for c in classes)
    out = [Stack(sequence_parallel=sp, recompute_every=k, fp8=f) for f in fp8s for k in ks]
    if pricing is None:
        return out
    p, cached = pricing.profile, pricing.overlap.fp8_weight_cached
    if pricing.restack:
        kit = dict(attention=p.attention, loss=p.loss, dropout=p.dropout, sequence_parallel=p.sequence_parallel)
        out = [replace(s, **kit) for s in out]  # type: ignore[arg-type]
    return [replace(s, fp8_weight_cached=s.fp8 and cached) for s in out]


def _gap(stats: SearchStats, left_s: float | None, costs: list[float]) -> None:
    """Fill complete / best / unexplored bound / gap; `left_s` is the smallest lower bound left on the
    frontier when the budget cut the search (explore.Explorer.run), None when it ran to the end."""
    stats.best_s = min(costs) if costs else None
    if left_s is None:
        return
    if stats.best_s is not None and left_s >= stats.best_s:
        return  # nothing left could have beaten the best plan: the cut lost nothing
    stats.complete = False
    stats.unexplored_bound_s = left_s if math.isfinite(left_s) else None
    if stats.best_s is not None and stats.unexplored_bound_s is not None:
        stats.gap_fraction = (stats.best_s - left_s) / stats.best_s


def _fingerprint(
    gb: int,
    seq: int,
    dtype: str,
    k: int,
    space: SearchSpace,
    calib: Calibration | None = None,
    pricing: Pricing | None = None,
) -> str:
    extra = ([repr(calib)] if calib is not None else []) + ([repr(pricing)] if pricing is not None else [])
    blob = json.dumps([gb, seq, dtype, k, repr(space)] + extra, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
