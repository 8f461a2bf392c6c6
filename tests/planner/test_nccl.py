"""Collectives as NCCL prices them (planner/cost/nccl.py, planner/specs/data/nccl.toml): each term
pinned to numbers computed by hand from NCCL's tuning.cc / topo.h figures."""

from importlib import resources

import pytest

from planner.cost import nccl as N
from planner.cost.devices import DeviceIndex, Link, cross_node_link, intra_link
from planner.specs.cluster import LINK_PRESETS, ClusterSpec, NodeSpec

TEXT = resources.files("planner.specs").joinpath("data/nccl.toml").read_text(encoding="utf-8")
GB = 1e9


def node(device: str, n: int, count: int, intra: str, inter: str) -> NodeSpec:
    return NodeSpec(
        name="n",
        device=device,
        num_devices=n,
        count=count,
        intra_link=LINK_PRESETS[intra],
        inter_link=LINK_PRESETS[inter],
    )


T4 = node("T4", 4, 4, "pcie3", "eth-100g")
H100 = node("H100-SXM5-80GB", 8, 16, "nvlink4", "ib-ndr")


def test_links_carry_ncclS_rated_bandwidth_by_link_type():
    # PCIe Gen3 x16: PCI_BW 12 GB/s of 15.75, × 5/6 for P2P through an Intel host bridge
    t4 = intra_link(T4)
    assert (t4.intra_hw, t4.arch) == ("pci", "Turing")
    assert t4.nccl_bandwidth_bytes_per_s == pytest.approx(15.75 * GB * 0.7619 * 0.8333333333)
    assert t4.bandwidth_bytes_per_s == 15.75 * GB  # p2p and CPU pricing keep the line rate
    # 16 DGX H100 nodes, a ring over 8 ranks per node: min(8 NIC shares at 0.96, NVLink4 at 0.824 × 8/7)
    ring = cross_node_link([H100], ranks_per_node=8, num_nodes=16)
    assert ring.nccl_bandwidth_bytes_per_s == pytest.approx(min(8 * 50 * GB * 0.96, 450 * GB * 0.824 * 8 / 7))
    assert (ring.intra_hw, ring.arch, ring.num_nodes) == ("nvlink", "Hopper", 16)
    # CPU ranks run gloo: no NCCL figures, the α–β formulas price them
    cpu = NodeSpec(
        name="c", device="cpu", num_devices=2, intra_link=LINK_PRESETS["pcie3"], inter_link=LINK_PRESETS["eth-10g"],
        device_memory_bytes=2**34, device_peak_flop_per_s=1e11,
    )  # fmt: skip
    assert not N.uses_nccl(intra_link(cpu))
    assert N.uses_nccl(DeviceIndex(ClusterSpec(name="c", nodes=(T4,))).ring_link([0, 1, 2, 3]))


def test_protocol_by_message_size_on_pcie():
    """4 T4 over PCIe (LL128 off: no NVLink). bus = 10.0 GB/s.
    Ring/Simple: lat 8.4 + 6 × 5.7 = 42.6 µs, algbw = bus × 4/6; Ring/LL: lat 6.6 + 6 × 1.0 = 12.6 µs,
    algbw = bus/4 × 4/6; Tree/Simple inside a node: 2 × 3 × 28 = 168 µs."""
    bus = 15.75 * GB * 0.7619 * 0.8333333333
    link = intra_link(T4)
    small, big = 1024, 2 * 2**20
    c = N.choose("all_reduce", small, 4, link)
    assert (c.algorithm, c.protocol) == ("ring", "ll")
    assert c.time_s(small) == pytest.approx(12.6e-6 + small / (bus / 4 * 4 / 6))
    c = N.choose("all_reduce", big, 4, link)
    assert (c.algorithm, c.protocol) == ("ring", "simple")
    assert c.time_s(big) == pytest.approx(42.6e-6 + big / (bus * 4 / 6))
    assert N.collective_s("all_reduce", big, 4, link) == pytest.approx(357.1e-6, rel=1e-3)
    # all-gather of the whole 2 MiB buffer: ring, n − 1 = 3 steps of 5.7 µs, algbw = bus × 4/3
    assert N.collective_s("all_gather", big, 4, link) == pytest.approx((8.4 + 3 * 5.7) * 1e-6 + big / (bus * 4 / 3))
    assert N.collective_s("all_reduce", big, 1, link) == 0.0


