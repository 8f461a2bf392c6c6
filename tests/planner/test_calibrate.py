"""planner.measure.calibrate: contention, per-op gloo fits, CPU Adam and overlap, applied by estimate()."""

import dataclasses

import pytest

from planner.cost import estimate
from planner.cost.completion import complete_profiles
from planner.cost.estimate import plan_profile_needs
from planner.errors import MeshplanError
from planner.measure.calibrate import (
    ADAM_BYTES_PER_PARAM_CPU_LOOP,
    Calibration,
    CollectiveFit,
    collective_fits,
    contention_slowdown,
    cpu_calibration,
    measured_slowdowns,
)
from planner.measure.profiles import ProfileTable
from planner.specs.cluster import parse_cluster
from planner.specs.flops import layer_params
from planner.specs.model import ModelSpec, get_model
from planner.specs.plan import parse_plan

LINK = {"kind": "gloo-loopback", "bandwidth_bytes_per_s": 4e9, "latency_s": 50e-6}


def cpu_cluster(n: int):
    return parse_cluster(
        {
            "name": "cpu",
            "nodes": [
                {
                    "name": "vm",
                    "device": "cpu",
                    "num_devices": n,
                    "intra_link": LINK,
                    "inter_link": LINK,
                    "device_memory_bytes": 4 * 2**30,
                    "device_peak_flop_per_s": 50e9,
                    "device_memory_bandwidth_bytes_per_s": 10e9,
                }
            ],
        }
    )


def plan(dp: int = 1, sharding: str = "none"):
    return parse_plan(
        {
            "version": 1,
            "model": "tiny",
            "cluster": "cpu",
            "global_batch_size": 2 * dp,
            "seq_len": 64,
            "micro_batch_size": 2,
            "schedule": "1f1b",
            "dtype": "fp32",
            "stages": [
                {"layer_start": 0, "layer_end": 4, "device_ids": list(range(dp)), "dp": dp, "sharding": sharding}
            ],
            "batch_shares": [2] * dp,
        }
    )


def test_contention_slowdown_is_single_rate_over_median_concurrent_rate():
    assert contention_slowdown(60e9, [30e9, 20e9, 40e9]) == pytest.approx(2.0)


def test_contention_slowdown_never_speeds_ranks_up():
    assert contention_slowdown(50e9, [60e9, 55e9]) == 1.0


def test_contention_slowdown_rejects_non_positive_rates():
    with pytest.raises(MeshplanError):
        contention_slowdown(50e9, [0.0])


def test_collective_fit_reproduces_its_own_group_and_scales_by_ring_steps():
    f = CollectiveFit(alpha_s=3e-3, beta_s_per_byte=2e-9, num_ranks=4)
    assert f.time_s(1e6, 4) == pytest.approx(3e-3 + 2e-3)
    # d=2 of a 4-rank fit: 1 of 3 steps, (1/2)/(3/4) of the per-rank volume
    assert f.time_s(1e6, 2) == pytest.approx(1e-3 + 2e-9 * 1e6 * (0.5 / 0.75))
    assert f.time_s(1e6, 1) == 0.0 and f.time_s(0, 4) == 0.0


def test_collective_fits_keep_collectives_of_the_link_class_only():
    rows = [
        {"op": "all_reduce", "link_class": "intra-node", "alpha_s": 1e-3, "beta_s_per_byte": 1e-9},
        {"op": "send_recv", "link_class": "intra-node", "alpha_s": 1e-4, "beta_s_per_byte": 1e-10},
        {"op": "all_gather", "link_class": "inter-node", "alpha_s": 1e-3, "beta_s_per_byte": 1e-9},
    ]
    assert set(collective_fits(rows, 2)) == {"all_reduce"}


def test_no_calibration_and_a_neutral_one_price_the_same():
    model, cl = get_model("tiny"), cpu_cluster(1)
    neutral = Calibration(num_ranks=1)
    assert estimate(plan(), model, cl, calibration=neutral).step_time_s == pytest.approx(
        estimate(plan(), model, cl).step_time_s
    )


