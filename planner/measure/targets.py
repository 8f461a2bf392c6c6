"""What to profile and how to fill in devices that cannot be measured here (pure; no torch, no I/O).

The profile stage measures each *distinct* layer shape once per device kind — every block of a
model has the same shape, so 96 layers cost what 2 do — and prices device kinds that are not
present (planning an A100 cluster from a laptop) with `profiles.estimate_layer` from catalog peaks.
The efficiency of an estimate is calibrated only from measured devices of the same class: GPU
measurements calibrate GPU estimates. A CPU's achieved/peak ratio says nothing about tensor cores,
so with only CPU measurements GPUs get `DEFAULT_EFFICIENCY` (Megatron's reported MFU, see there).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from planner.errors import MeshplanError
from planner.measure.ops import BenchOp
from planner.measure.profiles import (
    DEFAULT_EFFICIENCY,
    CommFit,
    LayerProfile,
    ProfileKey,
    estimate_layer,
    fit_block_efficiency,
)
from planner.specs.catalog import lookup
from planner.specs.cluster import ClusterSpec
from planner.specs.flops import LAYER_KINDS, LayerKind
from planner.specs.model import ModelSpec

CPU = "cpu"


def is_gpu(device_kind: str) -> bool:
    return device_kind != CPU


def device_dtype(device_kind: str, cpu_dtype: str) -> str:
    """The dtype a device trains in: bf16 on GPUs (fp16 peaks stand in where bf16 is absent), config on CPU."""
    return cpu_dtype if not is_gpu(device_kind) else "bf16"


def validate_shapes(model: ModelSpec, mbs: Sequence[int], seq: Sequence[int], tp: Sequence[int]) -> None:
    """Reject shapes the layers cannot be built at, naming the field and a fix."""
    if not mbs or min(mbs) < 1:
        raise MeshplanError("profile.mbs", list(mbs), "give one or more micro-batch sizes >= 1, e.g. --mbs 1 2")
    if not tp or min(tp) < 1:
        raise MeshplanError("profile.tp", list(tp), "give one or more tp degrees >= 1, e.g. --tp 1 2")
    for s in seq:
        if not 1 <= s <= model.seq_len:
            raise MeshplanError(
                "profile.seq",
                s,
                f"must be in 1..{model.seq_len} (the model's seq_len, which sizes its position tables)",
            )
    for t in tp:
        kv = model.kv_heads
        if model.num_heads % t or model.ffn % t or model.padded_vocab % t or (kv % t and t % kv):
            raise MeshplanError(
                "profile.tp",
                t,
                f"must divide num_heads={model.num_heads}, ffn={model.ffn}, padded vocab="
                f"{model.padded_vocab} and kv heads={kv} (or be a multiple of it); pick a divisor",
            )


def profile_keys(
    device_kind: str,
    mbs: Iterable[int],
    seq: Iterable[int],
    tp: Iterable[int],
    dtype: str,
    recompute: Iterable[bool] = (False, True),
    layer_kinds: Iterable[LayerKind] = LAYER_KINDS,
) -> list[ProfileKey]:
    """Every key of the grid, in a stable order (cheap layer kinds first within a shape)."""
    grid = itertools.product(
        sorted(set(seq)), sorted(set(tp)), sorted(set(mbs)), tuple(layer_kinds), sorted(set(recompute))
    )
    return [ProfileKey(device_kind, k, b, s, t, r, dtype) for s, t, b, k, r in grid]


def shape_groups(keys: Iterable[ProfileKey]) -> dict[tuple[str, int, int], list[ProfileKey]]:
    """Keys grouped by (device kind, seq, tp): the unit one profiler subprocess measures."""
    out: dict[tuple[str, int, int], list[ProfileKey]] = {}
    for k in keys:
        out.setdefault((k.device_kind, k.seq_len, k.tp), []).append(k)
    return out


def device_peaks(cluster: ClusterSpec, device_kind: str, dtype: str) -> tuple[float, float]:
    """(peak FLOP/s, memory bytes/s) of a device kind as the cluster file states (or the catalog)."""
    for node in cluster.nodes:
        if node.device_kind == device_kind:
            return node.peak_flop_per_s(dtype), node.memory_bandwidth_bytes_per_s
    raise MeshplanError(
        "device_kind", device_kind, f"not in cluster {cluster.name}; kinds: {sorted(cluster.device_kinds())}"
    )


def catalog_peak(device_kind: str, dtype: str) -> float | None:
    """Datasheet peak of a measured device kind (None for CPUs and GPUs unknown to the catalog)."""
    if not is_gpu(device_kind):
        return None
    try:
        return lookup(device_kind).peak_flop_per_s(dtype)
    except MeshplanError:
        return None


def efficiency_for(
    model: ModelSpec, target_kind: str, measured: Iterable[LayerProfile], peaks: dict[str, float]
) -> tuple[float, str]:
    """(efficiency, how it was obtained) for estimating `target_kind`.

    Uses measured, non-recompute block rows of devices in the target's class whose peak is known
    (`peaks[device_kind]`); otherwise DEFAULT_EFFICIENCY.
    """
    pairs = [
        (r, peaks[r.key.device_kind])
        for r in measured
        if not r.estimated
        and r.key.layer_kind == "block"
        and not r.key.recompute
        and r.key.device_kind in peaks
        and is_gpu(r.key.device_kind) == is_gpu(target_kind)
    ]
    if not pairs:
        return DEFAULT_EFFICIENCY, "default"
    kinds = sorted({r.key.device_kind for r, _ in pairs})
    return fit_block_efficiency(model, pairs), f"calibrated on {', '.join(kinds)} ({len(pairs)} rows)"


def estimate_rows(
    model: ModelSpec, keys: Iterable[ProfileKey], peak_flop_per_s: float, memory_bytes_per_s: float, efficiency: float
) -> list[LayerProfile]:
    return [estimate_layer(model, k, peak_flop_per_s, memory_bytes_per_s, efficiency) for k in keys]


def comm_fits_from_snapshot(cluster: ClusterSpec, fits: Iterable[dict]) -> list[CommFit]:
    """CommFits per link kind and op: discovery's α–β fits (rows with op, link_class, alpha_s,
    beta_s_per_byte, r2) for the link kinds of that class, and for every link kind with no measured
    fit a point-to-point `send_recv` fit from its stated latency and bandwidth (measured=False)."""
    by_class: dict[str, set[str]] = {}
    stated: dict[str, tuple[float, float]] = {}
    for node in cluster.nodes:
        for link_class, link in (("intra-node", node.intra_link), ("inter-node", node.inter_link)):
            by_class.setdefault(link_class, set()).add(link.kind)
            stated[link.kind] = (link.latency_s, 1.0 / link.bandwidth_bytes_per_s)
    out: dict[tuple[str, str], CommFit] = {}
    for f in fits:
        for kind in sorted(by_class.get(f["link_class"], ())):
            out[(kind, f["op"])] = CommFit(
                kind, f["op"], float(f["alpha_s"]), float(f["beta_s_per_byte"]), True, f.get("r2")
            )
    measured_kinds = {k for k, _ in out}
    for kind, (alpha, beta) in sorted(stated.items()):
        if kind not in measured_kinds:
            out[(kind, BenchOp.SEND_RECV)] = CommFit(kind, BenchOp.SEND_RECV, alpha, beta, False)
    return sorted(out.values(), key=lambda c: (c.link_kind, c.op))
