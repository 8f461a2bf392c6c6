"""Complete a ProfileTable for the keys a search or an estimate needs.

Measured rows (and rows scaled from a measured micro-batch size) are kept; every other key is
filled with `estimate_layer` from the device kind's datasheet peaks (NodeSpec overrides win, so
measured CPU ranks work), marked `estimated`. The efficiency of those estimates is calibrated on the
measured block rows of device kinds present in the cluster, else DEFAULT_EFFICIENCY. Profiles are
per device kind (class), never per device.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

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
) -> ProfileTable:
    """A new table holding `table`'s rows plus an estimate for every missing key of `needs`."""
    specs = kind_specs(cluster)
    wanted = set(needs)
    out = ProfileTable(list(table) if table is not None else [])
    measured = [
        (r, specs[r.key.device_kind].peak_flop_per_s(r.key.dtype))
        for r in out
        if not r.estimated and r.key.device_kind in specs
    ]
    eff = fit_block_efficiency(model, measured)
    measured_shapes = {replace(r.key, micro_batch_size=0) for r in out if not r.estimated}
    for kind in kinds if kinds is not None else specs:
        spec = specs[kind]
        for need in wanted:
            for layer, rec in (("block", need.recompute), ("embedding", False), ("head", False)):
                key = ProfileKey(kind, layer, need.mbs, need.seq, need.tp, rec, need.dtype)  # type: ignore[arg-type]
                if out.get(key) is not None:
                    continue
                try:
                    # scale from a measured micro-batch size only; estimates are recomputed exactly
                    if replace(key, micro_batch_size=0) not in measured_shapes:
                        raise MissingProfileError(key)
                    out.add(out.lookup(key))
                except MissingProfileError:
                    out.add(
                        estimate_layer(
                            model, key, spec.peak_flop_per_s(need.dtype), spec.memory_bandwidth_bytes_per_s, eff
                        )
                    )
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
