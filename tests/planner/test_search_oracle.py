"""The fast search equals the exhaustive oracle on random tiny instances (hypothesis)."""

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cost import estimate
from planner.runtime import launch_problems
from planner.search import SearchSpace, search
from planner.search.oracle import compositions, oracle_search
from planner.specs.cluster import parse_cluster
from planner.specs.model import ModelSpec
from planner.specs.plan import parse_plan_json

SPACE = SearchSpace(micro_batch_sizes=(1, 2), schedules=("1f1b", "gpipe"), shardings=("none", "zero2"), tps=(1, 2))
KINDS = ["T4", "V100-SXM2-16GB", "A100-SXM4-40GB", "L4"]
LINKS = {"T4": "pcie3", "V100-SXM2-16GB": "nvlink2", "A100-SXM4-40GB": "nvlink3", "L4": "pcie4"}


@st.composite
def instances(draw):
    groups = draw(st.integers(1, 2))
    nodes, total = [], 0
    for i in range(groups):
        kind = draw(st.sampled_from(KINDS))
        n = draw(st.sampled_from([1, 2]))
        count = draw(st.integers(1, 2 if n == 1 else 1))
        total += n * count
        nodes.append(
            {
                "name": f"g{i}",
                "device": kind,
                "num_devices": n,
                "count": count,
                "intra_link": LINKS[kind],
                "inter_link": draw(st.sampled_from(["eth-100g", "ib-hdr"])),
            }
        )
    layers = draw(st.integers(2, 4))
    hidden = draw(st.sampled_from([64, 256, 1024]))
    model = ModelSpec(name="rand", num_layers=layers, hidden=hidden, num_heads=4, vocab_size=512, seq_len=128)
    gb = draw(st.sampled_from([2, 4]))
    return parse_cluster({"name": "rand", "nodes": nodes}), model, gb


@st.composite
def mixes(draw):
    """Three or four distinct GPU kinds, one device each (up to four kinds is what real clusters mix:
    issue #32), a model of 2 or 3 layers (2 with four kinds: the oracle's enumeration grows fast)."""
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=3, max_size=4, unique=True))
    nodes = [
        {
            "name": f"g{i}",
            "device": kind,
            "num_devices": 1,
            "count": 1,
            "intra_link": LINKS[kind],
            "inter_link": draw(st.sampled_from(["eth-100g", "ib-hdr"])),
        }
        for i, kind in enumerate(kinds)
    ]
    layers = draw(st.integers(2, 3 if len(kinds) == 3 else 2))
    hidden = draw(st.sampled_from([64, 1024]))
    model = ModelSpec(name="rand", num_layers=layers, hidden=hidden, num_heads=4, vocab_size=512, seq_len=128)
    return parse_cluster({"name": "mix", "nodes": nodes}), model, 2


def cheapest(result) -> float:
    """The search's cheapest plan (its first plan is the cheapest *launchable* one, planner/runtime.py;
    the oracle ignores the runtime contract, so the two agree on the cheapest of all)."""
    return min(p.predicted.step_time_s for p in result.plans)


