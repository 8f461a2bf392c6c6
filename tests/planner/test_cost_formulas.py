"""Cost-model formulas pinned to hand-computed numbers."""

import pytest

from planner.cost import formulas as F
from planner.specs import flops
from planner.specs.model import get_model


def test_ring_allreduce_matches_hand_computed_time():
    # 2·(8−1)/8 · 1 GB / 100 GB/s = 17.5 ms, plus 2·7 latencies of 10 µs
    assert F.ring_allreduce_s(1e9, 8, 100e9, 0.0) == pytest.approx(0.0175)
    assert F.ring_allreduce_s(1e9, 8, 100e9, 10e-6) == pytest.approx(0.0175 + 14 * 10e-6)
    assert F.ring_allreduce_s(1e9, 1, 100e9, 10e-6) == 0.0


def test_reduce_scatter_is_half_an_allreduce_without_latency():
    assert F.reduce_scatter_s(1e9, 4, 50e9, 0.0) * 2 == pytest.approx(F.ring_allreduce_s(1e9, 4, 50e9, 0.0))


def test_p2p_is_alpha_plus_bytes_over_bandwidth():
    assert F.p2p_s(1e6, 1e9, 5e-6) == pytest.approx(1e-3 + 5e-6)


def test_1f1b_bubble_is_p_minus_one_over_m():
    # 4 equal stages of 1 s, 8 micro-batches: (m + p − 1)·t = 11 s; bubble (p−1)/m = 3/8 of m·t
    assert F.pipeline_time_s([1.0, 1.0, 1.0, 1.0], 8) == pytest.approx(11.0)
    assert F.bubble_fraction(4, 8) == pytest.approx(3 / 8)
    assert (F.pipeline_time_s([1.0] * 4, 8) - 8) / 8 == pytest.approx(F.bubble_fraction(4, 8))


def test_interleaving_divides_the_bubble_by_v():
    t = F.interleaved_time_s([1.0] * 4, 8, 2)
    assert t == pytest.approx(8 + 3 / 2)
    assert (t - 8) / 8 == pytest.approx(F.bubble_fraction(4, 8, 2))


def test_heterogeneous_pipeline_is_paced_by_its_slowest_stage():
    assert F.pipeline_time_s([1.0, 3.0], 10) == pytest.approx(4 + 9 * 3)


def test_inflight_microbatches_per_schedule():
    assert F.inflight_microbatches("1f1b", 0, 4, 8) == 4
    assert F.inflight_microbatches("1f1b", 3, 4, 8) == 1
    assert F.inflight_microbatches("1f1b", 0, 4, 2) == 2
    assert F.inflight_microbatches("gpipe", 3, 4, 8) == 8
    # Megatron interleaved warm-up on rank 0, p=4, v=2: 2·3 + 1·4 + 1 = 11 chunks = 5.5 stage-loads
    assert F.inflight_microbatches("interleaved-1f1b", 0, 4, 8, 2) == pytest.approx(5.5)


def test_mixed_precision_adam_needs_16_bytes_per_param_and_zero_shards_it():
    assert F.state_bytes_per_param("bf16", "none", 8) == 16
    assert F.state_bytes_per_param("fp32", "none", 8) == 16
    assert F.state_bytes_per_param("bf16", "zero1", 4) == pytest.approx(2 + 2 + 12 / 4)
    assert F.state_bytes_per_param("bf16", "zero2", 4) == pytest.approx(2 + 2 / 4 + 12 / 4)
    assert F.state_bytes_per_param("bf16", "zero3", 8) == pytest.approx(16 / 8)


def test_adam_step_is_memory_bound():
    assert F.adam_step_s(1e9, 2e12) == pytest.approx(28e9 / 2e12)


def test_peak_memory_adds_fragmentation_and_reserve():
    assert F.peak_memory_bytes(10 * 2**30, "H100-SXM5-80GB") == pytest.approx(11 * 2**30 + 1.0 * 2**30)


def test_megatron_flops_formula_for_gpt3_175b():
    # Narayanan et al. SC'21 eq. (3): 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) per step
    m = get_model("gpt3-175b")
    B, s, h, L, V = 1536, 2048, m.hidden, m.num_layers, m.padded_vocab
    megatron = 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert flops.model_flops_per_step(m, B, s) == pytest.approx(megatron, rel=1e-12)


def test_a_minimum_slot_paces_the_steady_state_but_not_fill_and_drain():
    # ranks sharing cores: every steady-state slot lasts at least the work of all ranks over the cores
    assert F.pipeline_time_s([1.0, 1.0, 1.0, 3.0], 8, min_slot_s=3.0) == pytest.approx(6 + 7 * 3)
    assert F.pipeline_time_s([1.0, 1.0, 1.0, 3.0], 8, min_slot_s=4.0) == pytest.approx(6 + 7 * 4)
    assert F.pipeline_time_s([2.0], 1, min_slot_s=9.0) == pytest.approx(2.0)  # one micro-batch: no steady state
    # interleaved: the m steady slots of the busiest rank, then the others' chunks drain by 1/v
    assert F.interleaved_time_s([1.0, 2.0], 4, 2, min_slot_s=3.0) == pytest.approx(4 * 3 + 1 / 2)


# --- topology-true collectives (planner.cost.devices.cross_node_link, formulas.allreduce_s) ---


