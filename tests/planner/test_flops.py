"""FLOP, parameter and activation counts pinned to hand-derived numbers (Megatron SC'21; Korthikanti 2022)."""

import pytest

from planner.specs import flops
from planner.specs.model import PRESETS, ModelSpec


def test_gpt_block_forward_flops_equal_megatron_24bsh2_plus_4bs2h():
    m = PRESETS["gpt2-small"]
    b, s, h = 2, 1024, 768
    assert flops.block_forward_flops(m, b, s) == 24 * b * s * h**2 + 4 * b * s**2 * h


def test_llama3_8b_block_forward_flops_match_hand_derived_swiglu_gqa_count():
    # h=4096, kv dim = 8 heads x 128 = 1024, ffn=14336, b=s=1:
    # QKV 2h(h+2kv) = 50,331,648; out proj 2h^2 = 33,554,432; scores + AV 4h = 16,384;
    # SwiGLU 3 matrices x 2hf = 352,321,536.
    assert flops.block_forward_flops(PRESETS["llama3-8b"], 1, 1) == 436_224_000


def test_block_flops_split_evenly_over_tensor_parallel_ranks():
    m = PRESETS["llama3-8b"]
    assert flops.block_forward_flops(m, 1, 8192, tp=4) == pytest.approx(flops.block_forward_flops(m, 1, 8192) / 4)


def test_head_flops_are_2bshV_with_vocab_padded_to_128():
    m = PRESETS["gpt2-small"]
    assert m.padded_vocab == 50304
    assert flops.head_forward_flops(m, 4, 1024) == 2 * 4 * 1024 * 768 * 50304
    assert flops.head_forward_flops(m, 4, 1024, tp=2) == 4 * 1024 * 768 * 50304


def test_training_flops_are_three_forwards_or_four_with_recompute():
    m = PRESETS["tiny"]
    f = flops.forward_flops("block", m, 2, 64)
    assert flops.training_flops("block", m, 2, 64) == 3 * f
    assert flops.training_flops("block", m, 2, 64, recompute=True) == 4 * f
    assert flops.training_flops("embedding", m, 2, 64) == 0


def test_gpt2_small_block_has_its_known_7_087_872_parameters():
    # 768x2304+2304 (qkv) + 768x768+768 (proj) + 768x3072+3072 (fc) + 3072x768+768 (out) + 2 LayerNorms (4x768)
    assert PRESETS["gpt2-small"].block_params() == 7_087_872


def test_llama3_8b_has_its_known_8_030_261_248_parameters():
    m = PRESETS["llama3-8b"]
    assert m.block_params() == 218_112_000
    assert m.num_params() == 8_030_261_248  # Meta's reported count (untied 128256-vocab embedding and head)


def test_gpt_block_activation_bytes_are_17_sbh_elements_and_tp_splits_13_of_them():
    m = PRESETS["gpt2-small"]
    s, b, h = 1024, 2, 768
    assert flops.block_activation_bytes(m, b, s, 1, "bf16") == 2 * 17 * s * b * h
    assert flops.block_activation_bytes(m, b, s, 2, "fp32") == 4 * (4 + 13 / 2) * s * b * h
    assert flops.block_input_bytes(m, b, s, "fp32") == 4 * s * b * h


def test_model_flops_per_step_sum_blocks_and_head():
    m = ModelSpec(num_layers=2, hidden=64, num_heads=4, vocab_size=256, seq_len=64)
    per_sample = 2 * 3 * (24 * 64 * 64**2 + 4 * 64**2 * 64) + 3 * 2 * 64 * 64 * 256
    assert flops.model_flops_per_step(m, 8, 64) == 8 * per_sample