def test_slowdown_scales_compute_and_adam_bytes_scale_the_optimizer():
    model, cl = get_model("tiny"), cpu_cluster(1)
    base = estimate(plan(), model, cl)
    cal = Calibration(num_ranks=1, compute_slowdown=2.0, adam_bytes_per_param=ADAM_BYTES_PER_PARAM_CPU_LOOP)
    c = estimate(plan(), model, cl, calibration=cal)
    assert c.compute_s == pytest.approx(2 * base.compute_s)
    assert c.optimizer_s == pytest.approx(base.optimizer_s * ADAM_BYTES_PER_PARAM_CPU_LOOP / 28)


def test_calibrated_gradient_all_reduce_uses_the_measured_fit_unhidden():
    model, cl = get_model("tiny"), cpu_cluster(2)
    fit_rows = [{"op": "all_reduce", "link_class": "intra-node", "alpha_s": 2e-3, "beta_s_per_byte": 1e-9}]
    cal = cpu_calibration(50e9, [50e9, 50e9], fit_rows, 2)
    assert cal.compute_slowdown == 1.0 and cal.grad_sync_overlap == 0.0
    grad_bytes = 4 * sum(layer_params(k, model, 1) * n for k, n in (("block", 4), ("embedding", 1), ("head", 1)))
    c = estimate(plan(dp=2), model, cl, calibration=cal)
    # plus GradSumSync's copies into its bucket buffer and back (all of tiny's tensors are small)
    # and worker.train's gradient-norm all-reduce of a scalar over the world (stage._grad_norm_s), on the fit
    norm = 2e-3 + 1e-9 * 4
    assert c.dp_comm_s == pytest.approx(2e-3 + 1e-9 * grad_bytes + 4 * grad_bytes / 10e9 + norm)
    # the uncalibrated ring on the 4 GB/s send/recv link, mostly hidden by backward, is far cheaper
    assert estimate(plan(dp=2), model, cl).dp_comm_s < c.dp_comm_s / 2


def test_unsharded_dp_prices_bucket_copies_of_small_gradients_only():
    """GradSumSync packs gradients under 25 MiB into its bucket and back (two copies, each moving every
    byte twice at the copy bandwidth) and reduces bigger ones in place: a block whose projections are
    64 MiB each costs no copy, its 4 MiB embedding and head do."""
    wide = ModelSpec(name="wide", family="gpt", num_layers=4, hidden=2048, num_heads=16, vocab_size=512, seq_len=64)
    assert 4 * wide.hidden * wide.ffn >= 25 * 2**20 > 4 * wide.padded_vocab * wide.hidden
    cl = cpu_cluster(2)
    fit_rows = [{"op": "all_reduce", "link_class": "intra-node", "alpha_s": 2e-3, "beta_s_per_byte": 1e-9}]
    cal = cpu_calibration(50e9, [50e9, 50e9], fit_rows, 2)
    p = parse_plan({**plan(dp=2).model_dump(mode="json"), "model": "wide"})
    c = estimate(p, wide, cl, calibration=cal)
    small = 4 * (layer_params("embedding", wide, 1) + layer_params("head", wide, 1))
    grad_bytes = 4 * layer_params("block", wide, 1) * 4 + small
    norm = 2e-3 + 1e-9 * 4  # the gradient norm's scalar all-reduce (stage._grad_norm_s)
    assert c.dp_comm_s == pytest.approx(2e-3 + 1e-9 * grad_bytes + 4 * small / 10e9 + norm)


def test_calibration_is_hashable_so_stage_coefficients_memoise():
    cal = cpu_calibration(50e9, [25e9, 25e9], [], 2)
    assert hash(cal) == hash(dataclasses.replace(cal))


def test_contention_slowdown_divides_out_the_sharing_of_more_probing_ranks_than_cores():
    # 4 ranks on 2 cores each get half a core: a halved rate is sharing, not cache/memory contention
    assert contention_slowdown(60e9, [30e9] * 4, num_cores=2) == pytest.approx(1.0)
    assert contention_slowdown(60e9, [24e9] * 4, num_cores=2) == pytest.approx(1.25)
    assert contention_slowdown(60e9, [40e9] * 2, num_cores=2) == pytest.approx(1.5)