@settings(
    max_examples=int(os.environ.get("ORACLE_EXAMPLES", "12")),
    deadline=None,
    # the same examples every CI run (a found counterexample becomes a pinned test); ORACLE_RANDOM=1
    # draws new ones (ORACLE_EXAMPLES=200 ORACLE_RANDOM=1 pytest … hunts for counterexamples)
    derandomize=not os.environ.get("ORACLE_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow],
)
@given(instances())
def test_fast_search_best_costs_exactly_what_the_oracle_finds(inst):
    cluster, model, gb = inst
    oracle = oracle_search(model, cluster, global_batch=gb, space=SPACE)
    fast = search(model, cluster, global_batch=gb, space=SPACE, baselines=False, top_k=3)
    if oracle is None:
        assert not fast.feasible
        return
    assert fast.feasible
    assert cheapest(fast) == pytest.approx(oracle.predicted.step_time_s, rel=1e-9)


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_fast_search_equals_the_oracle_on_fixed_examples(inst):
    """The same property on examples fixed for every run (derandomize: drawn from a seed that does
    not change), beside the random ones above: a failure found once is found again, on any machine."""
    test_fast_search_best_costs_exactly_what_the_oracle_finds.hypothesis.inner_test(inst)


# pipelines through all four classes too (the default space stops at three)
MIX_SPACE = SearchSpace(
    micro_batch_sizes=(1, 2), schedules=("1f1b",), shardings=("none", "zero2"), tps=(1, 2), max_classes=4
)


@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(mixes())
def test_fast_search_equals_the_oracle_on_three_and_four_kinds(inst):
    """Every pass (stack variant) on one frontier, kind orderings pruned by bounds: still the oracle's
    best on mixes of three and four kinds."""
    cluster, model, gb = inst
    oracle = oracle_search(model, cluster, global_batch=gb, space=MIX_SPACE)
    fast = search(model, cluster, global_batch=gb, space=MIX_SPACE, baselines=False, top_k=3)
    if oracle is None:
        assert not fast.feasible
        return
    assert fast.feasible
    assert cheapest(fast) == pytest.approx(oracle.predicted.step_time_s, rel=1e-9)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_every_returned_plan_fits_validates_and_round_trips(inst):
    cluster, model, gb = inst
    res = search(model, cluster, global_batch=gb, space=SPACE, baselines=False, top_k=4)
    if not res.feasible:
        assert res.reasons
        return
    ids = {d.id for d in cluster.devices()}
    for plan in res.plans:
        again = parse_plan_json(plan.to_json())
        assert again == plan
        assert all(d in ids for s in plan.stages for d in s.device_ids)
        cost = plan.predicted
        assert cost.feasible
        assert all(p <= c for p, c in zip(cost.peak_memory_bytes, cost.memory_capacity_bytes, strict=True))
        assert estimate(plan, model, cluster).step_time_s == pytest.approx(cost.step_time_s, rel=1e-12)
    # launchable plans first (planner/runtime.py), each group cheapest first
    key = [(bool(launch_problems(p)), p.predicted.step_time_s) for p in res.plans]
    assert key == sorted(key)


def test_compositions_enumerates_every_ordered_split():
    assert sorted(compositions(4, 2)) == [(1, 3), (2, 2), (3, 1)]
    assert len(list(compositions(6, 3))) == 10


@pytest.mark.parametrize("hidden", [256, 2048])
def test_interleaved_schedule_search_matches_the_oracle(hidden):
    cluster = parse_cluster(
        {
            "name": "two",
            "nodes": [
                {
                    "name": "a",
                    "device": "A100-SXM4-40GB",
                    "num_devices": 1,
                    "count": 2,
                    "intra_link": "nvlink3",
                    "inter_link": "ib-hdr",
                }
            ],
        }
    )
    model = ModelSpec(name="m", num_layers=6, hidden=hidden, num_heads=4, vocab_size=512, seq_len=128)
    space = SearchSpace(
        micro_batch_sizes=(1,), schedules=("interleaved-1f1b",), shardings=("none",), tps=(1,), families=("pipeline",)
    )
    oracle = oracle_search(model, cluster, global_batch=4, space=space)
    fast = search(model, cluster, global_batch=4, space=space, baselines=False)
    assert cheapest(fast) == pytest.approx(oracle.predicted.step_time_s, rel=1e-9)
    assert fast.best.schedule == "interleaved-1f1b" and fast.best.virtual_stages == 2


@st.composite
def calibrations(draw):
    """Measured corrections as discovery derives them (planner.measure.calibrate), any size within reason."""
    from planner.measure.calibrate import Calibration, CollectiveFit

    n = 4
    fits = tuple(
        (op, CollectiveFit(draw(st.floats(1e-6, 5e-3)), draw(st.floats(1e-11, 5e-9)), n))
        for op in ("all_gather", "all_reduce", "reduce_scatter")
    )
    return Calibration(
        num_ranks=n,
        compute_slowdown=draw(st.floats(1.0, 1.5)),
        collectives=fits,
        adam_s_per_param=draw(st.floats(1e-9, 5e-8)),
        adam_dtensor_s_per_param=draw(st.floats(1e-9, 1e-7)),
        grad_sync_overlap=draw(st.sampled_from([0.0, 0.5])),
        pipeline_overhead_s=draw(st.floats(0.0, 5e-3)),
        source="hypothesis",
    )


@settings(
    max_examples=int(os.environ.get("ORACLE_EXAMPLES", "8")),
    deadline=None,
    # the same examples every CI run (a found counterexample becomes a pinned test); ORACLE_RANDOM=1
    # draws new ones (ORACLE_EXAMPLES=200 ORACLE_RANDOM=1 pytest … hunts for counterexamples)
    derandomize=not os.environ.get("ORACLE_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow],
)
@given(instances(), calibrations())
def test_calibrated_search_finds_what_the_calibrated_oracle_finds(inst, calib):
    """With measured corrections the search's pruning bounds and inner costs stay exact: its best plan
    costs what exhaustive search under the same calibration finds, and every plan it returns is priced
    by estimate(..., calibration)."""
    cluster, model, gb = inst
    oracle = oracle_search(model, cluster, global_batch=gb, space=SPACE, calibration=calib)
    fast = search(model, cluster, global_batch=gb, space=SPACE, baselines=False, top_k=3, calibration=calib)
    if oracle is None:
        assert not fast.feasible
        return
    assert cheapest(fast) == pytest.approx(oracle.predicted.step_time_s, rel=1e-9)
    for p in fast.plans:
        again = estimate(p, model, cluster, calibration=calib).step_time_s
        assert p.predicted.step_time_s == pytest.approx(again, rel=1e-9)
