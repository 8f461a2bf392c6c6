"""The degraded view of a cluster: what the cost model and search see once stragglers are measured.

A compute slowdown f of device d means d's layers take f× longer; a link slowdown g means d's
links move bytes g× slower. The cost model prices per device *kind* and per node group, so each
degraded device becomes its own one-device node group with its own kind (`"<kind>@slow<f>"`):

- the node holding a degraded device is split into one-device nodes, in id order, so every
  device keeps its id (plans refer to ids). Healthy pieces stay identical NodeSpecs, so the
  search's class grouping (classes merge equal specs) still sees one healthy class per kind.
- pieces of a split node really share that node, so their `inter_link` is the node's intra link
  (exact between pieces; optimistic only towards *other* nodes, and only for a split node).
- a slowed kind gets peak FLOP/s and memory bandwidth ÷ f, and every profile row of the healthy
  kind is copied with forward/backward × f, so measured profiles stay measured (just slower).
- a slowed link divides that device's intra and inter link bandwidth by g (cross-node paths take
  the min, so every transfer touching the device slows).
"""

from __future__ import annotations

from dataclasses import replace

from planner.measure.profiles import ProfileTable
from planner.specs.cluster import ClusterSpec, LinkSpec, NodeSpec


class DegradedNodeSpec(NodeSpec):
    """A NodeSpec whose device kind is renamed (same catalog device, its own profiles)."""

    kind_name: str = ""

    @property
    def device_kind(self) -> str:
        return self.kind_name or super().device_kind


def slow_kind(kind: str, factor: float) -> str:
    return f"{kind}@slow{factor:.2f}"


def _slow_link(link: LinkSpec, factor: float) -> LinkSpec:
    return link.model_copy(update={"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s / factor})


def _piece(spec: NodeSpec, dtype: str, compute: float, link: float) -> NodeSpec:
    """One device of `spec` as its own node, slowed by `compute` (FLOP/s) and `link` (bandwidth)."""
    base = {k: getattr(spec, k) for k in NodeSpec.model_fields}
    base.update(num_devices=1, count=1, inter_link=spec.intra_link)
    if link > 1.0:
        base.update(intra_link=_slow_link(spec.intra_link, link), inter_link=_slow_link(spec.intra_link, link))
    if compute <= 1.0:
        return NodeSpec(**base) if link <= 1.0 else DegradedNodeSpec(**base, kind_name=f"{spec.device_kind}@link")
    base.update(
        device_memory_bytes=spec.memory_bytes,
        device_peak_flop_per_s=spec.peak_flop_per_s(dtype) / compute,
        device_memory_bandwidth_bytes_per_s=spec.memory_bandwidth_bytes_per_s / compute,
        device_peak_fp8_flop_per_s=None if spec.peak_fp8_flop_per_s is None else spec.peak_fp8_flop_per_s / compute,
    )
    return DegradedNodeSpec(**base, kind_name=slow_kind(spec.device_kind, compute))


def degrade_cluster(
    cluster: ClusterSpec, compute: dict[int, float], link: dict[int, float], dtype: str = "bf16"
) -> ClusterSpec:
    """`cluster` with device d's compute slowed compute[d]× and its links link[d]× (ids preserved)."""
    hit = {d for d, f in compute.items() if f > 1.0} | {d for d, f in link.items() if f > 1.0}
    if not hit:
        return cluster
    nodes: list[NodeSpec] = []
    dev = 0
    for spec in cluster.nodes:
        n = spec.num_devices
        run = 0  # untouched whole nodes waiting to be emitted as one group
        for k in range(spec.count):
            ids = range(dev + k * n, dev + (k + 1) * n)
            if not hit.intersection(ids):
                run += 1
                continue
            if run:
                nodes.append(spec.model_copy(update={"name": f"{spec.name}.{k - run}", "count": run}))
                run = 0
            for i, d in enumerate(ids):
                p = _piece(spec, dtype, compute.get(d, 1.0), link.get(d, 1.0))
                nodes.append(p.model_copy(update={"name": f"{spec.name}.{k}.{i}"}))
        if run:
            nodes.append(spec.model_copy(update={"name": f"{spec.name}.{spec.count - run}", "count": run}))
        dev += spec.count * n
    return ClusterSpec.model_construct(name=f"{cluster.name}-degraded", nodes=tuple(nodes))


def degrade_profiles(table: ProfileTable | None, cluster: ClusterSpec) -> ProfileTable | None:
    """`table` plus, for every slowed kind of the degraded `cluster`, its healthy kind's rows × factor."""
    if table is None:
        return None
    out = ProfileTable(list(table))
    for spec in cluster.nodes:
        kind = spec.device_kind
        if "@slow" not in kind:
            continue
        healthy, _, f = kind.partition("@slow")
        for row in table:
            if row.key.device_kind == healthy:
                out.add(
                    replace(
                        row,
                        key=replace(row.key, device_kind=kind),
                        forward_s=row.forward_s * float(f),
                        backward_s=row.backward_s * float(f),
                    )
                )
    return out


def cpu_cluster(num_devices: int, peak_flop_per_s: float = 20e9, memory_bytes: int = 4 << 30) -> ClusterSpec:
    """A one-node cluster of `num_devices` CPU ranks on loopback (for runs without a discovered cluster)."""
    loop = LinkSpec(kind="gloo-loopback", bandwidth_bytes_per_s=2e9, latency_s=50e-6, source="typical loopback gloo")
    return ClusterSpec(
        name=f"cpu{num_devices}",
        nodes=(
            NodeSpec(
                name="cpu",
                device="cpu",
                num_devices=num_devices,
                intra_link=loop,
                inter_link=loop,
                device_memory_bytes=memory_bytes,
                device_peak_flop_per_s=peak_flop_per_s,
            ),
        ),
    )