def pp_plan(sizes: list[int], m: int):
    stages, start = [], 0
    for k, n in enumerate(sizes):
        stages.append({"layer_start": start, "layer_end": start + n, "device_ids": [k]})
        start += n
    return parse_plan(
        {
            "version": 1,
            "model": "tiny",
            "cluster": "cpu",
            "global_batch_size": m,
            "seq_len": 64,
            "micro_batch_size": 1,
            "schedule": "gpipe",
            "dtype": "fp32",
            "stages": stages,
            "batch_shares": [m],
        }
    )


def test_more_ranks_than_cores_stretch_compute_and_optimizer_to_their_cpu_work_over_the_cores():
    model, cl = get_model("tiny"), cpu_cluster(4)
    alone = estimate(plan(dp=4), model, cl, calibration=Calibration(num_ranks=4, adam_s_per_param=1e-9))
    shared = estimate(plan(dp=4), model, cl, calibration=Calibration(num_ranks=4, adam_s_per_param=1e-9, num_cores=2))
    # 4 identical replicas, no pipeline: the work of 4 ranks over 2 cores takes twice one rank's time
    assert shared.compute_s == pytest.approx(2 * alone.compute_s)
    assert shared.optimizer_s == pytest.approx(2 * alone.optimizer_s)
    assert shared.dp_comm_s == pytest.approx(alone.dp_comm_s)  # waiting in a collective uses no core
    assert shared.step_time_s == pytest.approx(alone.step_time_s + alone.compute_s + alone.optimizer_s)
    wide = Calibration(num_ranks=4, adam_s_per_param=1e-9, num_cores=4)
    assert estimate(plan(dp=4), model, cl, calibration=wide).step_time_s == pytest.approx(alone.step_time_s)


def test_idle_pipeline_ranks_leave_their_cores_to_the_busy_ones():
    # stages of 1 and 3 blocks, 8 micro-batches: with 2 cores each rank has its own; on 1 core the
    # pipelined part takes the two ranks' work, 8·(1 + 3) block-times, less than slowing both 2×
    model, cl, p = get_model("tiny"), cpu_cluster(2), pp_plan([1, 3], 8)
    alone = estimate(p, model, cl, calibration=Calibration(num_ranks=2))
    two = estimate(p, model, cl, calibration=Calibration(num_ranks=2, num_cores=2))
    one = estimate(p, model, cl, calibration=Calibration(num_ranks=2, num_cores=1))
    assert two.step_time_s == pytest.approx(alone.step_time_s)
    pipe = alone.step_time_s - alone.optimizer_s - alone.dp_comm_s
    assert alone.step_time_s < one.step_time_s < alone.step_time_s + pipe


def test_a_measured_adam_time_per_param_wins_over_bytes_and_is_slowed_like_compute():
    model, cl = get_model("tiny"), cpu_cluster(1)
    params = sum(layer_params(k, model, 1) * n for k, n in (("block", 4), ("embedding", 1), ("head", 1)))
    cal = Calibration(num_ranks=1, compute_slowdown=1.5, adam_bytes_per_param=80.0, adam_s_per_param=5e-9)
    assert estimate(plan(), model, cl, calibration=cal).optimizer_s == pytest.approx(1.5 * 5e-9 * params)
    # ZeRO shards the step: each of dp=2 ranks updates half the parameters
    cal2 = cpu_calibration(50e9, [50e9, 50e9], [], 2, adam_s_per_param=5e-9)
    assert estimate(plan(dp=2, sharding="zero1"), model, cpu_cluster(2), calibration=cal2).optimizer_s == (
        pytest.approx(5e-9 * params / 2)
    )


