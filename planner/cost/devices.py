"""O(1) facts about device ids: node group, node, kind, the link between devices and a ring's bandwidth.

`DeviceIndex` answers what `planner.specs.topology.link_between` answers on the networkx graph, without
building the graph (16,384 GPUs → one bisect per lookup), so pricing a plan stays cheap at scale.
A collective's `Link` is topology-true: a ring over k ranks per node on N nodes crosses the node's
NICs once per ring step, so its bandwidth is k NIC shares, not one (`cross_node_link`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from planner.cost.nccl import link_fraction, pcie_p2p_fraction
from planner.specs.cluster import ClusterSpec, NodeSpec


@dataclass(frozen=True, slots=True)
class Link:
    """Bandwidth and per-message latency of a path, or of a collective's ring: for a ring, the bus
    bandwidth (bytes per second each rank's sends advance at, so ring formulas apply unchanged) at
    its worst hop's latency, and the number of nodes it spans (NCCL's tree all-reduce needs it)."""

    bandwidth_bytes_per_s: float
    latency_s: float
    num_nodes: int = 1
    # what NCCL's tuning model needs (planner.cost.nccl); empty for CPU ranks (gloo, α–β formulas):
    intra_hw: str = ""  # the intra-node hop: "nvlink" or "pci"
    arch: str = ""  # the GPUs' architecture (catalog), which enables protocols
    nccl_bandwidth_bytes_per_s: float = 0.0  # the bus bandwidth at NCCL's rated link fractions (topo.h)


@dataclass(frozen=True, slots=True)
class GroupInfo:
    index: int
    spec: NodeSpec
    first_id: int
    first_node: int
    kind: int  # groups with equal node_kind share it: alike nodes (the search's device classes)

    @property
    def end_id(self) -> int:
        return self.first_id + self.spec.count * self.spec.num_devices


class DeviceIndex:
    """Device id → node group and node, and links between devices, by arithmetic on id ranges."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        groups: list[GroupInfo] = []
        kinds: dict[NodeSpec, int] = {}
        dev = node = 0
        for g, spec in enumerate(cluster.nodes):
            groups.append(GroupInfo(g, spec, dev, node, kinds.setdefault(node_kind(spec), len(kinds))))
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
            return intra_link(ga)
        return cross_node_link([ga, gb])

    def ring_link(self, device_ids: list[int] | tuple[int, ...]) -> Link:
        """A collective's ring over `device_ids`: intra-node if they share a node; across nodes of one
        node group, k = the fewest ranks any node holds, each node's k NIC shares carrying the ring
        (cross_node_link); across unlike nodes, one NIC share per rank (rings over unlike nodes are
        not rail-aligned, so nothing better is assumed). Node groups that differ only in name and
        count are alike (node_kind): one group, as the search's device classes see them."""
        # one pass, one bisect a device (a 16,384-GPU plan's dp rings hold thousands of ranks)
        starts, groups, n = self._starts, self.groups, self.num_devices
        nodes: list[int] = []
        specs: dict[int, NodeSpec] = {}
        for d in device_ids:
            if not 0 <= d < n:
                raise IndexError(d)
            g = groups[bisect.bisect_right(starts, d) - 1]
            nodes.append(g.first_node + (d - g.first_id) // g.spec.num_devices)
            specs[g.kind] = g.spec
        if len(set(nodes)) == 1:
            return intra_link(self.group(device_ids[0]).spec)
        if len(specs) > 1:
            return cross_node_link(list(specs.values()))
        return cross_node_link(
            list(specs.values()), ranks_per_node=ring_ranks_per_node(nodes), num_nodes=len(set(nodes))
        )


def node_kind(spec: NodeSpec) -> NodeSpec:
    """A node group's spec without its name and count: node groups of equal kind are alike nodes
    (one device class in the search, rail-aligned rings in a collective)."""
    return spec.model_copy(update={"name": "-", "count": 1})


def ring_ranks_per_node(nodes: list[int] | tuple[int, ...]) -> int:
    """Ranks of a collective on its least-populated node (the node that bounds the ring), given
    each rank's node."""
    counts: dict[int, int] = {}
    for n in nodes:
        counts[n] = counts.get(n, 0) + 1
    return min(counts.values())


def cross_node_link(specs: list[NodeSpec], ranks_per_node: int = 1, num_nodes: int = 1) -> Link:
    """Bus bandwidth of a ring over k = `ranks_per_node` ranks on each of N nodes (or of one
    cross-node path when k = 1), at the largest NIC latency.

    Derivation (NCCL's rings, Jeaugey, "NCCL 2.0", GTC 2017; nccl-tests doc/PERFORMANCE.md "bus
    bandwidth"): a ring over n = N·k ranks placed node-contiguously has n hops, N of them between
    nodes. Every ring step each rank sends one chunk, so a node sends k chunks per step: k − 1 over
    NVLink/PCIe and 1 over a NIC. NCCL runs k rings (channels) at once, rotated so that each of a
    node's k ranks leaves the node on its own NIC (rail-aligned), each ring carrying 1/k of the data.
    Per step a rank then sends 1/k of its chunk on its NIC and (k − 1)/k over the intra link: the
    ring advances at B = min(k·b_nic, b_intra·k/(k − 1)) per rank, where b_nic is one device's NIC
    share (LinkSpec bandwidth, per device). Each NIC is crossed once per ring step, not once per
    rank's share: a 2-node ring all-reduce over 8 + 8 ranks moves 2(n − 1)/n·S through each node's
    8 NICs together (tests pin this). With k = 1 (one rank per node, e.g. dp across tp groups) the
    ring gets one NIC share, bounded by the device's path to it: min(b_nic, b_intra), as before.
    k is capped at the node's devices (a node has no more NICs than that)."""
    bws, nccl_bws = [], []
    for s in specs:
        k = max(1, min(ranks_per_node, s.num_devices))
        share = k / (k - 1) if k > 1 else 1.0
        nic = k * s.inter_link.bandwidth_bytes_per_s
        intra = s.intra_link.bandwidth_bytes_per_s * share
        bws.append(min(nic, intra))
        # the same ring at NCCL's rated fraction of each link (planner.cost.nccl, topo.h)
        nic_r = nic * link_fraction(s.inter_link.kind)
        nccl_bws.append(min(nic_r, _nccl_intra_bw(s) * share))
    hw = {_intra_hw(s) for s in specs}
    arch = {s.gpu.architecture if s.gpu is not None else "" for s in specs}
    # num_nodes = 1 when unknown (a p2p path, a ring over unlike node groups): priced as a ring only
    return Link(
        min(bws),
        max(s.inter_link.latency_s for s in specs),
        num_nodes=num_nodes,
        intra_hw="pci" if "pci" in hw else hw.pop() if len(hw) == 1 else "",
        arch=arch.pop() if len(arch) == 1 else "",
        nccl_bandwidth_bytes_per_s=min(nccl_bws) if all(hw) else 0.0,
    )


def _intra_hw(spec: NodeSpec) -> str:
    """NCCL's kind of a node's intra hop: "nvlink" (NVLink, xGMI), "pci" (PCIe or unknown kinds on
    GPUs), "" on CPU ranks (gloo)."""
    if spec.device == "cpu":
        return ""
    return "nvlink" if spec.intra_link.kind.startswith(("nvlink", "xgmi")) else "pci"


def _nccl_intra_bw(spec: NodeSpec) -> float:
    """A node's intra link as NCCL's topology rates it: its kind's fraction of the line rate, and over
    PCIe the 6/5 TLP overhead of P2P through an Intel host bridge (no PCIe switch is stated)."""
    bw = spec.intra_link.bandwidth_bytes_per_s * link_fraction(spec.intra_link.kind)
    if spec.intra_link.kind.startswith("pcie"):
        bw *= pcie_p2p_fraction()
    return bw


def intra_link(spec: NodeSpec) -> Link:
    hw = _intra_hw(spec)
    return Link(
        spec.intra_link.bandwidth_bytes_per_s,
        spec.intra_link.latency_s,
        intra_hw=hw,
        arch=spec.gpu.architecture if spec.gpu is not None else "",
        nccl_bandwidth_bytes_per_s=_nccl_intra_bw(spec) if hw else 0.0,
    )
