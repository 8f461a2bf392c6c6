"""Memory terms of real stacks (planner.cost.memory), each pinned to a hand count.

tiny: h = 64, a = 4 heads, ffn = 256, V = 256, 4 blocks; b = 2, s = 64, bf16 (e = 2) unless said.
"""

import pytest

from planner.cost import estimate
from planner.cost import formulas as F
from planner.cost import memory as M
from planner.cost.compute import attention_train_s
from planner.cost.estimate import gpu_device
from planner.runtime import launch_problems
from planner.specs import flops
from planner.specs.cluster import parse_cluster
from planner.specs.model import get_model
from planner.specs.plan import Plan, StagePlan, parse_plan_json
from tests.planner.test_cost_estimate import GOLDEN

TINY = get_model("tiny")
B, S = 2, 64
L = B * S * TINY.padded_vocab  # logit elements of one micro-batch: 32768


def one_gpu(device="T4"):
    return parse_cluster(
        {
            "name": "c",
            "nodes": [
                {
                    "name": "n",
                    "device": device,
                    "num_devices": 1,
                    "count": 1,
                    "intra_link": "pcie3",
                    "inter_link": "eth-100g",
                }
            ],
        }
    )


def plan(model=TINY, seq=S, mbs=B, recompute="none", every=1, **kw):
    stage = StagePlan(
        layer_start=0, layer_end=model.num_layers, device_ids=(0,), recompute=recompute, recompute_every=every
    )
    return Plan(
        model=model.name,
        cluster="c",
        global_batch_size=mbs,
        seq_len=seq,
        micro_batch_size=mbs,
        stages=(stage,),
        batch_shares=(mbs,),
        **kw,
    )


def peak(p, model=TINY, device="T4"):
    return estimate(p, model, one_gpu(device)).peak_memory_bytes[0]


def alloc_delta(a, b):
    """Difference of allocated bytes behind two peaks (peak = alloc × (1 + frag) + reserve)."""
    return (peak(a) - peak(b)) / (1 + F.FRAGMENTATION_FRACTION)


def test_loss_kernels_keep_and_allocate_per_logit_what_they_hold():
    assert flops.loss_logit_bytes("torch", "bf16") == (6, 8)  # bf16 logits + fp32 log-softmax; 2 fp32 grads
    assert flops.loss_logit_bytes("vocab-parallel", "bf16") == (4, 2)  # fp32 copy in place; bf16 grad
    assert flops.loss_logit_bytes("fused", "bf16") == (2, 2)  # bf16 logits; their bf16 grad
    assert flops.loss_logit_bytes("torch", "fp32") == (8, 8)


def test_fused_loss_drops_the_fp32_logits_from_the_stage_peak():
    # torch: kept 6L, head workspace 8L = 262144 > block workspace 2·(b·s·ffn·e) = 131072
    # fused: kept 2L, workspace max(2L = 65536, 131072) = 131072
    # Δ = (6 − 2)·L + (262144 − 131072) = 131072 + 131072
    assert alloc_delta(plan(), plan(loss="fused")) == pytest.approx(262144, abs=2)


def test_eager_attention_keeps_the_softmax_per_head_and_dropout_adds_mask_and_output():
    scores = 2 * B * 4 * S * S  # e·b·a·s² = 65536
    assert M.attention_scores_bytes(TINY, B, S, 1, "bf16") == scores
    assert M.eager_attention_kept_bytes(TINY, B, S, 1, "bf16", False) == scores
    assert M.eager_attention_kept_bytes(TINY, B, S, 2, "bf16", True) == scores / 2 * 5 / 2  # (2e + 1)/e, tp 2
    # 4 blocks × 65536; the workspace max(2·scores, 2·b·s·ffn·e) = 131072 is the same either way
    assert alloc_delta(plan(attention="eager"), plan()) == pytest.approx(4 * scores, abs=2)


def test_flash_layout_saves_the_output_projection_copy():
    assert alloc_delta(plan(), plan(attention="flash")) == pytest.approx(4 * 2 * B * S * 64, abs=2)  # 4 × e·bsh


def test_hidden_dropout_keeps_two_byte_masks_per_block():
    assert M.hidden_dropout_mask_bytes(TINY, B, S) == 2 * B * S * 64
    # eager + dropout: 4 × (2.5 · 65536 + 16384) over eager alone (4 × 65536)
    extra = alloc_delta(plan(attention="eager", dropout=True), plan(attention="eager"))
    assert extra == pytest.approx(4 * (1.5 * 65536 + 16384), abs=2)


