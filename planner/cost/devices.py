"""O(1) facts about device ids: node group, node, kind, and the link between devices.

`DeviceIndex` answers what `planner.specs.topology.link_between` answers on the networkx graph, without
building the graph (16,384 GPUs → one bisect per lookup), so pricing a plan stays cheap at scale.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from planner.specs.cluster import ClusterSpec, NodeSpec


@dataclass(frozen=True, slots=True)
class Link:
    """Bandwidth per device per direction and per-message latency of a path (or a ring's worst hop)."""

    bandwidth_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True, slots=True)
class GroupInfo:
    index: int
    spec: NodeSpec
    first_id: int
    first_node: int

    @property
    def end_id(self) -> int:
        return self.first_id + self.spec.count * self.spec.num_devices


class DeviceIndex:
    """Device id → node group and node, and links between devices, by arithmetic on id ranges."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        groups: list[GroupInfo] = []
        dev = node = 0
        for g, spec in enumerate(cluster.nodes):
            groups.append(GroupInfo(g, spec, dev, node))
            dev += spec.count * spec.num_devices
            node += spec.count
        self.groups = tuple(groups)
        self.num_devices = dev
        self._starts = [g.first_id for g in groups]

    def group(self, device_id: int) -> GroupInfo:
        if not 0 <= device_id < self.num_devices:
            raise IndexError(device_id)
        return self.groups[bisect.bisect_right(self._starts, device_id) - 1]

    def node(self, device_id: int) -> int:
        g = self.group(device_id)
        return g.first_node + (device_id - g.first_id) // g.spec.num_devices

    def link(self, a: int, b: int) -> Link:
        """Same as topology.link_between: intra-node link on one node; across nodes the narrowest of
        the two per-device NIC shares and the two intra-node hops, at the larger NIC latency."""
        ga, gb = self.group(a).spec, self.group(b).spec
        if self.node(a) == self.node(b):
            return Link(ga.intra_link.bandwidth_bytes_per_s, ga.intra_link.latency_s)
        return cross_node_link([ga, gb])

    def ring_link(self, device_ids: list[int] | tuple[int, ...]) -> Link:
        """The slowest hop of a ring over `device_ids`: intra-node if they share a node, else the
        narrowest cross-node path among the node groups involved (each device uses its own NIC share)."""
        nodes = {self.node(d) for d in device_ids}
        if len(nodes) == 1:
            spec = self.group(device_ids[0]).spec
            return Link(spec.intra_link.bandwidth_bytes_per_s, spec.intra_link.latency_s)
        specs = {self.group(d).index: self.group(d).spec for d in device_ids}
        return cross_node_link(list(specs.values()))


def cross_node_link(specs: list[NodeSpec]) -> Link:
    """Path between nodes of the given groups: min over NIC shares and intra hops, max NIC latency."""
    bw = min(min(s.inter_link.bandwidth_bytes_per_s, s.intra_link.bandwidth_bytes_per_s) for s in specs)
    return Link(bw, max(s.inter_link.latency_s for s in specs))


def intra_link(spec: NodeSpec) -> Link:
    return Link(spec.intra_link.bandwidth_bytes_per_s, spec.intra_link.latency_s)
