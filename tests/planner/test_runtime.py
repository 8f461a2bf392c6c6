"""The runtime contract (planner/runtime.py): the rank map, launch problems, and how the search and
`estimate` use them."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cost import estimate
from planner.errors import MeshplanError
from planner.runtime import (
    boundary_pieces,
    device_to_rank,
    launch_problems,
    launchable_first,
    loss_weight,
    node_ranks,
    rank_map,
    stage_ranks,
)
from planner.search import search
from planner.specs.cluster import parse_cluster_toml
from planner.specs.model import get_model
from planner.specs.plan import parse_plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"


def _plan(stages, shares=(8,), schedule="1f1b", mbs=2):
    return parse_plan(
        {
            "model": "tiny",
            "cluster": "c",
            "global_batch_size": sum(shares),
            "seq_len": 32,
            "micro_batch_size": mbs,
            "schedule": schedule,
            "dtype": "fp32",
            "stages": stages,
            "batch_shares": list(shares),
        }
    )


def _st(a, b, ids, tp=1, dp=1):
    return {"layer_start": a, "layer_end": b, "device_ids": ids, "tp": tp, "dp": dp}


def test_rank_map_is_stage_major_replica_then_tp_and_a_bijection():
    plan = _plan([_st(0, 2, [6, 4, 2, 0], tp=2, dp=2), _st(2, 4, [7, 5, 3, 1], tp=2, dp=2)], shares=(4, 4))
    slots = rank_map(plan)
    assert [s.rank for s in slots] == list(range(8))
    assert [(s.stage, s.replica, s.tp_index) for s in slots[:4]] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert device_to_rank(plan) == {6: 0, 4: 1, 2: 2, 0: 3, 7: 4, 5: 5, 3: 6, 1: 7}
    assert stage_ranks(plan, 1) == [[4, 5], [6, 7]]


def test_a_plan_spanning_nodes_gives_each_node_one_block_of_node_major_ranks_or_is_refused():
    """torchrun numbers ranks node-major: node n of 2-device nodes must run ranks {2b, 2b+1}, b its node_rank."""
    node_of = {d: d // 2 for d in range(4)}
    tp_in_nodes = _plan([_st(0, 2, [2, 3], tp=2), _st(2, 4, [0, 1], tp=2)])  # stage 0 on node 1
    assert node_ranks(tp_in_nodes, node_of, 2) == {1: 0, 0: 1}
    tp_across = _plan([_st(0, 2, [0, 2], tp=2), _st(2, 4, [1, 3], tp=2)])  # each tp group spans both nodes
    with pytest.raises(MeshplanError, match="not one block of 2") as exc:
        node_ranks(tp_across, node_of, 2)
    assert exc.value.value == [0, 2]
    one_each = _plan([_st(0, 4, [1, 0], dp=2)], shares=(4, 4))
    assert node_ranks(one_each, {0: 0, 1: 1}, 1) == {1: 0, 0: 1}


def test_stages_of_different_tp_launch_and_their_leaders_exchange_whole_micro_batches():
    plan = _plan([_st(0, 3, [4, 5], tp=2), _st(3, 4, [1])], schedule="1f1b", mbs=2)
    assert launch_problems(plan, 3) == ()  # also 4 micro-batches of 1f1b on 2 stages of different tp
    assert [(s.stage, s.tp_index, s.pipeline, s.num_slices) for s in rank_map(plan)] == [
        (0, 0, 0, 1),
        (0, 1, 0, 1),
        (1, 0, 0, 1),
    ]
    (pc,) = boundary_pieces(plan, 0)  # tp leader rank 0 sends the whole micro-batch to rank 2
    assert (pc.pipeline, pc.src, pc.dst, pc.start, pc.stop) == (0, 0, 2, 0, 2)
    assert loss_weight(plan) == 2 / 8


def test_equal_dp_boundaries_pair_replica_r_with_replica_r():
    plan = _plan([_st(0, 2, [0, 1, 2, 3], tp=2, dp=2), _st(2, 4, [4, 5], dp=2)], shares=(4, 4))
    assert launch_problems(plan, 6) == ()
    assert [(pc.pipeline, pc.src, pc.dst, pc.start, pc.stop) for pc in boundary_pieces(plan, 0)] == [
        (0, 0, 4, 0, 2),
        (1, 2, 5, 0, 2),
    ]


def test_a_refused_plan_is_marked_by_estimate_and_ranked_after_launchable_ones():
    spec = get_model("tiny")
    cluster = parse_cluster_toml((EXAMPLES / "mixed-a100-v100-t4.toml").read_text())
    bad = _plan([_st(0, 2, [0]), _st(2, 4, [2])], shares=(2,), mbs=2)  # 1 micro-batch < pp under 1f1b
    good = _plan([_st(0, 2, [0]), _st(2, 4, [2])])
    assert [p.field for p in launch_problems(bad)] == ["batch_shares"]
    priced = [p.model_copy(update={"predicted": estimate(p, spec, cluster)}) for p in (bad, good)]
    assert any(n.startswith("runtime: batch_shares") for n in priced[0].predicted.notes)
    assert not any(n.startswith("runtime:") for n in priced[1].predicted.notes)
    assert launchable_first(priced, spec) == [priced[1], priced[0]]


# the README's model and batch for each example cluster (a new file needs a row here)
WORKLOADS = {
    "mixed-a100-v100-t4": ("gpt3-13b", 64),
    "h100-a100-1024": ("gpt3-175b", 1024),
    "a100-8x8-ib200": ("gpt3-13b", 256),
    "custom-links": ("gpt3-13b", 64),
    "philly-mixed-1280": ("gpt3-13b", 1280),
}


def test_every_example_cluster_has_a_workload():
    assert {f.stem for f in EXAMPLES.glob("*.toml")} == set(WORKLOADS)


@pytest.mark.parametrize("cluster", sorted(WORKLOADS))
def test_every_plan_ranked_for_an_example_cluster_is_launchable(cluster):
    model, batch = WORKLOADS[cluster]
    spec = get_model(model)
    found = search(
        spec,
        parse_cluster_toml((EXAMPLES / f"{cluster}.toml").read_text()),
        None,
        global_batch=batch,
        time_budget_s=2.0,
    )
    assert found.feasible and found.plans
    ok = [not launch_problems(p, p.num_devices, spec) for p in found.plans]
    assert ok == sorted(ok, reverse=True), "a refused plan is never ranked above a launchable one"
    for p, good in zip(found.plans, ok, strict=True):
        assert good or any(n.startswith("runtime: ") for n in p.predicted.notes), "a refused plan says why"
    # h100-a100-1024's best plans mix tp 4 and 8 across stages: launchable since worker/stages.py
    assert all(ok), [n for p in found.plans for n in p.predicted.notes if n.startswith("runtime: ")]