def test_dtensor_stages_take_their_layouts_adam_time_and_plain_ones_the_plain_time():
    model = get_model("tiny")
    cal = cpu_calibration(
        50e9, [50e9, 50e9], [], 2, adam_s_per_param=5e-9, adam_dtensor_s_per_param=20e-9, adam_fsdp_s_per_param=30e-9
    )
    params = sum(layer_params(k, model, 1) * n for k, n in (("block", 4), ("embedding", 1), ("head", 1)))
    # sharding none over dp: GradSumSync keeps plain parameters
    assert estimate(plan(dp=2), model, cpu_cluster(2), calibration=cal).optimizer_s == pytest.approx(5e-9 * params)
    # FSDP2 (zero1) makes them DTensors: half the parameters each, at the FSDP2 layout's rate
    z = estimate(plan(dp=2, sharding="zero1"), model, cpu_cluster(2), calibration=cal)
    assert z.optimizer_s == pytest.approx(30e-9 * params / 2)
    # tensor parallel: the tp layout's rate
    tp_cal = dataclasses.replace(cal, adam_fsdp_s_per_param=None)
    t = estimate(tp_plan(), model, cpu_cluster(2), calibration=cal).optimizer_s
    assert t == pytest.approx(
        20e-9 * sum(layer_params(k, model, 2) * n for k, n in (("block", 4), ("embedding", 1), ("head", 1)))
    )
    # a calibration without the FSDP2 figure (older stores) prices FSDP2 at the tp layout's
    z_old = estimate(plan(dp=2, sharding="zero1"), model, cpu_cluster(2), calibration=tp_cal)
    assert z_old.optimizer_s == pytest.approx(20e-9 * params / 2)


def test_an_optimizer_step_timed_on_ranks_stepping_together_is_not_slowed_by_lockstep_again():
    model = get_model("tiny")
    params = sum(layer_params(k, model, 1) * n for k, n in (("block", 4), ("embedding", 1), ("head", 1)))
    alone = Calibration(num_ranks=2, lockstep_slowdown=1.25, adam_s_per_param=5e-9)
    together = dataclasses.replace(alone, adam_num_ranks=2)
    assert estimate(plan(dp=2), model, cpu_cluster(2), calibration=alone).optimizer_s == pytest.approx(
        1.25 * 5e-9 * params
    )
    assert estimate(plan(dp=2), model, cpu_cluster(2), calibration=together).optimizer_s == pytest.approx(5e-9 * params)


def test_pipeline_overhead_is_the_measured_micro_batch_less_the_priced_p2p_and_never_negative():
    from planner.measure.calibrate import pipeline_overhead_s

    # 2 p2p of 1 KB at α 0.1 ms and 1 GB/s: 2 × (1e-4 + 1.024e-6) s are priced already
    assert pipeline_overhead_s(5e-3, 1024, 1e-4, 1e9) == pytest.approx(5e-3 - 2 * (1e-4 + 1024 / 1e9))
    assert pipeline_overhead_s(1e-4, 1024, 1e-4, 1e9) == 0.0  # faster than the link model: nothing extra


def test_a_steady_pipeline_slot_on_shared_cores_lasts_all_ranks_work_over_the_cores():
    """4 pipeline ranks on 2 cores: in 1F1B's steady state all four compute at once, so each slot of
    the slowest stage lasts half the four stages' work; only fill and drain run at the critical path.
    Work conservation over the whole pipelined part alone (the bound before) is looser."""
    model, cl, p = get_model("tiny"), cpu_cluster(4), pp_plan([1, 1, 1, 1], 8)
    alone = estimate(p, model, cl, calibration=Calibration(num_ranks=4))
    shared = estimate(p, model, cl, calibration=Calibration(num_ranks=4, num_cores=2))
    pipe = alone.step_time_s - alone.optimizer_s - alone.dp_comm_s
    # fill + drain ≈ 4 slots of τ, 7 steady slots of ≈ 2τ (18/11 of alone with equal stages; the
    # head makes the last one heavier: 1.45 here). Work conservation alone gave 1.26.
    assert shared.step_time_s - shared.optimizer_s - shared.dp_comm_s > 1.4 * pipe
    # the stretch is the cores' doing, booked as compute, not as pipeline bubble
    assert shared.bubble_s == pytest.approx(alone.bubble_s) and shared.compute_s > 1.5 * alone.compute_s
    # one micro-batch has no steady state: the pipelined part is the critical path alone
    one = pp_plan([1, 1, 1, 1], 1)
    alone1 = estimate(one, model, cl, calibration=Calibration(num_ranks=4))
    shared1 = estimate(one, model, cl, calibration=Calibration(num_ranks=4, num_cores=2))
    assert shared1.step_time_s - shared1.optimizer_s == pytest.approx(alone1.step_time_s - alone1.optimizer_s)


