"""Snapshot → ClusterSpec: CPU ranks become measured devices, links come from the fits, and the
fingerprint depends on hardware identity only."""

import copy
import json
from pathlib import Path

import pytest

from planner.errors import MeshplanError, UnknownNameError
from planner.measure.discovery import (
    INTER,
    INTRA,
    check_snapshot,
    cluster_from_snapshot,
    device_rows,
    fit_snapshot,
    snapshot_fingerprint,
)

SIZES = [1 << 10, 1 << 16, 1 << 20, 1 << 22]
MEM = 24 * 2**30


def _probe(flop: float, mem_bw: float = 10e9, device: str = "cpu") -> dict:
    dtype = "fp32" if device == "cpu" else "bf16"
    return {
        "device": device,
        "matmul_flop_per_s": flop,
        "matmul_dtype": dtype,
        "matmul_size": 1024,
        "memory_bandwidth_bytes_per_s": mem_bw,
    }


def make_snapshot(nodes: dict[str, int], alpha_s: dict[str, float], bw: dict[str, float], gpus: dict | None = None):
    """A netbench-shaped snapshot with exact α–β times per link class (ranks numbered node-major)."""
    gpus = gpus or {}
    ranks, node_info, rank = [], {}, 0
    for name, n in nodes.items():
        node_gpus = (
            [
                {"index": i, "name": gpus[name], "memory_bytes": 80 * 2**30, "sm_count": 132, "capability": "9.0"}
                for i in range(n)
            ]
            if name in gpus
            else []
        )
        node_info[name] = {
            "node": name,
            "hostname": name,
            "cpu_model": "AMD EPYC",
            "num_cores": 2,
            "memory_bytes": MEM,
            "gpus": node_gpus,
            "nvlink": None,
            "ranks": [],
        }
        for local in range(n):
            device = f"cuda:{local}" if name in gpus else "cpu"
            ranks.append(
                {"rank": rank, "local_rank": local, "node": name, "probe": _probe(50e9 + rank * 1e9, device=device)}
            )
            node_info[name]["ranks"].append(rank)
            rank += 1
    node_of = {r["rank"]: r["node"] for r in ranks}
    meas = []
    for a in range(len(ranks)):
        for b in range(a + 1, len(ranks)):
            cls = INTRA if node_of[a] == node_of[b] else INTER
            for s in SIZES:
                meas.append(
                    {
                        "op": "send_recv",
                        "message_bytes": s,
                        "time_s": alpha_s[cls] + s / bw[cls],
                        "src": a,
                        "dst": b,
                        "num_ranks": 2,
                        "link_class": cls,
                    }
                )
    all_cls = INTRA if len(nodes) == 1 else INTER
    for s in SIZES:
        meas.append(
            {
                "op": "all_reduce",
                "message_bytes": s,
                "time_s": 2 * alpha_s[all_cls] + 2 * s / bw[all_cls],
                "src": None,
                "dst": None,
                "num_ranks": len(ranks),
                "link_class": all_cls,
            }
        )
    return {
        "version": 1,
        "created_at": "2026-12-02T00:00:00+00:00",
        "backend": "nccl" if gpus else "gloo",
        "world_size": len(ranks),
        "message_sizes": SIZES,
        "nodes": node_info,
        "ranks": ranks,
        "measurements": meas,
        "unsupported": [],
    }


def test_cpu_ranks_become_one_measured_cpu_node():
    snap = make_snapshot({"vm": 2}, {INTRA: 40e-6}, {INTRA: 3e9})
    cluster = cluster_from_snapshot(snap)
    (node,) = cluster.nodes
    assert (node.device, node.num_devices, node.count, node.measured) == ("cpu", 2, 1, True)
    assert node.device_memory_bytes == MEM // 2
    assert node.peak_flop_per_s() == pytest.approx(50.5e9)  # median of the two ranks' measured rates
    assert node.intra_link.kind == "gloo-loopback" and node.intra_link.measured
    assert node.intra_link.latency_s == pytest.approx(40e-6)
    assert node.intra_link.bandwidth_bytes_per_s == pytest.approx(3e9)
    assert not node.inter_link.measured  # one node: no inter-node pair was measured


def test_two_nodes_get_intra_and_inter_links_from_their_own_fits():
    snap = make_snapshot({"n0": 2, "n1": 2}, {INTRA: 10e-6, INTER: 80e-6}, {INTRA: 8e9, INTER: 1e9})
    cluster = cluster_from_snapshot(snap)
    assert cluster.num_nodes == 2 and cluster.num_devices == 4
    for node in cluster.nodes:
        assert node.intra_link.bandwidth_bytes_per_s == pytest.approx(8e9)
        assert node.inter_link.bandwidth_bytes_per_s == pytest.approx(1e9)
        assert node.inter_link.latency_s == pytest.approx(80e-6)
        assert node.intra_link.measured and node.inter_link.measured
    fits = {(f.op, f.link_class): f.fit for f in fit_snapshot(snap)}
    assert fits[("all_reduce", INTER)].alpha_s == pytest.approx(160e-6)
    assert fits[("send_recv", INTRA)].num_points == 2 * len(SIZES)  # two intra pairs, one per node


