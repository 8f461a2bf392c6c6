"""Device classes: node groups with identical devices and links merged into one class.

A class is (device kind × devices per node × memory × peak × links). The search reasons about
classes and device counts, never about individual devices, so 16,384 GPUs of three kinds are
three classes; device ids are generated only for the plans returned, from id ranges.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.devices import Link, cross_node_link, intra_link, node_kind
from planner.specs.cluster import ClusterSpec, NodeSpec


@dataclass(frozen=True, slots=True)
class DeviceClass:
    index: int
    spec: NodeSpec
    num_nodes: int
    id_ranges: tuple[tuple[int, int], ...]

    @property
    def kind(self) -> str:
        return self.spec.device_kind

    @property
    def devices_per_node(self) -> int:
        return self.spec.num_devices

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.spec.num_devices

    @property
    def memory_bytes(self) -> int:
        return self.spec.memory_bytes

    def peak(self, dtype: str) -> float:
        return self.spec.peak_flop_per_s(dtype)

    @property
    def intra(self) -> Link:
        return intra_link(self.spec)

    @property
    def inter(self) -> Link:
        return cross_node_link([self.spec])

    def ids(self, start: int, count: int) -> list[int]:
        """Real device ids of class-local offsets [start, start + count), in class order."""
        out: list[int] = []
        for lo, hi in self.id_ranges:
            size = hi - lo
            if start < size and count > 0:
                take = min(count, size - start)
                out.extend(range(lo + start, lo + start + take))
                count -= take
                start = 0
            else:
                start -= size
        assert count == 0, "class offsets out of range"
        return out


def device_classes(cluster: ClusterSpec) -> list[DeviceClass]:
    """Classes (node_kind: node groups equal but for name and count) in order of first appearance;
    each keeps its node groups' id ranges in id order."""
    found: dict[NodeSpec, tuple[NodeSpec, int, list[tuple[int, int]]]] = {}
    dev = 0
    for spec in cluster.nodes:
        n = spec.count * spec.num_devices
        k = node_kind(spec)
        if k in found:
            s, nodes, ranges = found[k]
            found[k] = (s, nodes + spec.count, ranges + [(dev, dev + n)])
        else:
            found[k] = (spec, spec.count, [(dev, dev + n)])
        dev += n
    return [DeviceClass(i, s, nodes, tuple(r)) for i, (s, nodes, r) in enumerate(found.values())]
