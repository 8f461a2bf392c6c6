"""Plan search: outer enumeration of shapes × an exact inner split solver, anytime, top-k.

`search(model, cluster, profiles, global_batch=..., ...)` returns a `SearchResult` (ranked Plans
with `predicted` filled by `planner.cost.estimate`, baselines, statistics) or a `NoFeasiblePlan`
with reasons — never None. Devices are handled as classes (`classes.py`), so the work grows with
the number of classes and the count options, not with the number of GPUs.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import time
from dataclasses import dataclass, field

from planner.cost import COST_MODEL_VERSION, estimate
from planner.cost import formulas as F
from planner.cost.completion import ProfileNeed, complete_profiles, table_fingerprint
from planner.cost.devices import DeviceIndex
from planner.errors import MeshplanError
from planner.measure.calibrate import Calibration
from planner.measure.profiles import LayerProfile, ProfileKey, ProfileTable
from planner.search.arrays import Pricer, StageSpec, dp_link, mix_prefix, stage_arrays
from planner.search.build import Choice, balanced_microbatches, build_plan
from planner.search.classes import DeviceClass, device_classes
from planner.search.infeasible import reasons, states_bytes, usable_bytes
from planner.search.inner import solve_split
from planner.search.interleave import chunk_layers, interleaved_arrays
from planner.search.replicas import solve_replicas
from planner.search.space import (
    SearchSpace,
    Segment,
    Shape,
    pipeline_shapes,
    recompute_prefixes,
    replica_shapes,
    valid_tps,
)
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan, Provenance

ALGORITHM = "meshplan-classes-dp-v1"
REPLICA_ORDER_PENALTY = 1.25


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


@dataclass(frozen=True, slots=True)
class _Found:
    cost_s: float
    shape: Shape
    choice: Choice


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
    time_budget_s: float = 10.0,
    space: SearchSpace | None = None,
    baselines: bool = True,
    calibration: Calibration | None = None,
) -> SearchResult | NoFeasiblePlan:
    t0 = time.perf_counter()
    space = space or SearchSpace()
    seq = seq or model.seq_len
    if global_batch <= 0:
        raise MeshplanError("global_batch", global_batch, "must be a positive number of samples")
    classes = device_classes(cluster, dtype)
    stats = SearchStats(num_devices=cluster.num_devices, num_classes=len(classes))
    if states_bytes(model, dtype) > usable_bytes(classes):
        # even ZeRO-3 over every device cannot hold weights, grads and Adam states: no need to search
        stats.wall_s = time.perf_counter() - t0
        return NoFeasiblePlan(reasons(model, cluster, classes, space, seq, dtype, global_batch, stats), stats)
    table = complete_profiles(model, cluster, profiles, _needs(model, classes, space, seq, dtype, global_batch))
    pr = Pricer(model, classes, table, dtype, seq, calibration)
    found: list[tuple[float, int, _Found]] = []  # max-heap of the best top_k + 1 by internal cost
    keep = top_k + 1
    L = model.num_layers
    mbs_opts = [b for b in space.micro_batch_sizes if global_batch % b == 0]
    max_dp = max((global_batch // b for b in mbs_opts), default=0)
    shapes = list(pipeline_shapes(model, classes, space, max_dp)) if "pipeline" in space.families else []
    if "replicas" in space.families:
        shapes += list(replica_shapes(model, classes, space, max_dp))
    interleaved = "interleaved-1f1b" in space.schedules and max(space.virtual_stages, default=1) > 1
    floor_memo: dict[tuple[int, int, int], float] = {}

    def a_floor(cls: int, tp: int, mbs: int) -> float:
        """A lower bound on a stage's per-block time: the cheaper profile row + TP all-reduces, no ZeRO-3."""
        key = (cls, tp, mbs)
        if key not in floor_memo:
            c = classes[cls]
            recs = (False, True) if space.recompute else (False,)
            fit = calibration.fit("all_reduce") if calibration is not None else None
            if fit is not None:  # as stage_coeffs prices them
                ar = fit.time_s(pr.hidden_bytes(mbs), tp)
            else:
                ar = F.ring_allreduce_s(pr.hidden_bytes(mbs), tp, c.intra.bandwidth_bytes_per_s, c.intra.latency_s)
            rows = [table.lookup(ProfileKey(c.kind, "block", mbs, seq, tp, r, dtype)) for r in recs]

            def slow(r: LayerProfile) -> float:  # as stage_coeffs slows a block row
                return calibration.slowdown(r.tp_comm_included) if calibration is not None else 1.0

            # a row timed on a real tp group holds its all-reduces already (stage_coeffs adds none)
            floor_memo[key] = min(slow(r) * r.train_s + (0.0 if r.tp_comm_included else 4 * ar) for r in rows)
        return floor_memo[key]

    dom_memo: dict[tuple[int, int, int], bool] = {}

    def recompute_dominated(shape: Shape, mbs: int) -> bool:
        """True when full recompute cannot pay off without memory pressure: it adds at least as much
        time per block as it lengthens the backward that hides the gradient sync (DP_OVERLAP_FRACTION)."""
        out = True
        for g in (
            shape.segments
            if shape.family == "pipeline"
            else [Segment(c, 0, shape.segments[0].tp) for c, _ in shape.groups]
        ):
            key = (g.cls, g.tp, mbs)
            if key not in dom_memo:
                c = classes[g.cls]
                plain, rec = (
                    table.lookup(ProfileKey(c.kind, "block", mbs, seq, g.tp, r, dtype)) for r in (False, True)
                )
                d_train, d_bwd = rec.train_s - plain.train_s, rec.backward_s - plain.backward_s
                dom_memo[key] = d_train >= 0 and d_train >= F.DP_OVERLAP_FRACTION * d_bwd
            out = out and dom_memo[key]
        return out

    def shape_bound(shape: Shape, mbs: int) -> float:
        """A cheap lower bound on any candidate of the shape: compute and TP traffic only."""
        total_mb = global_batch // mbs
        if shape.family == "pipeline":
            a = [(a_floor(g.cls, g.tp, mbs), g.stages) for g in shape.segments]
            m0 = math.ceil(total_mb / shape.dp)
            # pipeline term w·Σ τ + (m − w)·max τ: w = 1 for 1F1B/GPipe, 1/v for interleaved (the smaller)
            w = 1.0 / max(space.virtual_stages) if interleaved and shape.pp >= 2 else 1.0
            return w * L * min(x for x, _ in a) + (m0 - w) * L / sum(k / x for x, k in a)
        # each replica's bottleneck stage holds ≥ L/pp blocks: the pool drains M micro-batches no faster
        # and its first micro-batch passes all pp stages: T ≥ (M + dp·(pp − 1)) / Σ n_c·pp/(L·a_c)
        rate = sum(n * shape.pp / (L * a_floor(c, shape.segments[0].tp, mbs)) for c, n in shape.groups)
        return (total_mb + shape.dp * (shape.pp - 1)) / rate

    # best-first: shapes in order of their bound, so good plans come early and the rest is pruned
    ranked = []
    for i, sh in enumerate(shapes):
        bounds = [shape_bound(sh, b) for b in mbs_opts if global_batch // b >= sh.dp]
        if bounds:
            ranked.append((min(bounds), i, sh))
    # order (not pruning): kind-pure replica shapes cost ~10× more to evaluate and their pool bound is
    # the loosest, so equal bounds go to pipelines first; the break below still uses the true bound
    ranked = sorted(
        ((lb * (REPLICA_ORDER_PENALTY if sh.family == "replicas" else 1.0), i, lb, sh) for lb, i, sh in ranked)
    )
    # GPipe prices like 1F1B and holds more activations, so it is searched only without 1F1B
    schedules = ["1f1b"] if "1f1b" in space.schedules else [s for s in space.schedules if s == "gpipe"]
    schedules += [s for s in space.schedules if s == "interleaved-1f1b"]
    shardings = [s for s in space.shardings if not (s == "zero1" and "zero2" in space.shardings)]
    seq_no = 0

    def bound() -> float:
        return -found[0][0] if len(found) >= keep else math.inf

    def record(cost: float, shape: Shape, choice: Choice) -> None:
        nonlocal seq_no
        seq_no += 1
        item = (-cost, seq_no, _Found(cost, shape, choice))
        if len(found) < keep:
            heapq.heappush(found, item)
        elif cost < -found[0][0]:
            heapq.heapreplace(found, item)

    def over_budget() -> bool:
        # anytime: stop at the budget once something was found (a hard stop at 10× the budget)
        spent = time.perf_counter() - t0
        return spent > time_budget_s and (bool(found) or spent > 10 * time_budget_s)

    for pos, (key, _, shape_lb, shape) in enumerate(ranked):
        if key / REPLICA_ORDER_PENALTY >= bound():
            stats.pruned += len(ranked) - pos  # every later shape's bound is ≥ key / penalty
            break
        if shape_lb >= bound():
            stats.pruned += 1
            continue
        if over_budget():
            stats.timed_out = True
            break
        stats.shapes += 1
        for mbs in mbs_opts:
            if over_budget():
                stats.timed_out = True
                break
            total_mb = global_batch // mbs
            if total_mb < shape.dp:
                continue
            if shape_bound(shape, mbs) >= bound():
                stats.pruned += 1
                continue
            for sharding in shardings if shape.dp > 1 else ["none"]:
                nothing_fits = False  # 1F1B with full recompute does not fit: interleaved holds even more
                for schedule in schedules:
                    if schedule == "interleaved-1f1b":
                        if nothing_fits:
                            continue
                        _search_interleaved(
                            pr,
                            shape,
                            mbs,
                            sharding,
                            total_mb,
                            L,
                            space,
                            stats,
                            bound,
                            record,
                            recompute_dominated(shape, mbs),
                        )
                        continue
                    both = None
                    for k in recompute_prefixes(shape.pp, space.exhaustive_below) if space.recompute else [0]:
                        stats.candidates += 1
                        if shape.family == "replicas":
                            stats.inner_solves += 1
                            res = solve_replicas(
                                pr,
                                shape,
                                mbs=mbs,
                                schedule=schedule,
                                sharding=sharding,
                                k=k,
                                total_mb=total_mb,
                                num_layers=L,
                            )
                            if res is None:
                                stats.infeasible += 1
                                continue
                            record(res[0], shape, Choice(mbs, schedule, sharding, k, res[1], res[2]))
                            if k == 0 and res[3] and recompute_dominated(shape, mbs):
                                break  # memory never binds: recomputing can only add time
                            continue
                        m = math.ceil(total_mb / shape.dp)
                        if both is None:
                            both = [
                                _pipeline_arrays(pr, shape, mbs, schedule, sharding, kk, m, L)[0]
                                for kk in (0, shape.pp)
                            ]
                            loosest = both[1] if space.recompute else both[0]
                            caps = loosest.mem_ok.sum(axis=1)
                            if (caps < 1).any() or caps.sum() < L:
                                stats.infeasible += 1  # not even full recompute fits: skip every prefix
                                nothing_fits = space.recompute and shape.family == "pipeline"
                                break
                        arr = mix_prefix(both[0], both[1], k)
                        if _lower_bound(arr, L, m) >= bound():
                            stats.pruned += 1
                            if k == 0 and arr.mem_ok.all() and recompute_dominated(shape, mbs):
                                break
                            continue
                        stats.inner_solves += 1
                        sol = solve_split(arr, L, m, bound())
                        if sol is None:
                            stats.infeasible += 1
                            continue
                        mb = balanced_microbatches(total_mb, shape.dp)
                        record(sol.cost_s, shape, Choice(mbs, schedule, sharding, k, sol.layers, mb))
                        if k == 0 and arr.mem_ok.all() and recompute_dominated(shape, mbs):
                            break  # memory never binds: recomputing can only add time
    stats.wall_s = time.perf_counter() - t0
    if not found:
        return NoFeasiblePlan(reasons(model, cluster, classes, space, seq, dtype, global_batch, stats), stats)
    prov = Provenance(
        algorithm=ALGORITHM,
        cost_model_version=COST_MODEL_VERSION,
        config_fingerprint=_fingerprint(global_batch, seq, dtype, top_k, space, calibration),
        profile_fingerprint=table_fingerprint(table),
        cluster_fingerprint=cluster.fingerprint(),
        model_fingerprint=model.fingerprint(),
    )
    idx = DeviceIndex(cluster)
    plans: dict[str, Plan] = {}
    for _, _, f in sorted(found, key=lambda x: (-x[0], x[1])):
        plan = build_plan(
            classes, f.shape, f.choice, model=model.name, cluster=cluster.name, seq=seq, dtype=dtype, provenance=prov
        )
        cost = estimate(plan, model, cluster, table, idx, calibration)
        if cost.feasible and plan.fingerprint() not in plans:
            plans[plan.fingerprint()] = plan.model_copy(update={"predicted": cost})
    ranked = sorted(plans.values(), key=lambda p: p.predicted.step_time_s)[:top_k]  # type: ignore[union-attr]
    base = {}
    if baselines:
        from planner.search.baselines import megatron_baseline, uniform_baseline

        base["megatron"] = megatron_baseline(
            model, cluster, table, global_batch=global_batch, seq=seq, dtype=dtype, index=idx, calibration=calibration
        )
        base["uniform"] = uniform_baseline(ranked[0], model, cluster, table, index=idx, calibration=calibration)
    stats.wall_s = time.perf_counter() - t0
    return SearchResult(tuple(ranked), stats, base)


def _used_peak(peaks: list[float], s: Shape) -> float:
    if s.family == "pipeline":
        return sum(peaks[g.cls] * g.stages * g.tp * s.dp for g in s.segments)
    tp, pp = s.segments[0].tp, s.pp
    return sum(peaks[c] * n * tp * pp for c, n in s.groups)


def _pipeline_stages(pr: Pricer, shape: Shape) -> tuple[list[StageSpec], list]:
    stages, links = [], []
    for seg in shape.segments:
        c = pr.classes[seg.cls]
        w = shape.dp * seg.tp
        ln = dp_link(c, w, False, [])
        for s in range(seg.stages):
            stages.append(StageSpec(seg.cls, seg.tp, s, w))
            links.append(ln)
    return stages, links


def _search_interleaved(pr, shape, mbs, sharding, total_mb, L, space, stats, bound, record, dominated: bool) -> None:
    """Interleaved 1F1B candidates of a pipeline shape (Megatron needs m divisible by pp, equal m per replica)."""
    pp = shape.pp
    if shape.family != "pipeline" or pp < 2 or total_mb % shape.dp or (total_mb // shape.dp) % pp:
        return
    m = total_mb // shape.dp
    ranks, links = _pipeline_stages(pr, shape)
    for v in space.virtual_stages:
        if v < 2 or L < pp * v:
            continue
        for k in recompute_prefixes(pp, space.exhaustive_below) if space.recompute else [0]:
            stats.candidates += 1
            arr = interleaved_arrays(
                pr, ranks, links, L, mbs=mbs, sharding=sharding, dp=shape.dp, recompute_prefix=k, m=m, v=v
            )
            stats.inner_solves += 1
            sol = solve_split(arr, L - pp * (v - 1), m, bound(), 1.0 / v, m - 1.0 / v)
            if sol is None:
                stats.infeasible += 1
                continue
            per_rank = tuple(n + v - 1 for n in sol.layers)
            mb = balanced_microbatches(total_mb, shape.dp)
            record(sol.cost_s, shape, Choice(mbs, "interleaved-1f1b", sharding, k, chunk_layers(per_rank, v), mb, v))
            if k == 0 and arr.mem_ok.all() and dominated:
                break


def _pipeline_arrays(pr: Pricer, shape: Shape, mbs: int, schedule: str, sharding: str, k: int, m: int, L: int):
    stages, links = _pipeline_stages(pr, shape)
    return stage_arrays(
        pr, stages, L, mbs=mbs, schedule=schedule, sharding=sharding, dp=shape.dp, recompute_prefix=k, m=m, dplink=links
    )


def _lower_bound(arr, L: int, m: int) -> float:
    """Σ τ ≥ L·min a + Σ b, and max τ ≥ (L + Σ b/a) / Σ 1/a (stages paced to one bound X hold
    n_i ≤ (X − b_i)/a_i blocks, and they must hold L)."""
    inv = 1.0 / arr.a
    return L * float(arr.a.min()) + float(arr.b.sum()) + (m - 1) * (L + float((arr.b * inv).sum())) / float(inv.sum())


def _fingerprint(gb: int, seq: int, dtype: str, k: int, space: SearchSpace, calib: Calibration | None = None) -> str:
    blob = json.dumps([gb, seq, dtype, k, repr(space)] + ([repr(calib)] if calib is not None else []), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
