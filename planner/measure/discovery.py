"""From a measured hardware snapshot (worker/netbench.py's JSON) to a ClusterSpec, fits and a fingerprint.

Pure: dicts in, specs and rows out. Each discovered node becomes a node group of count 1. CPU ranks
become devices of kind "cpu" whose memory is the node's memory split over its ranks and whose peak is
the measured one-thread matmul rate; GPUs keep their catalog name (and datasheet peak, which the
planner's efficiency factors are calibrated against), with the measured rate kept alongside in the
device rows. Links come from α–β fits of send/recv ping-pong per link class.

The fingerprint hashes identity only (node names, CPU model, cores, memory, GPU names and counts,
ranks per node), never measured values, so re-probing unchanged hardware finds the old snapshot.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from planner.errors import MeshplanError
from planner.measure.alphabeta import AlphaBeta, fit_alpha_beta
from planner.measure.ops import OVERHEAD_OPS, BenchOp
from planner.specs.catalog import lookup
from planner.specs.cluster import ClusterSpec, LinkSpec, NodeSpec

SNAPSHOT_VERSION = 1
INTRA, INTER = "intra-node", "inter-node"
_REQUIRED = ("version", "backend", "world_size", "nodes", "ranks", "measurements")


@dataclass(frozen=True, slots=True)
class OpFit:
    """The α–β fit of one operation (send_recv, all_reduce, ...) over one link class."""

    op: str
    link_class: str
    fit: AlphaBeta


def check_snapshot(snapshot: dict[str, Any]) -> None:
    """Reject what is not a netbench snapshot of a version this code reads."""
    for key in _REQUIRED:
        if key not in snapshot:
            raise MeshplanError(f"snapshot.{key}", None, "missing; not a meshplan netbench snapshot, rerun discovery")
    if snapshot["version"] != SNAPSHOT_VERSION:
        raise MeshplanError("snapshot.version", snapshot["version"], f"this meshplan reads version {SNAPSHOT_VERSION}")
    if not snapshot["ranks"]:
        raise MeshplanError("snapshot.ranks", [], "no ranks reported; rerun discovery")


def node_identity(
    node: str, cpu_model: str, num_cores: int, memory_bytes: int, gpu_names: list[str], num_ranks: int
) -> dict[str, Any]:
    """What identifies one node's hardware for reuse (no measured value may appear here)."""
    counts: dict[str, int] = defaultdict(int)
    for g in gpu_names:
        counts[g] += 1
    return {
        "node": node,
        "cpu_model": cpu_model,
        "num_cores": int(num_cores),
        "memory_bytes": int(memory_bytes),
        "gpus": dict(sorted(counts.items())),
        "num_ranks": int(num_ranks),
    }


