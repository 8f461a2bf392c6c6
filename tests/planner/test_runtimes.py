"""Runtime profiles (planner.cost.runtimes): each runtime's terms pinned by hand, and the runtime
changing memory and the ranking of plans; the figures' fit recovers known figures."""

import math

import pytest

from planner.cost.compute import PRIOR
from planner.cost.estimate import estimate
from planner.cost.memory import eager_attention_kept_bytes
from planner.cost.runtimes import (
    PROFILES,
    REG,
    Figures,
    Pricing,
    apply_stack,
    fit_figures,
    fit_terms,
    price,
    price_under,
    profile_named,
    scaled_kernels,
    slots,
)
from planner.errors import MeshplanError
from planner.specs.cluster import LINK_PRESETS, ClusterSpec, NodeSpec, parse_cluster
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan, StagePlan

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


# once a step launch_s × kernels per step (issue #42's per-step term; 0.6 ms for meshplan); a GPU block
# issues 3 × launch_s × kernels_per_block (forward + 2× backward): its time's floor
STEP = {
    "meshplan": 10e-6 * 60,
    "torchtitan": 10e-6 * 60,
    "megatron": 7e-6 * 40,
    "deepspeed": 10e-6 * 80,
    "composer": 10e-6 * 60,
}
ISSUE = {  # launch_s × kernels_per_block: one block's forward
    "meshplan": 10e-6 * 16,  # 160 µs: a block at least 480 µs
    "torchtitan": 10e-6 * 16,
    "megatron": 7e-6 * 12,  # 84 µs: 252 µs
    "deepspeed": 10e-6 * 24,  # 240 µs: 720 µs
    "composer": 10e-6 * 14,  # 140 µs: 420 µs
}
# a model whose blocks take microseconds on an A100: every runtime's issue floor binds
TINY = ModelSpec(name="t", family="gpt", num_layers=8, hidden=64, num_heads=4, vocab_size=512, seq_len=128)


def one_gpu(schedule: str = "1f1b", pp: int = 1, v: int = 1) -> Plan:
    """TINY on pp GPUs, 32 micro-batches of 1."""
    n = 8 // (pp * v)
    stages = tuple(
        StagePlan(layer_start=e * n, layer_end=(e + 1) * n, device_ids=(e % pp,), dp=1, tp=1) for e in range(pp * v)
    )
    return Plan(model="t", cluster="c", global_batch_size=32, seq_len=128, micro_batch_size=1, dtype="bf16",
                schedule=schedule, virtual_stages=v, stages=stages, batch_shares=(32,))  # fmt: skip


@pytest.mark.parametrize("name", sorted(ISSUE))
def test_fixed_costs_are_stage_terms_pinned_by_hand(name):
    """Pricing's fixed costs (planner.cost.stage.Overheads): the issue floor of a GPU block, a cost per
    micro-batch on every stage (slots: m + pp − 1; m·v + pp − 1 interleaved) and one per step."""
    from dataclasses import replace

    prof, none = profile_named(name), Figures(step_s=0.0)
    pc = Pricing(prof)
    assert pc.overheads.issue_s == pytest.approx(ISSUE[name]) and pc.overheads.microbatch_s == 0.0
    assert pc.step_s(gpu=True) == pytest.approx(STEP[name]) and pc.step_s(gpu=False) == 0.0

    def step(p: Plan, pr=prof, fig=none) -> float:
        return price_under(p, TINY, CLUSTER, pr, fig).step_time_s

    p = one_gpu()
    assert slots(p) == 32
    # the floor binds for all 8 blocks of all 32 micro-batches: twice the kernels, twice the floor
    twice = replace(prof, kernels_per_block=2 * prof.kernels_per_block)
    assert step(p, twice) - step(p) == pytest.approx(32 * 8 * 3 * ISSUE[name], rel=1e-9)
    assert step(p, fig=Figures(step_s=0.0, microbatch_s=0.002)) - step(p) == pytest.approx(32 * 0.002, rel=1e-9)
    assert step(p, fig=Figures()) - step(p) == pytest.approx(STEP[name], rel=1e-9)  # the step's prior
    assert step(p, fig=Figures(step_s=0.05)) - step(p) == pytest.approx(0.05, rel=1e-9)
    # a rank's micro-batch cost in every slot of the pipeline: 32 + 2 − 1 under 1F1B at pp 2; 32 + 1/2
    # interleaved over 2 chunks a rank (each chunk pays half)
    for q, n in ((one_gpu(pp=2), 33), (one_gpu("interleaved-1f1b", pp=2, v=2), 32.5)):
        assert slots(q) == n
        assert step(q, fig=Figures(step_s=0.0, microbatch_s=0.002)) - step(q) == pytest.approx(n * 0.002, rel=1e-9)
    # CPU ranks: their compute is the host's (no floor), no per-step prior; meshplan's then prices as estimate
    node = {"name": "c", "device": "cpu", "num_devices": 4, "intra_link": "pcie3", "inter_link": "eth-10g"}
    cpu = parse_cluster(
        {"name": "c", "nodes": [dict(node, device_memory_bytes=8 * 2**30, device_peak_flop_per_s=1e11)]}
    )
    assert price_under(p, TINY, cpu, twice, none).step_time_s == price_under(p, TINY, cpu, prof, none).step_time_s
    assert Pricing(profile_named("meshplan")).plain_on(cpu) and not Pricing(profile_named("meshplan")).plain_on(CLUSTER)
    assert price(p, TINY, cpu, Pricing(profile_named("meshplan"))) == estimate(p, TINY, cpu)


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
