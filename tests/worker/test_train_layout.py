"""Plan → rank layout and launch command, without launching anything (fast)."""

import pytest
import torch

from launcher.launch import Launch, torchrun_command
from planner.errors import MeshplanError
from planner.runtime import check_launchable, device_to_rank, launch_problems, rank_map, rank_plan
from planner.specs.plan import parse_plan
from worker.data import batch_rows, replica_rows
from worker.parallel import mesh_ranks, rank_layout


def _plan(stages, shares=(8,), schedule="1f1b", v=1, mbs=2):
    return parse_plan(
        {
            "model": "tiny",
            "cluster": "c",
            "global_batch_size": sum(shares),
            "seq_len": 32,
            "micro_batch_size": mbs,
            "schedule": schedule,
            "virtual_stages": v,
            "stages": stages,
            "batch_shares": list(shares),
        }
    )


def _st(a, b, ids, tp=1, dp=1, sharding="none"):
    return {"layer_start": a, "layer_end": b, "device_ids": ids, "tp": tp, "dp": dp, "sharding": sharding}


def test_ranks_are_stage_major_whatever_the_device_order():
    plan = _plan([_st(0, 1, [0, 2, 4, 6], tp=2, dp=2), _st(1, 4, [1, 3, 5, 7], tp=2, dp=2)], shares=(4, 4))
    check_launchable(plan, 8)
    assert mesh_ranks(plan).tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert [sl.device_id for sl in rank_map(plan)] == [0, 2, 4, 6, 1, 3, 5, 7]
    lay = rank_layout(plan, 2)
    assert (lay.stage, lay.replica, lay.tp_index, lay.virtual_stages, lay.device_id) == (0, 1, 0, (0,), 4)
    lay = rank_layout(plan, 7)
    assert (lay.stage, lay.replica, lay.tp_index, lay.device_id) == (1, 1, 1, 7)
    assert lay.has_last(2) and not lay.has_first


@pytest.mark.parametrize(
    "stages",
    [
        [_st(0, 2, [1]), _st(2, 4, [0])],  # later stage, lower id
        [_st(0, 4, [1, 0], tp=2)],  # tp shards out of order
        [_st(0, 2, [7]), _st(2, 4, [3])],  # a subset of the cluster's devices
    ],
)
def test_any_device_order_launches_on_as_many_ranks_as_devices(stages):
    plan = _plan(stages)
    assert launch_problems(plan, 2) == ()
    assert rank_plan(plan).stages[0].device_ids[0] == 0
    assert sorted(device_to_rank(plan).values()) == [0, 1]


def test_interleaved_rank_owns_every_pp_th_stage():
    plan = _plan([_st(0, 1, [0]), _st(1, 2, [1]), _st(2, 3, [0]), _st(3, 4, [1])], schedule="interleaved-1f1b", v=2)
    assert rank_layout(plan, 0).virtual_stages == (0, 2) and rank_layout(plan, 1).virtual_stages == (1, 3)
    assert rank_layout(plan, 1).has_last(4) and rank_layout(plan, 0).has_first


@pytest.mark.parametrize(
    ("plan", "world", "field"),
    [
        (
            _plan(
                [_st(0, 1, [0, 1], tp=2), _st(1, 2, [2]), _st(2, 3, [0, 1], tp=2), _st(3, 4, [2])],
                schedule="interleaved-1f1b",
                v=2,
            ),
            3,
            "schedule",
        ),
        (_plan([_st(0, 4, [0, 1], dp=2)], shares=(4, 4)), 4, "nproc"),
        (_plan([_st(0, 4, [0, 1], dp=2, sharding="zero3")], shares=(6, 2)), 2, "stages.sharding"),
        (_plan([_st(0, 2, [0, 1], dp=2), _st(2, 4, [2, 3], dp=2)], shares=(6, 2)), 4, "batch_shares"),
    ],
)
def test_unrunnable_plans_name_the_field(plan, world, field):
    with pytest.raises(MeshplanError) as err:
        check_launchable(plan, world)
    assert err.value.field == field
    assert field in [p.field for p in launch_problems(plan, world)]


def test_replicas_read_disjoint_slices_of_the_same_global_batch():
    full, _ = batch_rows("text", 3, range(8), 8, 16, 256)
    parts = [batch_rows("text", 3, replica_rows([6, 2], r), 8, 16, 256)[0] for r in range(2)]
    assert torch.equal(torch.cat(parts), full)
    syn = [batch_rows("synthetic", 1, replica_rows([2, 6], r), 8, 16, 256)[0] for r in range(2)]
    assert torch.equal(torch.cat(syn), batch_rows("synthetic", 1, range(8), 8, 16, 256)[0])
    assert not torch.equal(batch_rows("text", 4, range(8), 8, 16, 256)[0], full)  # the stream moves on


def test_launch_command_single_node_is_loopback_multi_node_is_static():
    one = torchrun_command(Launch(plan_path="p.json", run_dir="r", run_id="x"), python="py")
    assert one[:3] == ["py", "-m", "worker.agent"] and "--standalone" not in one  # torchrun on 127.0.0.1 only
    assert one[one.index("-m", 3) + 1] == "worker.train"
    two = torchrun_command(
        Launch(plan_path="p", run_dir="r", run_id="x", nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29400"),
        python="py",
    )
    assert two[:3] == ["py", "-m", "torch.distributed.run"] and "--standalone" not in two
    i = two.index("--master-addr")
    assert two[i : i + 4] == ["--master-addr", "10.0.0.1", "--master-port", "29400"]
    with pytest.raises(MeshplanError, match="HOST:PORT"):
        torchrun_command(Launch(plan_path="p", run_dir="r", run_id="x", nnodes=2, rdzv_endpoint="nohost"))
