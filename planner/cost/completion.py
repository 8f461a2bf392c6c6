"""Complete a ProfileTable for the keys a search or an estimate needs.

Measured rows (and rows scaled from a measured micro-batch size) are kept; every other key is
filled with an estimate from the device kind's datasheet figures (NodeSpec overrides win, so
measured CPU ranks work), marked `estimated`. When block rows were measured on device kinds of the
cluster, estimates take their achieved efficiency (`estimate_layer`, one efficiency for the
layer); when nothing was measured, a GPU's blocks and head are priced kernel by kernel from their
shapes on its roofline (planner.cost.compute), CPU ranks with DEFAULT_EFFICIENCY. Profiles are per
device kind (class), never per device.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from planner.cost.compute import Device, KernelEfficiency, compute_peak_flop_per_s, estimate_layer_from_shape
from planner.cost.fitted import DEFAULT_KERNELS
from planner.measure.profiles import (
    MissingProfileError,
    ProfileKey,
    ProfileTable,
    estimate_layer,
    fit_block_efficiency,
)
from planner.specs.cluster import ClusterSpec, NodeSpec
from planner.specs.model import ModelSpec


@dataclass(frozen=True, slots=True)
class ProfileNeed:
    """One (micro-batch size, seq, tp, recompute, dtype) combination a plan may use."""

    mbs: int
    seq: int
    tp: int
    recompute: bool
    dtype: str


def kind_specs(cluster: ClusterSpec) -> dict[str, NodeSpec]:
    """One NodeSpec per device kind (the first group of that kind supplies peaks for estimates)."""
    out: dict[str, NodeSpec] = {}
    for n in cluster.nodes:
        out.setdefault(n.device_kind, n)
    return out


def complete_profiles(
    model: ModelSpec,
    cluster: ClusterSpec,
    table: ProfileTable | None,
    needs: Iterable[ProfileNeed],
    kinds: Iterable[str] | None = None,
    kernels: KernelEfficiency | None = None,
) -> ProfileTable:
    """A new table holding `table`'s rows plus an estimate for every missing key of `needs`;
    `kernels` = the GEMM / attention efficiencies of shape-based estimates (planner.cost.fitted)."""
    kernels = kernels or DEFAULT_KERNELS
    specs = kind_specs(cluster)
    wanted = set(needs)
    out = ProfileTable(list(table) if table is not None else [])
    measured = [
        (r, specs[r.key.device_kind].peak_flop_per_s(r.key.dtype))
        for r in out
        if not r.estimated and r.key.device_kind in specs
    ]
    eff = fit_block_efficiency(model, measured)
    any_measured = any(r.key.layer_kind == "block" for r, _ in measured)
    measured_shapes = {replace(r.key, micro_batch_size=0) for r in out if not r.estimated}
    for kind in kinds if kinds is not None else specs:
        spec = specs[kind]
        # a GPU priced from shapes re-derives estimates handed in (e.g. stored by the profile flow
        # with one efficiency, planner.measure.targets): only measured rows are kept as they are
        from_shape = not any_measured and spec.device != "cpu"
        for need in wanted:
            for layer, rec in (("block", need.recompute), ("embedding", False), ("head", False)):
                key = ProfileKey(kind, layer, need.mbs, need.seq, need.tp, rec, need.dtype)  # type: ignore[arg-type]
                have = out.get(key)
                if have is not None and not (have.estimated and from_shape):
                    continue
                try:
                    # scale from a measured micro-batch size only; estimates are recomputed exactly
                    if replace(key, micro_batch_size=0) not in measured_shapes:
                        raise MissingProfileError(key)
                    out.add(out.lookup(key))
                except MissingProfileError:
                    peak, bw = spec.peak_flop_per_s(need.dtype), spec.memory_bandwidth_bytes_per_s
                    row = estimate_layer(model, key, peak, bw, eff)
                    if from_shape:
                        gpu = spec.gpu
                        arch = gpu.architecture if gpu else None
                        sustained = gpu.sustained_gemm_flop_per_s if gpu else None
                        dev = Device(
                            compute_peak_flop_per_s(peak, sustained, need.dtype),
                            bw,
                            gpu.num_sms if gpu else None,
                            arch,
                            kernels,
                        )
                        row = estimate_layer_from_shape(model, key, dev, row)
                    out.add(row)
    return out


def table_fingerprint(table: ProfileTable) -> str:
    """Stable id of the measured rows (estimates are derived, so they are left out)."""
    import hashlib

    rows = sorted(
        (str(r.key), round(r.forward_s, 12), round(r.backward_s, 12), r.activation_bytes)
        for r in table
        if not r.estimated
    )
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]