def test_sequence_parallel_shards_the_replicated_norm_activations():
    runtime = flops.block_activation_bytes(TINY, B, S, 2, "bf16")
    replicated = 2 * 4 * S * B * 64  # 4·sbh elements of LayerNorm inputs/outputs = 65536 B
    sp = M.Stack(sequence_parallel=True)
    assert M.block_kept_bytes(TINY, B, S, 2, "bf16", sp, runtime) == pytest.approx(runtime - replicated / 2)
    assert M.block_kept_bytes(TINY, B, S, 1, "bf16", sp, runtime) == runtime  # nothing to shard at tp 1
    assert M.recomputed_kept_bytes(TINY, B, S, 4, "bf16", sp) == 2 * B * S * 64 / 4


def test_selective_recompute_drops_the_scores_and_pays_the_attention_core_forward():
    eager, sel = plan(attention="eager"), plan(attention="eager", recompute="selective")
    # memory: the 4 × 65536 s×s bytes are no longer kept; the one block's set rebuilt in backward
    # (block workspace 131072 + 65536) stays under the head's 8L = 262144
    assert alloc_delta(eager, sel) == pytest.approx(4 * 65536, abs=2)
    # time: core FLOPs 4bs²h = 2,097,152 of the block's 24bsh² + 4bs²h = 14,680,064, i.e. 1/7
    core = flops.attention_core_forward_flops(TINY, B, S)
    assert core / flops.block_forward_flops(TINY, B, S) == pytest.approx(1 / 7)
    a, b = estimate(eager, TINY, one_gpu()), estimate(sel, TINY, one_gpu())
    # on a GPU: 4 blocks each run the eager attention core's forward kernels once more
    t4 = gpu_device(one_gpu().nodes[0], "bf16", None)
    core_fwd = attention_train_s(TINY, B, S, 1, "bf16", t4, "eager", False)[0]
    assert b.compute_s - a.compute_s == pytest.approx(4 * core_fwd, rel=1e-9)


def test_every_kth_block_recompute_mixes_plain_and_recomputed_blocks():
    none_, full = plan(), plan(recompute="full")
    half = plan(recompute="full", every=2)
    assert M.block_mixed_kept_bytes(100.0, 10.0, 2) == 55.0
    c0, c1, ch = (estimate(p, TINY, one_gpu()) for p in (none_, full, half))
    assert ch.compute_s == pytest.approx((c0.compute_s + c1.compute_s) / 2, rel=1e-9)
    kept_plain, kept_rec = flops.block_activation_bytes(TINY, B, S), flops.block_input_bytes(TINY, B, S)
    # 4 blocks: 2 plain + 2 recomputed; the workspace (head's 8L) is the same in all three plans
    assert alloc_delta(half, full) == pytest.approx(2 * (kept_plain - kept_rec), abs=2)
    with pytest.raises(ValueError, match="recompute_every"):  # pydantic's wrapper of the MeshplanError
        StagePlan(layer_start=0, layer_end=4, device_ids=(0,), recompute="none", recompute_every=2)


def test_zero3_keeps_two_of_the_largest_module_and_its_neighbour_whole():
    assert M.zero3_working_bytes(100, 10, "bf16") == 2 * (2 * 100 + 10)


def test_non_flash_attention_at_long_sequence_is_called_out_of_memory_flash_is_not():
    # gpt3-1.3b, s = 8192, b = 2 on one A100-80GB: eager keeps e·b·a·s² = 2·2·16·8192² = 4.3 GB per
    # block, × 24 blocks ≈ 103 GB > 80 GiB; flash keeps ~1 GB per block
    m = get_model("gpt3-1.3b")
    p = plan(model=m, seq=8192, mbs=2)
    assert estimate(p, m, one_gpu("A100-SXM4-80GB")).feasible
    eager = estimate(p.model_copy(update={"attention": "eager"}), m, one_gpu("A100-SXM4-80GB"))
    assert not eager.feasible and eager.bottleneck.startswith("memory")


def test_new_fields_at_their_defaults_keep_old_plan_ids_and_the_runtime_refuses_other_stacks():
    golden = parse_plan_json(GOLDEN.read_text())
    assert golden.fingerprint() == "a0d00d4ed4c9f8ee"  # its id before these fields existed (main dbeb780)
    assert golden.model_copy(update={"loss": "fused"}).fingerprint() != golden.fingerprint()
    assert not [q for q in launch_problems(golden) if q.field in ("attention", "loss", "dropout")]
    odd = plan(attention="eager", loss="fused", dropout=True)
    assert {q.field for q in launch_problems(odd)} >= {"attention", "loss", "dropout"}
    assert any("runtime: attention" in n for n in estimate(odd, TINY, one_gpu()).notes)
