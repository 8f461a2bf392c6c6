"""Runtime profiles (planner.cost.runtimes): each runtime's terms pinned by hand, and the runtime
changing memory and the ranking of plans; the figures' fit recovers known figures."""

import math

import pytest

from planner.cost.compute import PRIOR
from planner.cost.memory import eager_attention_kept_bytes
from planner.cost.runtimes import (
    PROFILES,
    REG,
    Figures,
    apply_stack,
    fit_figures,
    fit_terms,
    fixed_overheads_s,
    price_under,
    profile_named,
    scaled_kernels,
    slots,
)
from planner.errors import MeshplanError
from planner.specs.cluster import LINK_PRESETS, ClusterSpec, NodeSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import CostBreakdown, Plan, StagePlan

NODE = NodeSpec(
    name="n",
    device="A100-SXM4-40GB",
    num_devices=4,
    count=1,
    intra_link=LINK_PRESETS["nvlink3"],
    inter_link=LINK_PRESETS["ib-hdr"],
)
CLUSTER = ClusterSpec(name="c", nodes=(NODE,))
MODEL = ModelSpec(name="m", family="gpt", num_layers=8, hidden=2048, num_heads=16, vocab_size=50304, seq_len=4096)


def plan(mb: int, tp: int = 1) -> Plan:
    dp = 4 // tp
    return Plan(
        model="m",
        cluster="c",
        global_batch_size=32,
        seq_len=4096,
        micro_batch_size=mb,
        dtype="bf16",
        stages=(StagePlan(layer_start=0, layer_end=8, device_ids=(0, 1, 2, 3), dp=dp, tp=tp),),
        batch_shares=(32 // dp,) * dp,
    )


# (attention, loss, dropout, sequence parallel, overlap runtime, launch s, kernels per block, kernels
# per step) as documented in planner/specs/data/runtimes.toml
TERMS = {
    "meshplan": ("sdpa", "torch", False, False, "meshplan", 10e-6, 16, 60),
    "torchtitan": ("sdpa", "torch", False, True, "torchtitan", 10e-6, 16, 60),
    "megatron": ("flash", "fused", False, True, "megatron", 7e-6, 12, 40),
    "deepspeed": ("eager", "vocab-parallel", True, False, "megatron-sc21", 10e-6, 24, 80),
    "composer": ("flash", "fused", False, False, "fsdp-composer", 10e-6, 14, 60),
}


@pytest.mark.parametrize("name", sorted(TERMS))
def test_each_runtime_states_its_kernels_overlap_and_overheads(name):
    p = profile_named(name)
    att, loss, drop, sp, overlap, launch, kpb, kps = TERMS[name]
    assert (p.attention, p.loss, p.dropout, p.sequence_parallel, p.overlap.name) == (att, loss, drop, sp, overlap)
    assert (p.launch_s, p.kernels_per_block, p.microbatch_s, p.step_kernels) == (launch, kpb, 0.0, kps)
    q = apply_stack(plan(1, tp=2), p)
    assert (q.attention, q.loss, q.dropout, q.stages[0].sequence_parallel) == (att, loss, drop, sp)
    assert not apply_stack(plan(1), p).stages[0].sequence_parallel  # tp = 1: nothing to shard


# host time of one micro-batch on the stage: launch_s × kernels_per_block × 3 (forward + 2× backward) × 8
# blocks; the GPU's 0.001 s over 32 micro-batches = 31.25 µs each; 32 slots (pp = 1): 32 × (host − GPU);
# once a step launch_s × kernels per step (issue #42's per-step term; 0.6 ms for meshplan)
STEP = {
    "meshplan": 10e-6 * 60,
    "torchtitan": 10e-6 * 60,
    "megatron": 7e-6 * 40,
    "deepspeed": 10e-6 * 80,
    "composer": 10e-6 * 60,
}
HAND = {
    "meshplan": 32 * (10e-6 * 16 * 3 * 8 - 0.001 / 32) + STEP["meshplan"],  # 3.84 ms host: 121.88 + 0.6 ms
    "torchtitan": 32 * (10e-6 * 16 * 3 * 8 - 0.001 / 32) + STEP["torchtitan"],
    "megatron": 32 * (7e-6 * 12 * 3 * 8 - 0.001 / 32) + STEP["megatron"],  # 2.016 ms host: 63.51 + 0.28 ms
    "deepspeed": 32 * (10e-6 * 24 * 3 * 8 - 0.001 / 32) + STEP["deepspeed"],  # 5.76 ms host: 183.32 + 0.8 ms
    "composer": 32 * (10e-6 * 14 * 3 * 8 - 0.001 / 32) + STEP["composer"],  # 3.36 ms host: 106.52 + 0.6 ms
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_fixed_overheads_are_the_host_issue_time_beyond_the_gpu_and_the_per_microbatch_cost(name):
    p = plan(1, tp=4)  # dp = 1: 32 micro-batches
    assert slots(p) == 32
    cost = CostBreakdown(
        step_time_s=0.01,
        compute_s=0.001,
        bubble_s=0,
        pp_comm_s=0,
        dp_comm_s=0,
        tp_comm_s=0,
        optimizer_s=0,
        tokens_per_s=1,
        mfu=0.1,
        peak_memory_bytes=(1,),
        memory_capacity_bytes=(2,),
        bottleneck="compute",
    )
    prof = profile_named(name)
    assert fixed_overheads_s(p, cost, prof, Figures()) == pytest.approx(HAND[name])
    assert fixed_overheads_s(p, cost, prof, Figures(microbatch_s=0.002)) == pytest.approx(HAND[name] + 32 * 0.002)
    assert fixed_overheads_s(p, cost, prof, Figures(step_s=0.05)) == pytest.approx(HAND[name] - STEP[name] + 0.05)
    assert fixed_overheads_s(p, cost, prof, Figures(), gpu=False) == 0.0  # CPU ranks: compute is the host's
    gpu_bound = cost.model_copy(update={"compute_s": 10.0})
    assert fixed_overheads_s(p, gpu_bound, prof, Figures()) == pytest.approx(STEP[name])  # only the step's


def test_the_runtime_changes_memory_and_the_ranking():
    # eager attention with dropout keeps (2e + 1)·a·s²·b/t bytes a block: 2.5 × 2·16·4096² = 1,342,177,280
    assert eager_attention_kept_bytes(MODEL, 1, 4096, 1, "bf16", True) == 1_342_177_280
    ds = price_under(plan(1), MODEL, CLUSTER, profile_named("deepspeed"))
    mg = price_under(plan(1), MODEL, CLUSTER, profile_named("megatron"))
    assert ds.peak_memory_bytes[0] - mg.peak_memory_bytes[0] >= 8 * 1_342_177_280
    assert "priced for runtime deepspeed" in ds.notes[-1]

    def best(name: str) -> int:
        priced = [(price_under(plan(mb), MODEL, CLUSTER, profile_named(name)), mb) for mb in (1, 2, 4, 8)]
        return min((not c.feasible, c.step_time_s, mb) for c, mb in priced)[2]

    # flash attention and a fused loss fit micro-batch 8 in 40 GB; SDPA + fp32 logits stop at 4; eager at 1
    assert (best("megatron"), best("meshplan"), best("deepspeed")) == (8, 4, 1)


def test_kernel_scale_moves_every_fraction_and_unknown_runtimes_are_named():
    k = scaled_kernels(PRIOR, 0.5)
    assert k.gemm_fraction("Ampere") == pytest.approx(0.4) and k.flash_fraction("Hopper") == pytest.approx(0.175)
    assert scaled_kernels(PRIOR, 2.0).gemm_fraction("Ampere") == 1.0  # never above the peak
    with pytest.raises(MeshplanError, match="runtime.*megatron"):
        profile_named("jax")
    assert set(PROFILES) == {"meshplan", "torchtitan", "megatron", "deepspeed", "composer"}


def test_fit_recovers_known_figures():
    # synthetic runs: compute 1 s at scale 1 runs at 1/scale; 0.05 s per slot; true scale 0.6
    runs = [(c, k) for c in (0.5, 1.0, 2.0, 4.0) for k in (1, 4, 16)]
    measured = [c / 0.6 + k * 0.05 for c, k in runs]
    scale, mb = fit_figures(lambda s: [(c / s, k, m) for (c, k), m in zip(runs, measured, strict=True)])
    assert scale == pytest.approx(0.6, rel=0.02) and mb == pytest.approx(0.05, rel=0.05)
    only_scale, zero = fit_figures(lambda s: [(c / s, k, c / 0.6) for c, k in runs], fit_microbatch=False)
    assert zero == 0.0 and math.isclose(only_scale, 0.6, rel_tol=0.02)


def test_three_runs_fit_scale_and_microbatch_jointly_pulled_toward_the_prior_never_below_zero():
    runs = [(0.5, 1), (1.0, 4), (2.0, 16)]  # (compute s at scale 1, slots): true scale 0.6

    def fit(mb_true: float, reg: float) -> tuple[float, float, float]:
        measured = [c / 0.6 + k * mb_true for c, k in runs]
        return fit_terms(lambda s: [(c / s, k, m) for (c, k), m in zip(runs, measured, strict=True)], reg=reg)

    free, pulled = fit(0.02, 0.0), fit(0.02, REG)
    assert free[0] == pytest.approx(0.6, rel=0.02) and free[1] == pytest.approx(0.02, rel=0.1)
    assert 0.0 <= pulled[1] < free[1] and pulled[2] == 0.0  # toward the prior (0), the step cost not fitted
    assert fit(-0.005, 0.0)[1] == 0.0 and fit(-0.005, REG)[1] == 0.0  # a cost is never negative


def test_transformer_engine_caches_the_fp8_weight_once_a_step_torchao_keeps_one_per_microbatch():
    from dataclasses import replace

    from planner.cost.estimate import estimate
    from planner.cost.memory import Stack, block_kept_bytes, fp8_cached_weight_bytes, linear_weight_params

    lwp = linear_weight_params(MODEL, 2)  # 1 byte per linear parameter of a block on a tp rank
    assert lwp == (2048 * 3 * 2048 + 2048 * 2048 + 2 * 2048 * 8192) / 2
    cached, plain = Stack(fp8=True, fp8_weight_cached=True), Stack(fp8=True)
    kept = [block_kept_bytes(MODEL, 1, 4096, 2, "bf16", st, 1e9) for st in (plain, cached)]
    assert kept[0] - kept[1] == pytest.approx(lwp)
    assert fp8_cached_weight_bytes(MODEL, 2, cached) == lwp and fp8_cached_weight_bytes(MODEL, 2, plain) == 0.0
    # end to end on H100s, pp 2 (stage 0 holds 2 micro-batches in flight under 1F1B, 4 blocks):
    # caching saves (2 − 1) × 4 × lwp on stage 0, × (1 + 0.10) for the allocator's fragmentation
    # (formulas.FRAGMENTATION_FRACTION)
    node = NODE.model_copy(update={"device": "H100-SXM5-80GB"})
    cluster = ClusterSpec(name="c", nodes=(node,))
    stages = (
        StagePlan(layer_start=0, layer_end=4, device_ids=(0, 1), dp=1, tp=2),
        StagePlan(layer_start=4, layer_end=8, device_ids=(2, 3), dp=1, tp=2),
    )
    p = plan(1).model_copy(update={"stages": stages, "batch_shares": (32,), "fp8": True})
    meg = profile_named("megatron")
    te = estimate(p, MODEL, cluster, runtime=meg.overlap)
    ao = estimate(p, MODEL, cluster, runtime=replace(meg.overlap, fp8_weight_cached=False))
    assert ao.peak_memory_bytes[0] - te.peak_memory_bytes[0] == pytest.approx(1.1 * 4 * lwp, rel=1e-6)
