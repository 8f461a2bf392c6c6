"""The device graph (networkx), derived from a ClusterSpec and never stored.

Devices hang off a per-node switch through the node's intra-node link; node switches hang off one
fabric vertex through the inter-node link (per-device bandwidth × devices on the node). This keeps
the graph linear in the number of devices (16,384 GPUs → ~18k vertices) instead of quadratic, and
the bandwidth between two devices is the narrowest edge on the path between them.
"""

from __future__ import annotations

import networkx as nx

from planner.specs.cluster import ClusterSpec, LinkSpec


def device_graph(cluster: ClusterSpec) -> nx.Graph:
    g = nx.Graph(name=cluster.name)
    g.add_node("fabric", role="fabric")
    node = 0
    for group, spec in enumerate(cluster.nodes):
        for _ in range(spec.count):
            sw = f"node{node}"
            g.add_node(sw, role="node", group=group, name=spec.name)
            inter = spec.inter_link
            g.add_edge(
                sw,
                "fabric",
                kind=inter.kind,
                latency_s=inter.latency_s,
                bandwidth_bytes_per_s=inter.bandwidth_bytes_per_s * spec.num_devices,
            )
            node += 1
    for dev in cluster.devices():
        spec = cluster.nodes[dev.group]
        g.add_node(
            dev.id,
            role="device",
            kind=dev.kind,
            node=dev.node,
            local=dev.local,
            memory_bytes=spec.memory_bytes,
            peak_flop_per_s=spec.peak_flop_per_s(),
        )
        _attach(g, dev.id, f"node{dev.node}", spec.intra_link)
    return g


def _attach(g: nx.Graph, a: object, b: object, link: LinkSpec) -> None:
    g.add_edge(a, b, kind=link.kind, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s, latency_s=link.latency_s)


def link_between(g: nx.Graph, a: int, b: int) -> LinkSpec:
    """The effective link between two devices.

    On one node: the intra-node link. Across nodes: the path device → node switch → fabric → node
    switch → device; one flow gets one device's share of each node's NICs, so the slowest of the two
    NIC shares and the two intra-node hops bounds it, and the latencies of the hops add up.
    """
    if a == b:
        raise ValueError("a device has no link to itself")
    na, nb = g.nodes[a]["node"], g.nodes[b]["node"]
    up_a, up_b = g.edges[a, f"node{na}"], g.edges[b, f"node{nb}"]
    if na == nb:
        return LinkSpec(
            kind=up_a["kind"], bandwidth_bytes_per_s=up_a["bandwidth_bytes_per_s"], latency_s=up_a["latency_s"]
        )
    nic_a, nic_b = g.edges[f"node{na}", "fabric"], g.edges[f"node{nb}", "fabric"]
    share_a = nic_a["bandwidth_bytes_per_s"] / (g.degree[f"node{na}"] - 1)
    share_b = nic_b["bandwidth_bytes_per_s"] / (g.degree[f"node{nb}"] - 1)
    bw = min(share_a, share_b, up_a["bandwidth_bytes_per_s"], up_b["bandwidth_bytes_per_s"])
    return LinkSpec(kind=nic_a["kind"], bandwidth_bytes_per_s=bw, latency_s=max(nic_a["latency_s"], nic_b["latency_s"]))
