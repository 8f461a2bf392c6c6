"""Compute from shape (planner.cost.compute): each kernel's roofline pinned to a hand count."""

import math

import pytest

from planner.cost import compute as C
from planner.cost import estimate
from planner.cost.fitted import DEFAULT_KERNELS, FIT_ROWS, FITTED
from planner.measure.profiles import MEMORY_EFFICIENCY, LayerProfile, ProfileKey, ProfileTable
from planner.specs import flops
from planner.specs.cluster import parse_cluster
from planner.specs.model import ModelSpec, get_model
from planner.specs.plan import Plan, StagePlan

A100 = C.Device(312e12, 2039e9, 108, "Ampere", C.PRIOR)  # the catalog's A100-SXM4-80GB figures


def test_wave_and_edge_quantisation():
    # 256×256 output = 4 tiles of 128×128 on 108 SMs: one wave, 4 of 108 SMs busy
    assert C.gemm_quantisation(256, 256, 108) == pytest.approx(4 / 108)
    # 1000 rows fill 7.8125 of 8 row tiles; no SM count: the edge alone
    assert C.gemm_quantisation(1000, 128, None) == pytest.approx(1000 / 1024)
    # 64 × 64 = 4096 tiles → ⌈4096 / 108⌉ = 38 waves, the last one partial
    assert C.gemm_quantisation(8192, 8192, 108) == pytest.approx(4096 / (38 * 108))


def test_large_gemm_is_compute_bound_thin_gemm_memory_bound():
    big = C.gemm_s(8192, 8192, 8192, 2, A100)
    assert big == pytest.approx(2 * 8192**3 / (312e12 * 0.8 * 4096 / (38 * 108)))
    # k = 16: 2·8192²·16 FLOPs is 4.3 µs at peak, but reading A, B and writing C is 2·(8192·16·2 + 8192²) B
    thin = C.gemm_s(8192, 8192, 16, 2, A100)
    assert thin == pytest.approx(2 * (2 * 8192 * 16 + 8192 * 8192) / (2039e9 * MEMORY_EFFICIENCY))


def test_linear_backward_is_the_input_and_weight_gradient_gemms():
    fwd, bwd = C.gemm_train_s(4096, 1024, 2048, 2, A100)
    assert fwd == C.gemm_s(4096, 1024, 2048, 2, A100)
    assert bwd == C.gemm_s(4096, 2048, 1024, 2, A100) + C.gemm_s(2048, 1024, 4096, 2, A100)


def test_flash_attention_runs_half_the_causal_flops_eager_pays_the_scores_in_memory():
    m = get_model("gpt3-1.3b")  # h 2048, 16 heads of 128
    fwd, bwd = C.attention_train_s(m, 1, 8192, 1, "bf16", A100, "flash", False)
    assert fwd == pytest.approx(0.5 * 4 * 8192**2 * 2048 / (312e12 * 0.6))
    assert bwd == pytest.approx(2.5 * fwd)
    efwd, _ = C.attention_train_s(m, 1, 8192, 1, "bf16", A100, "eager", False)
    softmax_bytes = 2 * 2 * 16 * 8192**2  # read + write e·b·a·s²
    assert efwd > C.memory_s(softmax_bytes, A100) and efwd > fwd


