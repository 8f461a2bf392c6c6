"""The terms that make a CPU rank's price compose like the run (issue #42 item 7), each pinned to a hand count:
the gradient packing buffer, the measured runtime reserve and the gradient norm's all-reduces."""

from __future__ import annotations

import dataclasses

import pytest

from planner.cost import estimate
from planner.cost import formulas as F
from planner.cost.memory import grad_pack_buffer_bytes
from planner.cost.overlap import RUNTIMES
from planner.measure.calibrate import Calibration, cpu_calibration, small_allreduce_from
from planner.specs.flops import tp_sharded_tensors
from planner.specs.model import ModelSpec, get_model
from tests.planner.test_calibrate import cpu_cluster, plan, tp_plan

BUCKET = 25 * 2**20
# the fidelity bench's model (bench/fidelity.py): 8 blocks of 789,760 parameters (12h² + 13h at h = 256),
# a 512 × 256 token table + 128 × 256 positions (163,840) and a LayerNorm + 512 × 256 head (131,584)
FIDELITY = ModelSpec(name="fid", family="gpt", num_layers=8, hidden=256, num_heads=4, vocab_size=512, seq_len=128)


def test_grad_pack_buffer_is_the_small_gradients_up_to_one_bucket_and_its_last_tensor():
    # every tensor is small (largest: the 256 × 1024 MLP weight, 1 MiB): all of them fit one bucket
    # of 26,454,016 B < 25 MiB + 1 MiB, so the buffer holds them all
    assert grad_pack_buffer_bytes(FIDELITY, 1, "fp32", BUCKET) == 4 * (8 * 789_760 + 163_840 + 131_584)
    # twice the blocks: 51.7 MB of small gradients; a bucket closes at ≥ 25 MiB, so at most
    # 25 MiB + the largest small tensor (1 MiB)
    deep = FIDELITY.model_copy(update={"num_layers": 16})
    assert grad_pack_buffer_bytes(deep, 1, "fp32", BUCKET) == BUCKET + 4 * 256 * 1024
    # tensors of 25 MiB or more are reduced in place: a block of 64 MiB projections packs only the
    # embedding and head (2 × 4 MiB tables + positions + the head's norm)
    wide = ModelSpec(name="wide", family="gpt", num_layers=4, hidden=2048, num_heads=16, vocab_size=512, seq_len=64)
    assert grad_pack_buffer_bytes(wide, 1, "fp32", BUCKET) == 4 * (512 * 2048 + 64 * 2048 + 2 * 2048 + 512 * 2048)


def test_unsharded_dp_peak_holds_the_pack_buffer_and_the_measured_reserve():
    model, cl = get_model("tiny"), cpu_cluster(2)
    base = Calibration(num_ranks=2)
    measured = dataclasses.replace(base, runtime_reserve_bytes=340 * 2**20)
    none = estimate(plan(dp=2), model, cl, calibration=base).peak_memory_bytes[0]
    # discovery's resident set replaces the 0.25 GiB stand-in, nothing else moves
    got = estimate(plan(dp=2), model, cl, calibration=measured).peak_memory_bytes[0]
    assert got - none == pytest.approx(340 * 2**20 - F.RUNTIME_RESERVE_BYTES_CPU, abs=1)
    # tiny's gradients are all small: the buffer holds every one of them (× the allocator's 10 %)
    buf = grad_pack_buffer_bytes(model, 1, "fp32", BUCKET)
    assert buf == 4 * (4 * model.block_params() + model.embedding_params() + model.head_params())
    megatron = estimate(plan(dp=2), model, cl, calibration=base, runtime=RUNTIMES["megatron"]).peak_memory_bytes[0]
    assert none - megatron == pytest.approx(buf * (1 + F.FRAGMENTATION_FRACTION), abs=1)
    # ZeRO shards the gradients through FSDP2: no packing buffer (its own working buffers instead)
    one = estimate(plan(dp=1), model, cpu_cluster(1), calibration=Calibration(num_ranks=1)).peak_memory_bytes[0]
    assert none > one  # the buffer is charged only where replicas sum gradients through GradSumSync


def test_gradient_norm_all_reduces_a_scalar_per_tp_sharded_tensor_and_once_over_the_world():
    model, cl = get_model("tiny"), cpu_cluster(2)
    # a GPT block's tp-sharded tensors: q, k, v and the MLP's up projection with their biases, o and
    # the down projection's weights
    assert tp_sharded_tensors(model) == 10
    assert tp_sharded_tensors(get_model("tiny").model_copy(update={"family": "llama"})) == 7
    rows = [
        {"op": "all_reduce", "message_bytes": 1024, "time_s": 3e-4},
        {"op": "all_reduce", "message_bytes": 1 << 20, "time_s": 9e-3},
    ]
    assert small_allreduce_from(rows) == 3e-4
    cal = cpu_calibration(50e9, [50e9, 50e9], [], 2, measurements=rows)
    assert cal.scalar_allreduce_s(2) == 3e-4 and cal.scalar_allreduce_s(3) == pytest.approx(6e-4)
    c = estimate(tp_plan(), model, cl, calibration=cal)
    # 4 blocks × 10 tensors, each one scalar all-reduce over the tp pair, and the world's one: 41 × 0.3 ms
    assert c.dp_comm_s == pytest.approx(41 * 3e-4)
    # another runtime's norm is not worker.train's: nothing booked
    other = estimate(tp_plan(), model, cl, calibration=cal, runtime=RUNTIMES["megatron"])
    assert other.dp_comm_s == 0.0