def test_fsdp_overhead_is_the_measured_module_step_less_its_priced_collectives():
    from planner.measure.calibrate import FsdpOverhead, fsdp_overhead_from

    fits = collective_fits(
        [
            {"op": "all_gather", "link_class": "intra-node", "alpha_s": 1e-4, "beta_s_per_byte": 2e-9},
            {"op": "reduce_scatter", "link_class": "intra-node", "alpha_s": 1.5e-3, "beta_s_per_byte": 2e-9},
        ],
        2,
    )
    small, big = 16384, 4194304
    rows = [
        {"op": "fsdp_module", "message_bytes": small, "time_s": 6e-3},
        {"op": "fsdp_module", "message_bytes": big, "time_s": 40e-3},
        {"op": "fsdp_tensor", "message_bytes": small, "time_s": 1e-4},
        {"op": "all_reduce", "message_bytes": small, "time_s": 1.0},
    ]

    def residual(b: int, t: float) -> float:  # two all-gathers and a reduce-scatter are priced already
        return t - 2 * (1e-4 + 2e-9 * b) - (1.5e-3 + 2e-9 * b)

    per_byte = (residual(big, 40e-3) - residual(small, 6e-3)) / (big - small)
    fs = fsdp_overhead_from(rows, fits)
    assert fs == pytest.approx(FsdpOverhead(residual(small, 6e-3) - per_byte * small, per_byte, 1e-4))
    # one gather or reduce-scatter of a 16-tensor module of 1 MB: a third of its module step
    assert fs.op_s(16, 1e6) == pytest.approx((fs.module_s + per_byte * 1e6 + 15 * 1e-4) / 3)
    assert fsdp_overhead_from(rows[2:], fits) is None  # no FSDP bench in the snapshot: nothing to book
    # faster than the fits price: nothing extra, never negative
    cheap = [{**r, "time_s": 1e-6} for r in rows[:2]]
    assert fsdp_overhead_from(cheap, fits) == FsdpOverhead(0.0, 0.0, 0.0)


@pytest.mark.parametrize("sharding, ops", [("none", 0), ("zero1", 2), ("zero2", 2), ("zero3", 3)])
def test_zero_stages_book_fsdp_overhead_on_every_gather_and_reduce_scatter_of_every_module(sharding, ops):
    """One micro-batch per replica: ZeRO-3 gathers each module before forward and before backward
    and reduce-scatters it (3 ops); ZeRO-1/2 gather once per step and reduce-scatter (2);
    unsharded data parallelism runs no FSDP2 at all."""
    from planner.measure.calibrate import FsdpOverhead
    from planner.specs.flops import layer_tensors

    model, cl = get_model("tiny"), cpu_cluster(2)
    base = cpu_calibration(50e9, [50e9, 50e9], [], 2, adam_s_per_param=5e-9)
    fs = FsdpOverhead(module_s=3e-3, s_per_byte=1e-9, tensor_s=1e-4)
    with_fs = dataclasses.replace(base, fsdp=fs)
    per_step = sum(
        n * fs.op_s(layer_tensors(k, model), 4 * layer_params(k, model, 1))
        for k, n in (("block", 4), ("embedding", 1), ("head", 1))
    )
    priced = [estimate(plan(2, sharding), model, cl, calibration=c).step_time_s for c in (with_fs, base)]
    extra = priced[0] - priced[1]
    assert extra == pytest.approx(ops * per_step)


