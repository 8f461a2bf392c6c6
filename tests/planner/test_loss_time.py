"""The LM-head loss kernels' time (planner.cost.compute.loss_time_delta_s), pinned to hand counts.

tiny: V = 256, b = 2, s = 64, bf16 (e = 2): L = b·s·V = 32768 logits.
"""

import pytest

from planner.cost import compute as C
from planner.cost import estimate
from planner.cost.estimate import gpu_device
from planner.measure.profiles import MEMORY_EFFICIENCY
from planner.specs.model import get_model
from tests.planner.test_cost_memory import one_gpu, plan

TINY = get_model("tiny")
L = 2 * 64 * TINY.padded_vocab


def test_each_loss_kernel_moves_its_bytes_per_logit():
    assert C.loss_logit_traffic_bytes("torch", 2) == (14, 22)  # cast + log-softmax; nll, log-softmax, cast grads
    assert C.loss_logit_traffic_bytes("vocab-parallel", 2) == (38, 14)  # 6 fp32 passes fwd; scale + cast bwd
    assert C.loss_logit_traffic_bytes("fused", 2) == (2, 4)  # one read; read + write the gradient
    with pytest.raises(ValueError):
        C.loss_logit_traffic_bytes("nope", 2)


def test_the_stacks_loss_time_is_booked_on_the_last_stage_against_the_runtimes():
    cluster = one_gpu("A100-SXM4-80GB")
    bw = cluster.nodes[0].memory_bandwidth_bytes_per_s * MEMORY_EFFICIENCY
    dev = gpu_device(cluster.nodes[0], "bf16", None)
    assert C.loss_time_delta_s(TINY, 2, 64, 1, "bf16", dev, "fused") == pytest.approx(
        ((2 - 14) * L / bw, (4 - 22) * L / bw)
    )
    torch_, fused, vp = (estimate(plan(loss=x), TINY, cluster) for x in ("torch", "fused", "vocab-parallel"))
    assert fused.compute_s - torch_.compute_s == pytest.approx((2 + 4 - 14 - 22) * L / bw, rel=1e-6)
    assert vp.compute_s - torch_.compute_s == pytest.approx((38 + 14 - 14 - 22) * L / bw, rel=1e-6)


def test_measured_cpu_rows_are_left_alone():
    """CPU ranks price from measured rows of the runtime's own loss: no kernel model to swap."""
    from planner.specs.cluster import parse_cluster

    node = {"name": "c", "device": "cpu", "num_devices": 1, "intra_link": "pcie3", "inter_link": "eth-10g"}
    cpu = parse_cluster(
        {"name": "c", "nodes": [dict(node, device_memory_bytes=8 * 2**30, device_peak_flop_per_s=1e11)]}
    )
    a, b = (estimate(plan(loss=x, dtype="fp32"), TINY, cpu).compute_s for x in ("torch", "fused"))
    assert a == b
