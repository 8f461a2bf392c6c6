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
    assert F.peak_memory_bytes(10 * 2**30, "H100-SXM5-80GB") == pytest.approx(11 * 2**30 + 1.5 * 2**30)


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