def test_gpus_keep_their_catalog_name_and_record_the_measured_rate():
    snap = make_snapshot({"g0": 2}, {INTRA: 5e-6}, {INTRA: 200e9}, gpus={"g0": "NVIDIA H100 80GB HBM3"})
    (node,) = cluster_from_snapshot(snap).nodes
    assert node.device == "H100-SXM5-80GB" and node.device_peak_flop_per_s is None
    assert node.intra_link.kind == "nccl-intra-node"
    rows = device_rows(snap)
    assert [r["measured_flop_per_s"] for r in rows] == [50e9, 51e9]
    assert rows[0]["peak_flop_per_s"] == pytest.approx(989e12)


def test_unknown_gpu_names_the_catalog_problem():
    snap = make_snapshot({"g0": 1}, {INTRA: 5e-6}, {INTRA: 1e9}, gpus={"g0": "NVIDIA Quantum Flux 9000"})
    with pytest.raises(UnknownNameError, match="not in the GPU catalog"):
        cluster_from_snapshot(snap)


def test_fingerprint_ignores_measured_values():
    snap = make_snapshot({"n0": 2, "n1": 1}, {INTRA: 10e-6, INTER: 80e-6}, {INTRA: 8e9, INTER: 1e9})
    other = copy.deepcopy(snap)
    for r in other["ranks"]:
        r["probe"]["matmul_flop_per_s"] *= 3
        r["probe"]["memory_bandwidth_bytes_per_s"] /= 2
    for m in other["measurements"]:
        m["time_s"] *= 7
    other["created_at"] = "2030-01-01T00:00:00+00:00"
    other["nodes"] = dict(reversed(list(other["nodes"].items())))  # order does not matter either
    assert snapshot_fingerprint(other) == snapshot_fingerprint(snap)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["nodes"]["n0"].update(memory_bytes=MEM * 2),
        lambda s: s["nodes"]["n0"].update(cpu_model="Intel Xeon"),
        lambda s: s["nodes"]["n0"].update(num_cores=64),
        lambda s: s["nodes"]["n0"]["ranks"].pop(),
        lambda s: s["nodes"].update(n2=dict(s["nodes"]["n1"], node="n2")),
    ],
)
def test_fingerprint_changes_with_hardware_identity(change):
    snap = make_snapshot({"n0": 2, "n1": 1}, {INTRA: 10e-6, INTER: 80e-6}, {INTRA: 8e9, INTER: 1e9})
    other = copy.deepcopy(snap)
    change(other)
    assert snapshot_fingerprint(other) != snapshot_fingerprint(snap)


def test_a_real_netbench_snapshot_converts():
    snap = json.loads((Path(__file__).parents[1] / "data" / "netbench_cpu_2ranks.json").read_text())
    cluster = cluster_from_snapshot(snap)
    assert cluster.num_devices == 2 and cluster.nodes[0].device == "cpu"
    assert cluster.nodes[0].intra_link.bandwidth_bytes_per_s > 1e6


def test_check_snapshot_rejects_foreign_json():
    with pytest.raises(MeshplanError, match="snapshot.measurements"):
        check_snapshot({"version": 1, "backend": "gloo", "world_size": 1, "nodes": {}, "ranks": []})
    snap = make_snapshot({"vm": 1}, {INTRA: 1e-6}, {INTRA: 1e9})
    with pytest.raises(MeshplanError, match="snapshot.version"):
        check_snapshot({**snap, "version": 99})


def test_single_rank_uses_memory_copy_bandwidth():
    snap = make_snapshot({"vm": 1}, {INTRA: 1e-6}, {INTRA: 1e9})
    (node,) = cluster_from_snapshot(snap).nodes
    assert node.intra_link.kind == "memcpy" and node.intra_link.bandwidth_bytes_per_s == pytest.approx(10e9)


def test_runtime_overhead_rows_are_kept_but_never_fitted_as_links():
    """The netbench's pipelining, FSDP2 and concurrency rows are calibration inputs, not transfers: even
    at two sizes (FSDP2's module rows) they get no α–β fit, while the collectives beside them still do."""
    snap = make_snapshot({"n0": 2}, {INTRA: 10e-6}, {INTRA: 8e9})
    extra = [
        {"op": op, "message_bytes": b, "time_s": t, "src": 0, "dst": 1, "num_ranks": 2, "link_class": INTRA}
        for op, b, t in (
            ("fsdp_module", 16384, 6e-3),
            ("fsdp_module", 4194304, 30e-3),
            ("fsdp_tensor", 16384, 1e-4),
            ("pipeline_microbatch", 1024, 2e-3),
            ("compute_alone", 0, 24e-3),
            ("compute_lockstep", 0, 30e-3),
            ("compute_free", 0, 25e-3),
        )
    ]
    snap["measurements"] += extra
    ops = {f.op for f in fit_snapshot(snap)}
    assert "all_reduce" in ops and "send_recv" in ops
    assert not ops & {
        "fsdp_module",
        "fsdp_tensor",
        "pipeline_microbatch",
        "compute_alone",
        "compute_lockstep",
        "compute_free",
    }
