"""torchtitan's per-op selective recompute (planner.cost.memory.op_sac_kept_bytes): what a block keeps
and what it runs again, pinned to hand-computed numbers, and priced end to end under the torchtitan
runtime (the Llama 2 70B "selective op" run of torchtitan's 2024-08 table fits in 80 GB)."""

import pytest

from planner.cost import memory as M
from planner.cost.runtimes import MEGATRON_RT, TORCHTITAN_RT, price_under
from planner.measure.runs_file import row_plan
from planner.specs.cluster import LINK_PRESETS, ClusterSpec, NodeSpec
from planner.specs.model import ModelSpec

L70 = ModelSpec(
    name="llama2-70b", family="llama", num_layers=80, hidden=8192, num_heads=64, num_kv_heads=8,
    ffn_hidden=28672, vocab_size=32000, seq_len=4096, tie_embeddings=False,
)  # fmt: skip


def test_kept_bytes_by_hand():
    # tp 1: input h + wq h + wv kv + w1 f + w2 h + SDPA out h = 4·8192 + 1024 + 28672 = 62464 per token,
    # × 2 B × 4096 tokens, + the fp32 log-sum-exp 4 × 4096 × 64 heads
    assert M.op_sac_kept_bytes(L70, 1, 4096, 1, "bf16", False) == 62464 * 2 * 4096 + 4 * 4096 * 64
    # tp 8 with sequence parallelism: input h/8, wq h/8, wv kv/8, w1 f/8, w2's partial sum h, SDPA h/8,
    # two reduce-scatter outputs 2h/8: 1024 + 1024 + 128 + 3584 + 8192 + 1024 + 2048 = 17024
    assert M.op_sac_kept_bytes(L70, 1, 4096, 8, "bf16", True) == 17024 * 2 * 4096 + 4 * 4096 * 8
    # the attention-core kind keeps Korthikanti's 34·s·b·h bytes here: per-op keeps less than half
    assert M.op_sac_kept_bytes(L70, 1, 4096, 1, "bf16", False) < 0.5 * 34 * 4096 * 8192
    # what it runs again: wk, wo, w3 = 2·b·s·h·(kv + h + f)
    assert M.op_sac_recompute_flops(L70, 1, 4096, 1) == 2 * 4096 * 8192 * (1024 + 8192 + 28672)


def test_torchtitan_selective_op_70b_fits_where_the_attention_core_kind_does_not():
    node = NodeSpec(
        name="n", device="A100-SXM4-80GB", num_devices=8, count=8,
        intra_link=LINK_PRESETS["nvlink3"], inter_link=LINK_PRESETS["ib-hdr"],
    )  # fmt: skip
    cluster = ClusterSpec(name="c", nodes=(node,))
    plan = row_plan(
        L70, "c", tp=1, pp=1, dp=64, cp=1, vpp=1, global_batch=64, micro_batch=1, recompute="selective",
        sharding="zero3", dtype="bf16", fp8=False, recompute_every=1, sequence_parallel=False, attention="flash",
        loss="torch", dropout=False,
    )  # fmt: skip
    titan = price_under(plan, L70, cluster, TORCHTITAN_RT, restack=False)
    core = price_under(plan, L70, cluster, MEGATRON_RT, restack=False)
    assert titan.feasible and not core.feasible
    cap = titan.memory_capacity_bytes[0]
    assert titan.peak_memory_bytes[0] < 0.9 * cap < core.peak_memory_bytes[0]


def test_megatron_te_block_keeps_less_than_the_runtime_block():
    """Llama 3.1 405B block, tp 8 with sequence parallelism, s/cp = 4096 tokens, bf16. The runtime block
    (flops.block_activation_bytes) keeps 6h (un-fused RMSNorms, 1/t under SP) + (3h + 2h + 4f)/t per
    token; flash drops the transposed copy (h/t). Megatron-core + TE also drop the GQA repeat
    (2h − 2kv)/t, the norms' x·rstd (2h/t under SP) and SwiGLU's 4th tensor (f/t):
    (6h + 2kv + 3f)/8 = (98304 + 2048 + 159744)/8 = 32512 elements per token."""
    m = ModelSpec(
        name="405b", family="llama", num_layers=126, hidden=16384, num_heads=128, num_kv_heads=8,
        ffn_hidden=53248, vocab_size=128256, seq_len=8192, tie_embeddings=False,
    )  # fmt: skip
    from planner.specs import flops

    runtime = flops.block_activation_bytes(m, 1, 4096, 8, "bf16")
    te = M.Stack(attention="flash", sequence_parallel=True, fused_block=True)
    assert M.gqa_repeat_bytes(m, 1, 4096, 8, "bf16", te) == 2 * 4096 * 2 * (16384 - 1024) / 8
    assert M.fused_block_saved_bytes(m, 1, 4096, 8, "bf16", te) == 2 * 4096 * (2 * 16384 / 8 + 53248 / 8)
    assert M.block_kept_bytes(m, 1, 4096, 8, "bf16", te, runtime) == pytest.approx(32512 * 2 * 4096)
    # without the fused kernels (flash alone): (10h − 2h + 2kv + 4f)/8 … the GQA term only
    flash = M.Stack(attention="flash", sequence_parallel=True)
    assert M.block_kept_bytes(m, 1, 4096, 8, "bf16", flash, runtime) == pytest.approx(
        (32512 + (2 * 16384 + 53248) / 8) * 2 * 4096
    )
    # GPT blocks and SDPA stacks are untouched
    gpt = ModelSpec(name="g", family="gpt", num_layers=2, hidden=1024, num_heads=16, vocab_size=50257, seq_len=1024)
    assert M.fused_block_saved_bytes(gpt, 1, 1024, 1, "bf16", te) == 0.0
    assert M.gqa_repeat_bytes(m, 1, 4096, 8, "bf16", M.Stack(attention="sdpa")) == 0.0


def test_expandable_segments_charge_no_fragmentation():
    """torchtitan runs the allocator with expandable segments: peak = allocated + the 1 GiB reserve,
    where the same plan with the default allocator pays 10 % on the allocations."""
    from dataclasses import replace

    from planner.cost import formulas as F
    from planner.cost import overlap as OV
    from planner.cost.estimate import estimate

    assert F.peak_memory_bytes(2**30, "H100-SXM5-80GB", F.FRAGMENTATION_FRACTION_EXPANDABLE) == 2 * 2**30
    node = NodeSpec(
        name="n", device="A100-SXM4-80GB", num_devices=8, count=1,
        intra_link=LINK_PRESETS["nvlink3"], inter_link=LINK_PRESETS["ib-hdr"],
    )  # fmt: skip
    small = L70.model_copy(update={"num_layers": 4})
    plan = row_plan(
        small, "c", tp=1, pp=1, dp=8, cp=1, vpp=1, global_batch=8, micro_batch=1, recompute="none",
        sharding="zero3", dtype="bf16", fp8=False, recompute_every=1, sequence_parallel=False, attention="sdpa",
        loss="torch", dropout=False,
    )  # fmt: skip
    cluster = ClusterSpec(name="c", nodes=(node,))
    reserve = F.RUNTIME_RESERVE_BYTES_GPU
    titan = estimate(plan, small, cluster, runtime=OV.TORCHTITAN).peak_memory_bytes[0] - reserve
    plain = estimate(plan, small, cluster, runtime=replace(OV.TORCHTITAN, expandable_segments=False))
    assert plain.peak_memory_bytes[0] - reserve == pytest.approx(titan * (1 + F.FRAGMENTATION_FRACTION), rel=1e-6)
