"""The typed "nothing fits" answer: quick global checks and one reason per violated constraint."""

from __future__ import annotations

from planner.cost import formulas as F
from planner.search.classes import DeviceClass
from planner.search.space import SearchSpace, valid_tps
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec


def usable_bytes(classes: list[DeviceClass]) -> float:
    """What all devices can allocate after the runtime reserve and fragmentation."""
    return sum(
        max(0.0, (c.memory_bytes - F.runtime_reserve_bytes(c.kind)) / (1 + F.FRAGMENTATION_FRACTION)) * c.num_devices
        for c in classes
    )


def states_bytes(model: ModelSpec, dtype: str) -> float:
    """Weights, grads and Adam states of the whole model (16 B/param), however they are sharded."""
    return model.num_params() * F.state_bytes_per_param(dtype, "zero3", 1)


def reasons(
    model: ModelSpec,
    cluster: ClusterSpec,
    classes: list[DeviceClass],
    space: SearchSpace,
    seq: int,
    dtype: str,
    gb: int,
    stats,
) -> tuple[str, ...]:
    gib = 2**30
    out = []
    usable = usable_bytes(classes)
    states = states_bytes(model, dtype)
    per_dev = states / cluster.num_devices + F.runtime_reserve_bytes(classes[0].kind)
    biggest = max(c.memory_bytes for c in classes)
    if states > usable:
        out.append(
            f"{model.name} needs ≥ {per_dev / gib:.0f} GiB per device even spread over all {cluster.num_devices} devices "
            f"({model.num_params() / 1e9:.1f}B params × 16 B of weights, grads and Adam states = {states / gib:.0f} GiB); "
            f"the largest device has {biggest / gib:.0f} GiB and the cluster {usable / gib:.0f} GiB usable"
        )
    if not [b for b in space.micro_batch_sizes if gb % b == 0]:
        out.append(f"global batch {gb} is not a multiple of any micro-batch size in {space.micro_batch_sizes}")
    tps = {t for c in classes for t in valid_tps(model, c, space)}
    if not tps:
        out.append(
            f"no tensor-parallel degree divides heads={model.num_heads}, kv heads={model.kv_heads} and a node size"
        )
    if stats.timed_out:
        out.append(f"the search stopped at its time budget after {stats.shapes} shapes; raise the budget")
    if not out:
        out.append(
            f"no layout of {model.name} (seq {seq}, batch {gb}) fits the memory of {cluster.name}: every candidate "
            f"({stats.candidates}) exceeded a device's capacity even with full recompute and ZeRO-3"
        )
    return tuple(out)
