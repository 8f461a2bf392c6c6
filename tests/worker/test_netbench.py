"""The network bench under real torchrun: two simulated nodes on loopback (gloo, one CPU rank each)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from planner.measure.discovery import INTER, cluster_from_snapshot, snapshot_fingerprint
from tests.support import procs as procs_
from tests.support.served import free_port

TIMEOUT_S = 180


@pytest.mark.dist
def test_two_simulated_nodes_measure_an_inter_node_link(tmp_path):
    out = tmp_path / "snapshot.json"
    port = free_port()
    procs = []
    for node_rank in (0, 1):
        cmd = [
            "timeout",
            "-k",
            "10",
            str(TIMEOUT_S),
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(node_rank),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "netbench-test",
            "--max-restarts",
            "0",
            "-m",
            "worker.netbench",
            "--out",
            str(out),
            "--message-sizes",
            "1024,65536,1048576",
            "--repeats",
            "3",
            "--matmul-size",
            "256",
        ]
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "MESHPLAN_NODE_NAME": f"sim{node_rank}",
            "PYTHONWARNINGS": "ignore",
        }
        procs.append(procs_.start(cmd, env=env, cwd=tmp_path, capture=True, merge_stderr=True))
    logs = [p.communicate(timeout=TIMEOUT_S + 30)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        pytest.fail("torchrun failed:\n" + "\n---\n".join(log[-4000:] for log in logs))

    snap = json.loads(out.read_text())
    assert sorted(snap["nodes"]) == ["sim0", "sim1"] and snap["world_size"] == 2 and snap["backend"] == "gloo"
    # c10d rendezvous assigns node ranks by arrival, so either launcher may hold rank 0.
    assert {r["node"] for r in snap["ranks"]} == {"sim0", "sim1"}
    # each node's resident runtime (worker.netbench.runtime_rss_bytes): torch, the training runtime's
    # modules and a warm-up step, ~330 MB on CPU; storage reads it as the measured runtime reserve
    assert all(200 * 2**20 < n["runtime_rss_bytes"] < 2**30 for n in snap["nodes"].values())
    pairs = [m for m in snap["measurements"] if m["op"] == "send_recv"]
    assert pairs and {m["link_class"] for m in pairs} == {INTER}
    assert {m["message_bytes"] for m in pairs} == {1024, 65536, 1048576}
    ops = {m["op"] for m in snap["measurements"]} | {u["op"] for u in snap["unsupported"]}
    assert ops == {
        "send_recv",
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "pipeline_microbatch",
        "fsdp_module",
        "fsdp_tensor",
        "compute_alone",
        "compute_free",
        "compute_lockstep",
    }
    # one trivial 2-stage 1F1B step of torch.distributed.pipelining between the two ranks
    (pipe,) = [m for m in snap["measurements"] if m["op"] == "pipeline_microbatch"]
    assert pipe["link_class"] == INTER and pipe["num_ranks"] == 2 and 0 < pipe["time_s"] < 1.0
    # FSDP2's own cost per ZeRO-3 module step at two module sizes (a real all-gather pair and
    # reduce-scatter over gloo each), and per further tensor (may round to 0)
    mods = sorted((m["message_bytes"], m["time_s"]) for m in snap["measurements"] if m["op"] == "fsdp_module")
    assert [b for b, _ in mods] == [64 * 64 * 4, 1024 * 1024 * 4] and all(0 < t < 1.0 for _, t in mods)
    (tensor,) = [m for m in snap["measurements"] if m["op"] == "fsdp_tensor"]
    assert 0 <= tensor["time_s"] < mods[0][1]
    # matmul chunks timed on rank 0 alone, on both ranks free and with a barrier after each (bare
    # barrier's time removed): one row each, over min(ranks, cores) ranks
    conc = [m for m in snap["measurements"] if m["op"] in ("compute_alone", "compute_free", "compute_lockstep")]
    assert len(conc) == 3 and all(m["link_class"] == INTER for m in conc)
    assert {m["num_ranks"] for m in conc} == {min(2, len(os.sched_getaffinity(0)))}
    times = {m["op"]: m["time_s"] for m in conc}
    assert 0 < times["compute_alone"] < 1.0 and 0 < times["compute_free"] < 1.0
    assert 0 <= times["compute_lockstep"] < 1.0
    assert all(m["time_s"] > 0 for m in snap["measurements"] if m["op"] not in ("fsdp_tensor", "compute_lockstep"))
    assert all(r["probe"]["matmul_flop_per_s"] > 1e6 for r in snap["ranks"])

    cluster = cluster_from_snapshot(snap)
    assert cluster.num_nodes == 2
    assert all(n.inter_link.measured and n.inter_link.kind == "gloo-inter-node" for n in cluster.nodes)
    assert snapshot_fingerprint(snap).startswith("hw-")