def concurrency_rows(alone: float | None, free: float, lock: float | None) -> list[dict]:
    times = {"compute_alone": alone, "compute_free": free, "compute_lockstep": lock}
    return [{"op": op, "message_bytes": 0, "time_s": t, "num_ranks": 2} for op, t in times.items() if t is not None]


def test_measured_slowdowns_are_free_over_alone_and_lockstep_over_free_never_below_one():
    assert measured_slowdowns(concurrency_rows(0.020, 0.024, 0.030)) == pytest.approx((1.2, 1.25))
    assert measured_slowdowns(concurrency_rows(0.030, 0.024, 0.020)) == (1.0, 1.0)  # noise must not speed ranks up
    # an older snapshot: no alone row (contention from the probe's rates), or no rows at all
    assert measured_slowdowns(concurrency_rows(None, 0.024, 0.030)) == (None, pytest.approx(1.25))
    assert measured_slowdowns([]) == (None, 1.0)


def test_cpu_calibration_takes_contention_from_the_concurrency_rows_and_falls_back_on_the_rates():
    # the probe's rates say 2x; the same-minute chunks say 1.2x, and win
    cal = cpu_calibration(60e9, [30e9, 30e9], [], 2, measurements=concurrency_rows(0.020, 0.024, 0.030))
    assert (cal.compute_slowdown, cal.lockstep_slowdown) == pytest.approx((1.2, 1.25))
    assert "slowdown 1.20, lockstep 1.25" in cal.source
    old = cpu_calibration(60e9, [30e9, 30e9], [], 2, measurements=concurrency_rows(None, 0.024, 0.030))
    assert (old.compute_slowdown, old.lockstep_slowdown) == pytest.approx((2.0, 1.25))


def test_lockstep_slowdown_scales_compute_and_optimizer_like_contention():
    model, cl = get_model("tiny"), cpu_cluster(2)
    base = estimate(plan(dp=2), model, cl, calibration=Calibration(num_ranks=2, adam_s_per_param=5e-9))
    cal = Calibration(num_ranks=2, compute_slowdown=1.1, lockstep_slowdown=1.25, adam_s_per_param=5e-9)
    c = estimate(plan(dp=2), model, cl, calibration=cal)
    assert c.compute_s == pytest.approx(1.1 * 1.25 * base.compute_s)
    assert c.optimizer_s == pytest.approx(1.1 * 1.25 * base.optimizer_s)


def tp_plan():
    return parse_plan(
        {
            "version": 1,
            "model": "tiny",
            "cluster": "cpu",
            "global_batch_size": 2,
            "seq_len": 64,
            "micro_batch_size": 2,
            "schedule": "1f1b",
            "dtype": "fp32",
            "stages": [{"layer_start": 0, "layer_end": 4, "device_ids": [0, 1], "tp": 2}],
            "batch_shares": [2],
        }
    )


def test_blocks_timed_on_a_real_tp_group_are_not_slowed_by_lockstep_again():
    """A tp block profiled on a real group ran in lockstep with its peers: only contention slows it."""
    model, cl, p = get_model("tiny"), cpu_cluster(2), tp_plan()
    table = complete_profiles(model, cl, None, plan_profile_needs(p), kinds={"cpu"})
    real = ProfileTable(
        dataclasses.replace(r, tp_comm_included=True, estimated=False) if r.key.layer_kind == "block" else r
        for r in table
    )
    neutral, cal = Calibration(num_ranks=2), Calibration(num_ranks=2, lockstep_slowdown=1.5)
    blocks = [r for r in real if r.key.layer_kind == "block" and r.key.tp == 2 and not r.key.recompute]
    assert blocks
    block_s = 4 * blocks[0].train_s  # the plan's 4 blocks
    rest = estimate(p, model, cl, real, calibration=neutral).compute_s - block_s
    slowed = estimate(p, model, cl, real, calibration=cal).compute_s
    assert slowed == pytest.approx(block_s + 1.5 * rest)  # embedding and head slowed, blocks not
    assert cal.slowdown(real_group=True) == 1.0 and cal.slowdown() == 1.5
