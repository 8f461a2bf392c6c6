"""Exhaustive solver for tiny instances: the test oracle of the fast search.

It enumerates the search space from first principles — every ordered subset of device classes,
every tp per class, every dp, stage count, layer split (all compositions of L), batch-share vector
(all compositions of the micro-batches), schedule, sharding level, recompute prefix, and each stack
option (sequence parallelism off and on, recompute every k-th block, fp8) — builds
each Plan and prices it with `planner.cost.estimate`. Context parallelism: the same enumeration over
the cp-folded classes of each degree the space's rule admits (planner.search.cp). No bounds, no
pruning, no shared solver code: only the device placement rule (`build.stage_device_ids`, the
cp folding) and the cost model are shared.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations, permutations, product

from planner.cost.devices import DeviceIndex
from planner.cost.runtimes import Pricing, price
from planner.measure.calibrate import Calibration
from planner.measure.profiles import ProfileTable
from planner.search.build import Choice, build_plan
from planner.search.classes import device_classes
from planner.search.cp import Folding, cp_degrees, fold_classes
from planner.search.space import SearchSpace, Segment, Shape
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan, Provenance


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write `total` as an ordered sum of `parts` positive integers."""
    if parts == 1:
        if total >= 1:
            yield (total,)
        return
    for cuts in combinations(range(1, total), parts - 1):
        edges = (0, *cuts, total)
        yield tuple(edges[i + 1] - edges[i] for i in range(parts))


def _aligned(d: int, tp: int, g: int) -> bool:
    k = d * tp
    return g % k == 0 or k % g == 0


def oracle_shapes(
    model: ModelSpec, cluster: ClusterSpec, space: SearchSpace, dtype: str, classes: list | None = None
) -> Iterator[Shape]:
    classes = classes if classes is not None else device_classes(cluster)
    L = model.num_layers

    def tps(c):
        return [
            t for t in space.tps if c.devices_per_node % t == 0 and model.num_heads % t == 0 and model.kv_heads % t == 0
        ]

    for size in range(1, min(space.max_classes, len(classes)) + 1):
        for subset in combinations(classes, size):
            if "pipeline" in space.families:
                for perm in permutations(subset):
                    choices = list(product(*[tps(c) for c in perm]))
                    if size >= 3:
                        choices = [t for t in choices if len(set(t)) == 1]
                    for tp in choices:
                        for dp in range(1, min(c.num_devices // t for c, t in zip(perm, tp, strict=True)) + 1):
                            if not all(_aligned(dp, t, c.devices_per_node) for c, t in zip(perm, tp, strict=True)):
                                continue
                            ranges = [range(1, c.num_devices // (dp * t) + 1) for c, t in zip(perm, tp, strict=True)]
                            for counts in product(*ranges):
                                if sum(counts) <= L:
                                    yield Shape(
                                        "pipeline",
                                        tuple(Segment(c.index, k, t) for c, k, t in zip(perm, counts, tp, strict=True)),
                                        dp,
                                    )
            if "replicas" in space.families and size >= 2:
                common = set.intersection(*[set(tps(c)) for c in subset])
                for tp in sorted(common):
                    for pp in range(1, L + 1):
                        ranges = [range(1, c.num_devices // (pp * tp) + 1) for c in subset]
                        for ns in product(*ranges):
                            if all(_aligned(n, tp, c.devices_per_node) for c, n in zip(subset, ns, strict=True)):
                                groups = tuple((c.index, n) for c, n in zip(subset, ns, strict=True))
                                yield Shape("replicas", (Segment(subset[0].index, pp, tp),), sum(ns), groups)


def _stacks(space: SearchSpace, classes) -> list[tuple[bool, int, bool]]:
    """(sequence parallel, recompute every k, fp8) options, each value on its own (no dominance)."""
    sps = (False, True) if space.sequence_parallel and all(c.kind != "cpu" for c in classes) else (False,)
    fp8s = (False, True) if space.fp8 and all(c.spec.peak_fp8_flop_per_s for c in classes) else (False,)
    return list(product(sps, sorted({1, *space.recompute_every}), fp8s))


def oracle_search(
    model: ModelSpec,
    cluster: ClusterSpec,
    profiles: ProfileTable | None = None,
    *,
    global_batch: int,
    seq: int | None = None,
    dtype: str = "bf16",
    space: SearchSpace | None = None,
    calibration: Calibration | None = None,
    pricing: Pricing | None = None,
) -> Plan | None:
    """The cheapest feasible plan of the whole space (None when nothing fits), each plan priced under
    `pricing` (planner.cost.runtimes.price: a runtime's stack, kernels, overlap and fixed costs; None:
    planner.cost.estimate)."""
    space = space or SearchSpace()
    seq = seq or model.seq_len
    classes = device_classes(cluster)
    idx = DeviceIndex(cluster)
    best = _best(model, cluster, profiles, global_batch, seq, dtype, space, calibration, idx, classes, None, None,
                 pricing)  # fmt: skip
    for cp in cp_degrees(space, classes, seq, best is not None):
        fold = fold_classes(classes, cp)
        best = _best(model, cluster, profiles, global_batch, seq, dtype, space, calibration, idx, fold.classes, fold,
                     best, pricing)  # fmt: skip
    return best


def _best(
    model: ModelSpec,
    cluster: ClusterSpec,
    profiles: ProfileTable | None,
    global_batch: int,
    seq: int,
    dtype: str,
    space: SearchSpace,
    calibration: Calibration | None,
    idx: DeviceIndex,
    classes: list,
    fold: Folding | None,
    best: Plan | None,
    pricing: Pricing | None = None,
) -> Plan | None:
    """The cheapest of `best` and every plan over `classes` (cp-folded by `fold`)."""
    cp = fold.cp if fold is not None else 1
    for shape in oracle_shapes(model, cluster, space, dtype, classes):
        for mbs in space.micro_batch_sizes:
            if global_batch % mbs or global_batch // mbs < shape.dp:
                continue
            total = global_batch // mbs
            for sched, shard, k, (sp, every, f8) in product(
                space.schedules, space.shardings, range(shape.pp + 1), _stacks(space, classes)
            ):
                if (not space.recompute and k) or (every > 1 and not k):
                    continue
                vs = [1]
                if sched == "interleaved-1f1b":
                    if shape.family != "pipeline" or shape.pp < 2:
                        continue
                    vs = [v for v in space.virtual_stages if v >= 2 and model.num_layers >= shape.pp * v]
                for v in vs:
                    for split in compositions(model.num_layers, shape.pp * v):
                        for shares in compositions(total, shape.dp):
                            if v > 1 and any(x % shape.pp for x in shares):
                                continue  # Megatron's interleaved schedule needs m divisible by pp
                            choice = Choice(mbs, sched, shard, k, split, shares, v, every, sp, f8, cp)
                            plan = build_plan(
                                classes,
                                shape,
                                choice,
                                model=model.name,
                                cluster=cluster.name,
                                seq=seq,
                                dtype=dtype,
                                provenance=Provenance(algorithm="oracle"),
                                folding=fold,
                            )
                            if pricing is not None:
                                plan = pricing.dress(plan)
                            cost = price(plan, model, cluster, pricing, profiles=profiles, index=idx,
                                         calibration=calibration)  # fmt: skip
                            if cost.feasible and (best is None or cost.step_time_s < best.predicted.step_time_s):  # type: ignore[union-attr]
                                best = plan.model_copy(update={"predicted": cost})
    return best


__all__ = ["compositions", "oracle_search", "oracle_shapes"]
