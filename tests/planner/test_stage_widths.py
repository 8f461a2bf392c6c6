"""Plans whose stages differ in tp and dp: what a Plan accepts, how `estimate` prices them, and that
the runtime contract takes them (the torch runtime runs them: tests/worker/test_train_stages.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cost import estimate
from planner.cost.estimate import plan_profile_needs
from planner.errors import MeshplanError
from planner.replan.options import replica_times
from planner.runtime import boundary_pieces, launch_problems, loss_weight, rank_map
from planner.specs.cluster import parse_cluster_toml
from planner.specs.model import get_model
from planner.specs.plan import parse_plan

A100 = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "a100-8x8-ib200.toml"


def _plan(widths, splits=((0, 1), (1, 4)), shares=(8,), mbs=2, model="tiny", seq=32):
    stages, first = [], 0
    for (a, b), (tp, dp) in zip(splits, widths, strict=True):
        stages.append(
            {"layer_start": a, "layer_end": b, "device_ids": list(range(first, first + tp * dp)), "tp": tp, "dp": dp}
        )
        first += tp * dp
    return parse_plan(
        {
            "model": model,
            "cluster": "c",
            "global_batch_size": sum(shares),
            "seq_len": seq,
            "micro_batch_size": mbs,
            "dtype": "fp32",
            "stages": stages,
            "batch_shares": list(shares),
        }
    )


def test_a_stage_of_dp2_after_one_of_dp1_splits_each_micro_batch_in_two():
    plan = _plan([(2, 1), (1, 2)])
    assert plan.dp == 1 and plan.num_microbatches() == 4
    assert launch_problems(plan, 4) == ()
    slots = rank_map(plan)
    assert [(s.stage, s.replica, s.pipeline, s.slice_index, s.num_slices) for s in slots] == [
        (0, 0, 0, 0, 1),
        (0, 0, 0, 0, 1),
        (1, 0, 0, 0, 2),
        (1, 1, 0, 1, 2),
    ]
    # stage 0's tp leader (rank 0) sends sample 0 of each micro-batch to rank 2 and sample 1 to rank 3
    assert [(pc.src, pc.dst, pc.start, pc.stop) for pc in boundary_pieces(plan, 0)] == [(0, 2, 0, 1), (0, 3, 1, 2)]
    assert loss_weight(plan) == 1 / 8  # a last-stage slice is one sample of the global 8
    assert {(n.mbs, n.tp) for n in plan_profile_needs(plan)} == {(2, 2), (1, 1)}


def test_dp_2_and_4_make_two_pipeline_replicas_with_their_own_shares():
    plan = _plan([(1, 2), (1, 4)], shares=(6, 2))
    assert plan.dp == 2 and [plan.num_microbatches(r) for r in range(2)] == [3, 1]
    assert [(s.rank, s.pipeline, s.slice_index) for s in rank_map(plan)[2:]] == [
        (2, 0, 0),
        (3, 0, 1),
        (4, 1, 0),
        (5, 1, 1),
    ]
    merged = [(pc.pipeline, pc.src, pc.dst, pc.start, pc.stop) for pc in boundary_pieces(plan, 0)]
    assert merged == [(0, 0, 2, 0, 1), (0, 0, 3, 1, 2), (1, 1, 4, 0, 1), (1, 1, 5, 1, 2)]


def test_a_slice_must_hold_whole_samples():
    with pytest.raises(MeshplanError) as err:
        _plan([(1, 1), (1, 4)], mbs=2)
    assert err.value.field == "stages[1].dp" and "multiple of 4" in str(err.value)
    with pytest.raises(MeshplanError, match="one share per replica"):
        _plan([(1, 2), (1, 4)], shares=(8,))


def test_widening_the_bottleneck_stage_in_dp_prices_its_compute_on_half_micro_batches():
    """Stage 1 holds 9 of 12 blocks: at dp2 each replica runs half of every micro-batch, so the
    pipeline's slot (and the step) shrink, and stage 1 gains a gradient all-reduce it lacked at dp1."""
    spec, cluster = get_model("gpt2-small"), parse_cluster_toml(A100.read_text())
    splits = ((0, 3), (3, 12))
    # at gpt2-small's full sequence every GEMM fills many waves of SMs, so half the samples is about
    # half the time (at a toy sequence one wave holds both, and wave quantisation prices them alike)
    narrow = _plan([(1, 1), (1, 1)], splits, shares=(32,), mbs=4, model="gpt2-small", seq=1024)
    wide = _plan([(1, 1), (1, 2)], splits, shares=(32,), mbs=4, model="gpt2-small", seq=1024)
    a, b = estimate(narrow, spec, cluster), estimate(wide, spec, cluster)
    assert not any(n.startswith("runtime:") for n in b.notes)
    assert b.step_time_s < a.step_time_s
    assert b.compute_s < 0.75 * a.compute_s  # the critical stage's compute, on 2 of 4 samples
    assert b.dp_comm_s > a.dp_comm_s == 0.0
    parts = b.compute_s + b.bubble_s + b.pp_comm_s + b.tp_comm_s + b.dp_comm_s + b.optimizer_s
    assert parts == pytest.approx(b.step_time_s, rel=1e-9)


def test_replanning_prices_each_pipeline_replica_of_a_plan_with_stages_of_different_dp():
    spec, cluster = get_model("gpt2-small"), parse_cluster_toml(A100.read_text())
    plan = _plan([(1, 2), (1, 4)], ((0, 3), (3, 12)), shares=(16, 16), mbs=4, model="gpt2-small")
    step, times = replica_times(plan, spec, cluster, None)
    assert times == [pytest.approx(step), pytest.approx(step)]  # one kind of device: the replicas tie


def test_a_gpt3_175b_plan_mixing_tp_4_and_8_is_launchable():
    plan = _plan([(8, 1), (4, 1)], ((0, 40), (40, 96)), shares=(8,), mbs=1, model="gpt3-175b")
    assert launch_problems(plan, 12, get_model("gpt3-175b")) == ()