def test_ring_or_tree_across_nodes_and_ll128_on_nvlink():
    """128 H100 on 16 nodes, k = 8. bus B = min(384, 423.8) = 384 GB/s.
    1 GiB all-reduce: Ring/Simple lat = (8.4 + 222 × 3.4 + 32 × 14) × 1.4 (plateau, Hopper)
    = 1695.68 µs, algbw = B × 128/254; Tree/Simple lat = 2 × (7 × 28 + 4 × 28) = 616 µs, algbw
    B × 0.92 × 0.5; Tree/LL128 lat = 14 + 2 × (7 × 1.25 + 4 × 8.5) = 99.5 µs, algbw B × 0.92 ×
    0.9375 × 0.5 (no size correction at ≥ 256 MiB): 99.5 + 6484 µs beats 616 + 6080 µs.
    64 KiB: Tree/LL lat = 6.8 + 2 × (7 × 0.6 + 4 × 5.0) = 55.2 µs, bus min(B × 0.92 / 3.8, 20.4 GB/s
    llMaxBw for ≥ 3 Intel nodes), × 0.5, × 0.6 (treeCorrectionFactor[LL][log2(1024)])."""
    ring = cross_node_link([H100], ranks_per_node=8, num_nodes=16)
    B = 384 * GB
    big = 2**30
    c = N.choose("all_reduce", big, 128, ring)
    assert (c.algorithm, c.protocol) == ("tree", "ll128")
    assert c.time_s(big) == pytest.approx(99.5e-6 + big / (B * 0.92 * 0.9375 * 0.5))
    r = N._candidate("all_reduce", "ring", "simple", big, 128, ring)
    assert r.latency_s == pytest.approx(1695.68e-6)
    assert r.algbw_bytes_per_s == pytest.approx(B * 128 / 254)
    t = N._candidate("all_reduce", "tree", "simple", big, 128, ring)
    assert t.time_s(big) == pytest.approx(616e-6 + big / (B * 0.92 * 0.5))
    mid = 64 * 2**10
    c = N.choose("all_reduce", mid, 128, ring)
    assert (c.algorithm, c.protocol) == ("tree", "ll")
    assert c.latency_s == pytest.approx(55.2e-6)
    assert c.algbw_bytes_per_s == pytest.approx(20.4 * GB * 0.5 * 0.6)
    # one rank per node (dp across tp groups): LL128 at 0.7 of the bus
    one = cross_node_link([H100], ranks_per_node=1, num_nodes=16)
    ll128 = N._candidate("all_gather", "ring", "ll128", mid, 16, one)
    assert ll128.algbw_bytes_per_s == pytest.approx(50 * GB * 0.96 * 0.7 * 16 / 15)


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        (
            'ring_simple = 8.4\nring_simple_source = "tuning.cc baseLat[Ring][Simple] = 8.4 us"',
            "ring_simple = 8.4",
            "source",
        ),
        ("tree_ratio = 0.5", "tree_ratio = 1.5", "tree_ratio"),
        ("net_overhead = 1.0", "net_overheads = 1.0", "net_overhead"),
        ("simple = [0.9, 0.9, ", "simple = [0.9, ", "tree_correction"),
    ],
)
def test_bad_figures_are_refused_naming_the_key(old, new, match):
    assert old in TEXT
    with pytest.raises(ValueError, match=match):
        N.parse_tuning(TEXT.replace(old, new, 1))


def test_the_priced_figures_are_the_files():
    t = N.parse_tuning(TEXT)
    assert t == N.TUNING
    assert N.link_fraction("nvlink3") == 0.8 and N.link_fraction("eth-50g/4-tcp") == 1.0
    assert Link(1.0, 0.0).intra_hw == ""  # a plain Link is priced by the α–β formulas