def snapshot_identity(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    check_snapshot(snapshot)
    out = []
    for name, node in snapshot["nodes"].items():
        gpus = [g["name"] for g in node.get("gpus", [])]
        out.append(
            node_identity(name, node["cpu_model"], node["num_cores"], node["memory_bytes"], gpus, len(node["ranks"]))
        )
    return out


def hardware_fingerprint(identity: list[dict[str, Any]]) -> str:
    """A short stable hash of node identities, independent of their order."""
    blob = json.dumps(sorted(identity, key=lambda n: n["node"]), sort_keys=True)
    return "hw-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def snapshot_fingerprint(snapshot: dict[str, Any]) -> str:
    return hardware_fingerprint(snapshot_identity(snapshot))


def fit_snapshot(snapshot: dict[str, Any]) -> list[OpFit]:
    """One α–β fit per (op, link class) with at least two distinct message sizes (transfers only)."""
    points: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for m in snapshot["measurements"]:
        if m["op"] in OVERHEAD_OPS:
            continue
        points[(m["op"], m["link_class"])].append((m["message_bytes"], m["time_s"]))
    fits = []
    for (op, link_class), pts in sorted(points.items()):
        if len({size for size, _ in pts}) < 2:
            continue
        fits.append(OpFit(op, link_class, fit_alpha_beta([p[0] for p in pts], [p[1] for p in pts])))
    return fits


def _link_from_fit(kind: str, fit: OpFit, points: list[dict[str, Any]]) -> LinkSpec:
    bw = fit.fit.bandwidth_bytes_per_s
    if not math.isfinite(bw):
        # Times did not grow with size (noise dominated): the best observed size/time is the honest figure.
        bw = max(p["message_bytes"] / p["time_s"] for p in points if p["time_s"] > 0)
    return LinkSpec(
        kind=kind,
        bandwidth_bytes_per_s=bw,
        latency_s=min(fit.fit.alpha_s, 1.0),
        measured=True,
        source=f"discover: send/recv fit, {fit.fit.num_points} points, r²={fit.fit.r2:.3f}",
    )


def _links(snapshot: dict[str, Any], fits: list[OpFit], cpu: bool) -> tuple[LinkSpec, LinkSpec]:
    """(intra, inter) links; a class with no measured pair borrows the other's figures, unmarked as measured."""
    backend = snapshot["backend"]
    kinds = {INTRA: f"{backend}-loopback" if cpu else f"{backend}-intra-node", INTER: f"{backend}-inter-node"}
    found: dict[str, LinkSpec] = {}
    for f in fits:
        if f.op == BenchOp.SEND_RECV:
            pts = [m for m in snapshot["measurements"] if m["op"] == f.op and m["link_class"] == f.link_class]
            found[f.link_class] = _link_from_fit(kinds[f.link_class], f, pts)
    if not found:
        # One rank: nothing crosses a wire; the device's own copy bandwidth bounds any transfer.
        bw = statistics.median(r["probe"]["memory_bandwidth_bytes_per_s"] for r in snapshot["ranks"])
        link = LinkSpec(
            kind="memcpy",
            bandwidth_bytes_per_s=bw,
            latency_s=0.0,
            measured=True,
            source="discover: single rank, memory copy bandwidth",
        )
        return link, link
    for cls, other in ((INTRA, INTER), (INTER, INTRA)):
        if cls not in found:
            src = found[other]
            found[cls] = src.model_copy(
                update={
                    "kind": kinds[cls],
                    "measured": False,
                    "source": f"not measured (no {cls} pair): copy of the {other} fit",
                }
            )
    return found[INTRA], found[INTER]


def cluster_from_snapshot(snapshot: dict[str, Any], name: str | None = None) -> ClusterSpec:
    """The ClusterSpec a snapshot describes: one node group per discovered node."""
    check_snapshot(snapshot)
    fits = fit_snapshot(snapshot)
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in snapshot["ranks"]:
        by_node[r["node"]].append(r)
    nodes = []
    for node_name, node in snapshot["nodes"].items():
        ranks = by_node[node_name]
        cpu = all(r["probe"]["device"] == "cpu" for r in ranks)
        intra, inter = _links(snapshot, fits, cpu)
        flop = statistics.median(r["probe"]["matmul_flop_per_s"] for r in ranks)
        mem_bw = statistics.median(r["probe"]["memory_bandwidth_bytes_per_s"] for r in ranks)
        if cpu:
            nodes.append(
                NodeSpec(
                    name=node_name,
                    device="cpu",
                    num_devices=len(ranks),
                    intra_link=intra,
                    inter_link=inter,
                    device_memory_bytes=node["memory_bytes"] // len(ranks),
                    device_peak_flop_per_s=flop,
                    device_memory_bandwidth_bytes_per_s=mem_bw,
                    measured=True,
                )
            )
        else:
            gpu_names = {g["name"] for g in node["gpus"]}
            if len(gpu_names) != 1:
                raise MeshplanError(
                    f"nodes.{node_name}.gpus",
                    sorted(gpu_names),
                    "a node group holds one GPU kind; limit the ranks to one kind with CUDA_VISIBLE_DEVICES",
                )
            nodes.append(
                NodeSpec(
                    name=node_name,
                    device=lookup(gpu_names.pop()).name,
                    num_devices=len(ranks),
                    intra_link=intra,
                    inter_link=inter,
                    measured=True,
                )
            )
    return ClusterSpec(name=name or "discovered-" + "+".join(sorted(snapshot["nodes"]))[:60], nodes=tuple(nodes))


def device_rows(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per rank: node, local index, kind, memory and the measured speeds."""
    cluster = cluster_from_snapshot(snapshot)
    spec_of = {n.name: n for n in cluster.nodes}
    rows = []
    for r in sorted(snapshot["ranks"], key=lambda r: r["rank"]):
        spec = spec_of[r["node"]]
        p = r["probe"]
        rows.append(
            {
                "node": r["node"],
                "local_index": r["local_rank"],
                "rank": r["rank"],
                "kind": spec.device_kind,
                "memory_bytes": spec.memory_bytes,
                "peak_flop_per_s": spec.peak_flop_per_s(),
                "measured_flop_per_s": p["matmul_flop_per_s"],
                "matmul_dtype": p["matmul_dtype"],
                "memory_bandwidth_bytes_per_s": p["memory_bandwidth_bytes_per_s"],
            }
        )
    return rows


def spec_device_rows(cluster: ClusterSpec) -> list[dict[str, Any]]:
    """Device rows for a described (not measured) cluster: datasheet figures, nothing measured."""
    rows = []
    for dev in cluster.devices():
        spec = cluster.nodes[dev.group]
        rows.append(
            {
                "node": f"{spec.name}-{dev.node}" if spec.count > 1 else spec.name,
                "local_index": dev.local,
                "rank": dev.id,
                "kind": dev.kind,
                "memory_bytes": spec.memory_bytes,
                "peak_flop_per_s": spec.peak_flop_per_s(),
                "measured_flop_per_s": None,
                "matmul_dtype": None,
                "memory_bandwidth_bytes_per_s": None,
            }
        )
    return rows
