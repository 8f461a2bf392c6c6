"""Sequence parallelism, every-k-th recompute and fp8 in the search: still exactly the oracle's best.

The oracle enumerates every stack option on its own (sequence parallelism off and on, k = 1 and 2,
fp8 off and on); the search takes sequence parallelism on wherever tp > 1 by dominance and runs one
seeded exact pass per (k, fp8). Equal best costs prove the dominance claim and the seeded passes.
"""

import os
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from planner.search import SearchSpace, search
from planner.search.classes import device_classes
from planner.search.oracle import oracle_search
from planner.search.search import stack_variants
from planner.specs.cluster import parse_cluster
from planner.specs.model import ModelSpec
from tests.planner.test_search_oracle import SPACE, cheapest, instances

STACKS = replace(SPACE, sequence_parallel=True, recompute_every=(1, 2), fp8=True)


@settings(
    max_examples=int(os.environ.get("ORACLE_EXAMPLES", "6")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # the same examples every CI run (a found counterexample becomes a pinned test); ORACLE_RANDOM=1
    # draws new ones (ORACLE_EXAMPLES=200 ORACLE_RANDOM=1 pytest … hunts for counterexamples)
    derandomize=not os.environ.get("ORACLE_RANDOM"),
)
@given(instances())
def test_search_with_stack_options_costs_exactly_what_the_oracle_finds(inst):
    cluster, model, gb = inst
    oracle = oracle_search(model, cluster, global_batch=gb, space=STACKS)
    fast = search(model, cluster, global_batch=gb, space=STACKS, baselines=False, top_k=3)
    if oracle is None:
        assert not fast.feasible
        return
    assert cheapest(fast) == pytest.approx(oracle.predicted.step_time_s, rel=1e-9)


def _one_node(device: str, n: int):
    node = {"name": "a", "device": device, "num_devices": n, "intra_link": "nvlink4", "inter_link": "ib-ndr"}
    return parse_cluster({"name": "c", "nodes": [node]})


def test_every_kth_recompute_wins_where_full_recompute_was_needed_only_for_memory():
    # 5 GiB per device: the plain plan (5.3 GiB peak) does not fit, full recompute (3.4 GiB) does, and
    # recomputing every 2nd block (4.5 GiB) fits too and pays half the recompute
    cluster = parse_cluster(
        {
            "name": "c",
            "nodes": [
                {
                    "name": "a",
                    "device": "A100-SXM4-40GB",
                    "num_devices": 1,
                    "intra_link": "nvlink3",
                    "inter_link": "ib-hdr",
                    "device_memory_bytes": 5 * 2**30,
                }
            ],
        }
    )
    model = ModelSpec(name="m", num_layers=8, hidden=1024, num_heads=16, vocab_size=512, seq_len=8192)
    space = SearchSpace(
        micro_batch_sizes=(1,), schedules=("1f1b",), shardings=("none",), tps=(1,), recompute_every=(1,)
    )
    plain = search(model, cluster, global_batch=4, space=space, baselines=False)
    assert plain.best.stages[0].recompute == "full" and plain.best.stages[0].recompute_every == 1
    mixed = search(model, cluster, global_batch=4, space=replace(space, recompute_every=(1, 2)), baselines=False)
    best = mixed.best  # the cheapest plan, and launchable (worker.parallel.apply_recompute runs it)
    assert best.stages[0].recompute_every == 2
    assert best.predicted.step_time_s < plain.best.predicted.step_time_s
    oracle = oracle_search(model, cluster, global_batch=4, space=replace(space, recompute_every=(1, 2)))
    assert best.predicted.step_time_s == pytest.approx(oracle.predicted.step_time_s, rel=1e-9)


def test_sequence_parallel_is_searched_only_with_tp_and_fp8_only_on_fp8_devices():
    model = ModelSpec(name="m", num_layers=4, hidden=1024, num_heads=16, vocab_size=512, seq_len=1024)
    space = SearchSpace(
        micro_batch_sizes=(1,), schedules=("1f1b",), shardings=("none",), tps=(1, 2), sequence_parallel=True, fp8=True
    )
    h100 = _one_node("H100-SXM5-80GB", 2)
    res = search(model, h100, global_batch=2, space=space, baselines=False, top_k=8)
    assert all(s.sequence_parallel == (s.tp > 1) for p in res.plans for s in p.stages)
    assert any(p.fp8 for p in res.plans)
    assert len(stack_variants(space, device_classes(h100))) == 4  # k = 1, 2 × fp8 off, on
    a100 = _one_node("A100-SXM4-80GB", 2)
    assert len(stack_variants(space, device_classes(a100))) == 2  # no fp8 peak: not searched
    res = search(model, a100, global_batch=2, space=space, baselines=False, top_k=8)
    assert not any(p.fp8 for p in res.plans)


def test_the_runtime_launches_sequence_parallel_and_every_kth_recompute_but_not_uneven_slices():
    from planner.runtime import launch_problems
    from planner.specs.plan import Plan, StagePlan

    def one(seq, **kw):
        stage = StagePlan(layer_start=0, layer_end=4, device_ids=(0, 1), tp=2, **kw)
        return Plan(
            model="tiny", cluster="c", global_batch_size=2, seq_len=seq, micro_batch_size=2,
            stages=(stage,), batch_shares=(2,),
        )  # fmt: skip

    assert not launch_problems(one(64, sequence_parallel=True, recompute="full", recompute_every=2))
    assert [q.field for q in launch_problems(one(63, sequence_parallel=True))] == ["stages[0].sequence_parallel"]


def test_cpu_ranks_are_searched_without_sequence_parallelism():
    from planner.specs.cluster import parse_cluster as pc

    node = {"name": "c", "device": "cpu", "num_devices": 2, "intra_link": "pcie3", "inter_link": "eth-10g"}
    node.update(device_memory_bytes=8 * 2**30, device_peak_flop_per_s=1e11)
    assert not stack_variants(SearchSpace(), device_classes(pc({"name": "c", "nodes": [node]})))[0].sequence_parallel


@pytest.mark.parametrize("stack", [dict(fp8=True), dict(sequence_parallel=True), dict(fp8=True, recompute_every=2)])
def test_shape_bound_floor_stays_below_every_stage_slope_under_the_stack(stack):
    """Bounds.a_floor bounds a block from its profile rows; fp8 and sequence parallelism make GPU
    blocks faster than their rows, so the floor must carry the stack's delta or it would prune the
    optimum (it did: a floor from rows alone sits above an fp8 stage's slope)."""
    from planner.cost.completion import ProfileNeed, complete_profiles
    from planner.cost.memory import Stack
    from planner.search.arrays import Pricer
    from planner.search.bounds import Bounds

    model = ModelSpec(name="m", num_layers=4, hidden=4096, num_heads=32, vocab_size=512, seq_len=2048)
    cluster = _one_node("H100-SXM5-80GB", 2)
    classes = device_classes(cluster)
    needs = {ProfileNeed(1, 2048, t, r, "bf16") for t in (1, 2) for r in (False, True)}
    table = complete_profiles(model, cluster, None, needs)
    pr = Pricer(model, classes, table, "bf16", 2048, stack=Stack(**stack))
    bounds = Bounds(pr, table, SearchSpace(), seq=2048, dtype="bf16", calibration=None, global_batch=2)
    for tp in (1, 2):
        link = pr.dp_link(0, tp, tp)
        slopes = [pr.stage(0, tp, 1, r, False, False, 1, "none", 1, link).time_s_per_block for r in (False, True)]
        assert bounds.a_floor(0, tp, 1) <= min(slopes) * (1 + 1e-12)


def test_dp_over_two_one_gpu_nodes_costs_what_the_oracle_finds():
    """Found by the property above: two node groups alike but for their names are one device class to
    the search and were two unlike groups to estimate's ring (one NIC share, no NCCL tree): the search
    kept dp1 (0.1507 ms) where the oracle's dp2 across the two nodes cost 0.1439 ms."""
    nv = {"kind": "nvlink2", "bandwidth_bytes_per_s": 150e9, "latency_s": 5e-06}
    ib = {"kind": "ib-hdr", "bandwidth_bytes_per_s": 25e9, "latency_s": 1e-05}
    node = {"device": "V100-SXM2-16GB", "num_devices": 1, "intra_link": nv, "inter_link": ib}
    cluster = parse_cluster({"name": "rand", "nodes": [dict(node, name="g0"), dict(node, name="g1")]})
    model = ModelSpec(name="rand", family="gpt", num_layers=2, hidden=64, num_heads=4, vocab_size=512, seq_len=128)
    oracle = oracle_search(model, cluster, global_batch=2, space=STACKS)
    fast = search(model, cluster, global_batch=2, space=STACKS, baselines=False, top_k=3)
    assert cheapest(fast) == pytest.approx(oracle.predicted.step_time_s, rel=1e-9)