def test_achieved_flop_rate_grows_with_hidden_size():
    # the trend the one 0.55 efficiency inverted: wider blocks run closer to peak
    rates = []
    for h in (768, 2048, 8192):
        m = ModelSpec(num_layers=1, hidden=h, num_heads=h // 64, vocab_size=50304, seq_len=2048)
        fwd, bwd = C.block_train_s(m, 4, 2048, 1, "bf16", A100)
        rates.append(flops.training_flops("block", m, 4, 2048) / (fwd + bwd))
    assert rates[0] < rates[1] < rates[2] < 312e12


def test_measured_profiles_win_over_shape_estimates():
    m = get_model("gpt2-small")
    cl = parse_cluster(
        {
            "name": "c",
            "nodes": [
                {
                    "name": "n",
                    "device": "A100-SXM4-80GB",
                    "num_devices": 1,
                    "count": 1,
                    "intra_link": "nvlink3",
                    "inter_link": "ib-hdr",
                }
            ],
        }
    )
    p = Plan(
        model=m.name,
        cluster="c",
        global_batch_size=4,
        seq_len=1024,
        micro_batch_size=4,
        stages=(StagePlan(layer_start=0, layer_end=12, device_ids=(0,)),),
        batch_shares=(4,),
    )
    key = ProfileKey("A100-SXM4-80GB", "block", 4, 1024, 1, False, "bf16")
    measured = LayerProfile(key, 0.004, 0.008, 0, 10**8, 10**7, estimated=False)
    priced = estimate(p, m, cl, profiles=ProfileTable([measured]))
    shape = estimate(p, m, cl)
    # 12 measured blocks × 12 ms, plus the (estimated) embedding and head
    assert priced.compute_s > 12 * 0.012 > shape.compute_s


def test_fitted_figures_are_stored_with_their_provenance_and_differ_from_the_prior():
    # the default is the derived prior (issue #42): fitted figures exist only as a calibration
    assert DEFAULT_KERNELS is C.PRIOR and FITTED != C.PRIOR
    assert "runtimes.toml" in C.PRIOR.source and "not fitted" in C.PRIOR.source
    assert f"{FIT_ROWS} MPT rows" in FITTED.source and "bench/fit_kernels.py" in FITTED.source
    assert all(0 < v < 1 for _, v in FITTED.gemm + FITTED.flash)
    assert C.PRIOR.gemm_fraction("Ampere") == C.GEMM_PEAK_FRACTION
    assert math.isclose(FITTED.gemm_fraction("Volta"), C.PRIOR.gemm_other)


def test_estimates_handed_in_are_re_derived_from_shape_measured_rows_are_not():
    from planner.cost.completion import ProfileNeed, complete_profiles
    from planner.measure.profiles import estimate_layer

    m = get_model("gpt2-small")
    cl = parse_cluster(
        {
            "name": "c",
            "nodes": [
                {
                    "name": "n",
                    "device": "A100-SXM4-80GB",
                    "num_devices": 1,
                    "count": 1,
                    "intra_link": "nvlink3",
                    "inter_link": "ib-hdr",
                }
            ],
        }
    )
    key = ProfileKey("A100-SXM4-80GB", "block", 4, 1024, 1, False, "bf16")
    stored = estimate_layer(m, key, 312e12, 2039e9)  # one efficiency (0.55), as the profile flow stores it
    need = {ProfileNeed(4, 1024, 1, False, "bf16")}
    fresh = complete_profiles(m, cl, None, need).get(key)
    again = complete_profiles(m, cl, ProfileTable([stored]), need).get(key)
    assert again == fresh and again.forward_s != stored.forward_s


def test_a_power_capped_board_prices_gemms_at_its_sustained_clock_and_keeps_its_datasheet_peak_for_mfu():
    """T4 (70 W): the catalog's measured 24 TFLOP/s large cuBLAS GEMM is GEMM_PEAK_FRACTION of the clock it
    sustains, so kernels are priced on 24 / 0.8 = 30 TFLOP/s, not the 65 at boost; fp32 and boards with no
    sustained figure keep the datasheet peak, and so does the node (MFU's denominator)."""
    from planner.specs.catalog import lookup

    t4, a100 = lookup("T4"), lookup("A100-SXM4-80GB")
    assert t4.sustained_gemm_flop_per_s == 24e12 and a100.sustained_gemm_flop_per_s is None
    assert C.compute_peak_flop_per_s(65e12, 24e12, "fp16") == pytest.approx(24e12 / C.GEMM_PEAK_FRACTION)
    assert C.compute_peak_flop_per_s(8.1e12, 24e12, "fp32") == 8.1e12
    assert C.compute_peak_flop_per_s(312e12, None, "bf16") == 312e12
    assert C.compute_peak_flop_per_s(20e12, 24e12, "fp16") == 20e12  # never above the datasheet
    cluster = parse_cluster(
        {
            "name": "t4",
            "nodes": [{"name": "n", "device": "T4", "num_devices": 4, "intra_link": "pcie3", "inter_link": "eth-10g"}],
        }
    )
    node = cluster.nodes[0]
    from planner.cost.estimate import gpu_device

    dev = gpu_device(node, "fp16", None)
    assert node.peak_flop_per_s("fp16") == 65e12 and dev.peak_flop_per_s == pytest.approx(30e12)
    # a large GEMM on the T4 device runs at its measured rate (quantisation-free shape: 40 SMs × whole waves)
    m = n = 128 * 40
    t = C.gemm_s(m, n, 4096, 2, C.Device(dev.peak_flop_per_s, dev.memory_bandwidth_bytes_per_s, 40, "Turing"))
    assert 2 * m * n * 4096 / t == pytest.approx(24e12)