def _ring_cluster(nodes: int, per_node: int, inter: dict | str = "ib-hdr"):
    from planner.specs.cluster import parse_cluster

    node = {"name": "n", "device": "A100-SXM4-80GB", "num_devices": per_node, "count": nodes}
    return parse_cluster({"name": "c", "nodes": [node | {"intra_link": "nvlink3", "inter_link": inter}]})


def test_two_node_ring_allreduce_crosses_each_nic_once_per_step():
    from planner.cost.devices import DeviceIndex

    idx = DeviceIndex(_ring_cluster(2, 8))
    link = idx.ring_link(list(range(16)))
    # k = 8 ranks per node, 8 HDR NICs of 25 GB/s: the ring advances at 8 × 25 = 200 GB/s
    # (NVLink 300 GB/s × 8/7 = 343 GB/s is not the bound), not at one 25 GB/s NIC share
    assert link.bandwidth_bytes_per_s == pytest.approx(200e9)
    assert (link.num_nodes, link.latency_s) == (2, 10e-6)
    t = F.ring_allreduce_s(1e9, 16, link.bandwidth_bytes_per_s, 0.0)
    assert t == pytest.approx(2 * 15 / 16 * 1e9 / 200e9)  # 9.375 ms
    # each node's 8 NICs together carry 2(n−1)/n of the buffer: once, what one rank sends in a ring
    assert t * 8 * 25e9 == pytest.approx(2 * 15 / 16 * 1e9)


def test_node_groups_alike_but_for_their_names_ring_as_one_group():
    from planner.cost.devices import DeviceIndex
    from planner.specs.cluster import parse_cluster

    one = _ring_cluster(2, 8)
    node = one.nodes[0].model_dump() | {"count": 1}
    split = parse_cluster({"name": "c", "nodes": [node | {"name": "a"}, node | {"name": "b"}]})
    # two groups named apart are the same two nodes: the same rail-aligned 200 GB/s ring over 2 nodes
    assert DeviceIndex(split).ring_link(list(range(16))) == DeviceIndex(one).ring_link(list(range(16)))
    unlike = parse_cluster({"name": "c", "nodes": [node | {"name": "a"}, node | {"name": "b", "inter_link": "ib-ndr"}]})
    link = DeviceIndex(unlike).ring_link(list(range(16)))
    assert (link.bandwidth_bytes_per_s, link.num_nodes) == (pytest.approx(25e9), 1)  # one NIC share, a ring only


def test_one_rank_per_node_gets_one_nic_share_and_intra_link_can_bound_the_ring():
    from planner.cost.devices import DeviceIndex, cross_node_link

    idx = DeviceIndex(_ring_cluster(4, 8))
    # dp across tp=8 groups: tp rank 0 of each node, one NIC each
    assert idx.ring_link([0, 8, 16, 24]).bandwidth_bytes_per_s == pytest.approx(25e9)
    # 2 ranks per node on a slow intra link: min(2 × 25, 20 × 2/1) = 40 GB/s
    spec = (
        _ring_cluster(2, 2, "ib-hdr")
        .nodes[0]
        .model_copy(
            update={
                "intra_link": _ring_cluster(1, 2).nodes[0].intra_link.model_copy(update={"bandwidth_bytes_per_s": 20e9})
            }
        )
    )
    assert cross_node_link([spec], ranks_per_node=2).bandwidth_bytes_per_s == pytest.approx(40e9)
    # a p2p path (k = 1) keeps one NIC share
    assert idx.link(0, 8).bandwidth_bytes_per_s == pytest.approx(25e9)


def test_tree_allreduce_wins_on_latency_across_many_nodes_ring_on_bandwidth():
    # 16 nodes × 1 rank: ring 2·15 α = 300 µs, tree 2·⌈log2 16⌉ α = 80 µs at α = 10 µs
    assert F.tree_hops(16, 16) == 4
    assert F.allreduce_s(1e3, 16, 25e9, 10e-6, num_nodes=16) == pytest.approx(2 * 1e3 / 25e9 + 80e-6)
    assert F.allreduce_latency_s(16, 10e-6, num_nodes=16) == pytest.approx(80e-6)
    # 1 GB: ring 2·15/16 GB / 25 GB/s + 300 µs = 75.3 ms beats tree 80 ms + 80 µs
    assert F.allreduce_s(1e9, 16, 25e9, 10e-6, num_nodes=16) == pytest.approx(0.075 + 300e-6)
    # inside one node: ring only; 2 nodes × 8: tree latency 2·(1 + 7)·α
    assert F.allreduce_latency_s(8, 5e-6) == pytest.approx(70e-6)
    assert F.allreduce_latency_s(16, 10e-6, num_nodes=2) == pytest.approx(160e-6)


def test_cluster_files_accept_link_bandwidth_per_node():
    per_node = {"kind": "roce", "bandwidth_bytes_per_s": 200e9, "per": "node"}
    c = _ring_cluster(2, 8, per_node)
    assert c.nodes[0].inter_link.bandwidth_bytes_per_s == pytest.approx(25e9)  # 1600 Gb/s over 8 GPUs
    same = _ring_cluster(2, 8, {"kind": "roce", "bandwidth_bytes_per_s": 25e9, "per": "device"})
    assert same.nodes[0].inter_link.bandwidth_bytes_per_s == pytest.approx(25e9)
    from planner.errors import MeshplanError

    with pytest.raises(MeshplanError, match="per"):
        _ring_cluster(2, 8, {"kind": "roce", "bandwidth_bytes_per_s": 25e9, "per": "rack"})
