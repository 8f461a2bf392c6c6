"""The scheduler core: allocation and plan chosen together, baselines, priced resizes, rejections."""

from __future__ import annotations

import pytest

from planner.errors import MeshplanError
from planner.scheduler import (
    Allocation,
    ClusterState,
    Job,
    PlannerSpeed,
    Policy,
    RunningJob,
    TableSpeed,
    decide,
    kind_alias,
)
from planner.specs.cluster import parse_cluster_toml

# A measured-style table: model "m" scales sub-linearly on a100 and is 3× slower on v100.
ROWS = [
    ("m", "a100", 1, 1, 1, 10.0),
    ("m", "a100", 2, 1, 2, 5.5),
    ("m", "a100", 4, 1, 4, 3.0),
    ("m", "a100", 8, 2, 4, 1.7),
    ("m", "v100", 1, 1, 1, 30.0),
    ("m", "v100", 2, 1, 2, 16.0),
    ("m", "v100", 4, 1, 4, None),  # out of memory in the table: never offered
    ("big", "a100", 4, 1, 4, 50.0),
]


def small_cluster() -> ClusterState:
    return ClusterState(["a100", "a100", "v100"], [4, 4, 4])


def job(jid: str, model: str = "m", iters: int = 1000, req: Allocation | None = None, **kw) -> Job:
    return Job(jid, model, 64, iters, 0.0, requested=req or Allocation("v100", 2, 1), **kw)


def test_kind_alias_maps_catalog_names_to_table_kinds() -> None:
    assert kind_alias("A100-SXM4-40GB") == "a100"
    assert kind_alias("A40") == "a40"


def test_co_designed_grows_into_idle_gpus_and_fcfs_keeps_the_request() -> None:
    speed = TableSpeed(ROWS)
    q = [job("a")]
    fcfs = decide(small_cluster(), q, [], Policy("fcfs"), speed)
    assert [(a.kind, a.placement.alloc) for a in fcfs.actions] == [("start", Allocation("v100", 2, 1))]
    gavel = decide(small_cluster(), q, [], Policy("gavel"), speed)
    assert gavel.actions[0].placement.alloc == Allocation("a100", 2, 1)  # same count, the faster kind
    co = decide(small_cluster(), q, [], Policy("jct"), speed)
    (a,) = co.actions
    assert a.placement.alloc == Allocation("a100", 8, 2)  # nobody waits: the fastest allocation
    # admitted with the fastest allocation within 25 % of the fewest GPU-seconds (a100×1: 10 s·GPU/iter)
    assert a.base == Allocation("a100", 4, 1)
    assert sum(n for _, n in a.placement.nodes) == 8


def test_second_arrival_shrinks_a_grown_job_when_that_lets_it_start() -> None:
    speed = TableSpeed(ROWS)
    cl = small_cluster()
    first = decide(cl, [job("a")], [], Policy("jct"), speed).actions[0]
    cl.take(first.placement)
    running = [RunningJob(job("a"), first.placement, first.iter_time_s, done_iterations=10, base=first.base)]
    # only a100 can run "big" (on a whole node), and all 8 a100 are held by the grown job
    d = decide(cl, [job("b", model="big", iters=10)], running, Policy("jct"), speed)
    kinds = {a.job_id: a.kind for a in d.actions}
    assert kinds == {"a": "shrink", "b": "start"}
    assert {a.job_id: a.placement.alloc for a in d.actions} == {
        "a": Allocation("a100", 4, 1),
        "b": Allocation("a100", 4, 1),
    }
    assert cl.node_busy == [4, 4, 0]  # the inputs are not mutated


def test_a_resize_happens_only_when_the_gain_beats_the_priced_switch() -> None:
    speed = TableSpeed(ROWS)
    cl = small_cluster()
    place = cl.place(Allocation("a100", 1, 1))
    assert place is not None
    cl.take(place)
    cheap = job("a", iters=100_000)
    d = decide(cl, [], [RunningJob(cheap, place, 10.0, base=place.alloc)], Policy("jct"), speed)
    assert [a.kind for a in d.actions] == ["grow"] and "switch priced" in d.actions[0].reason
    heavy = job("a", iters=100_000, state_bytes=1e16)  # a switch of months: never worth it
    d = decide(cl, [], [RunningJob(heavy, place, 10.0, base=place.alloc)], Policy("jct"), speed)
    assert d.actions == ()


def test_a_job_nothing_can_run_is_rejected_with_a_reason() -> None:
    speed = TableSpeed(ROWS)
    d = decide(
        small_cluster(), [job("x", model="nope"), job("y", kinds=("v100",), model="big")], [], Policy("jct"), speed
    )
    assert {r.job_id for r in d.rejections} == {"x", "y"}
    assert all("can run" in r.reason for r in d.rejections)
    d = decide(small_cluster(), [job("z", req=Allocation("v100", 4, 1))], [], Policy("fcfs"), speed)
    assert "requested allocation" in d.rejections[0].reason


def test_srpt_order_serves_the_short_job_first_under_contention() -> None:
    speed = TableSpeed(ROWS)
    cl = ClusterState(["a100"], [1])
    long, short = job("long", iters=10_000), job("short", iters=10)
    d = decide(cl, [long, short], [], Policy("jct"), speed)
    assert [a.job_id for a in d.actions] == ["short"] and d.waiting == ("long",)
    d = decide(cl, [long, short], [], Policy("fcfs"), speed)
    assert d.actions == () and len(d.rejections) == 2  # v100 requested, this cluster has none


def test_unknown_policy_is_a_meshplan_error() -> None:
    with pytest.raises(MeshplanError, match="policy"):
        Policy("fastest")


def test_planner_prices_allocations_and_caches_per_job_and_allocation() -> None:
    spec = parse_cluster_toml(
        """
name = "mixed"
[[nodes]]
name = "a100"
device = "A100-SXM4-40GB"
num_devices = 4
intra_link = "nvlink3"
inter_link = "ib-hdr"
[[nodes]]
name = "v100"
device = "V100-SXM2-32GB"
num_devices = 4
intra_link = "nvlink2"
inter_link = "ib-edr"
"""
    )
    speed = PlannerSpeed.from_cluster(spec, time_budget_s=1.0)
    cl = ClusterState(["a100", "v100"], [4, 4])
    q = [Job("a", "gpt3-1.3b", 64, 100, 0.0), Job("b", "gpt2-small", 32, 100, 0.0)]
    d = decide(cl, q, [], Policy("jct"), speed)
    assert {a.job_id for a in d.actions} == {"a", "b"} and not d.rejections
    assert all(a.plan.startswith("pp=") and a.iter_time_s > 0 for a in d.actions)
    assert d.speed_queries == 6 * 2  # 1, 2, 4 GPUs × 2 kinds × 2 jobs, each searched once
    again = decide(cl, q, [], Policy("jct"), speed)
    assert again.speed_queries == 0
    one = speed.price(q[0], Allocation("a100", 1, 1))
    four = speed.price(q[0], Allocation("a100", 4, 1))
    assert one is not None and four is not None and four.iter_time_s < one.iter_time_s
    plan = speed.best_plan(q[0], Allocation("a100", 4, 1))
    assert plan is not None and plan.num_devices == 4 and plan.predicted is not None
    assert plan.predicted.step_time_s == four.iter_time_s  # the price is that plan's prediction
    assert speed.best_plan(q[0], Allocation("a100", 4, 1)) is plan  # cached, not searched again


def test_table_prices_exactly_the_allocation_it_measured() -> None:
    speed = TableSpeed(ROWS)
    p = speed.price(job("a"), Allocation("a100", 4, 1))
    assert p is not None and p.iter_time_s == 3.0
    assert speed.price(job("a"), Allocation("v100", 4, 1)) is None  # out of memory in the table
    assert speed.iter_time_s(job("a"), Allocation("a100", 8, 2)) == 1.7


def test_a_long_job_is_shrunk_below_its_admitted_size_when_a_waiting_job_then_starts() -> None:
    """Pass 2 of _shrink_for: one node of 4 a100, job a admitted on all 4 (its base), b waits.

    a has 300,000 s left at 3.0 s/iter; on 2 a100 (5.5 s/iter) 550,000 s + a 60 s switch: Δ =
    250,060 s < the 300,000 s b would wait, so a gives up half and b starts on the other half."""
    speed, cl = TableSpeed(ROWS), ClusterState(["a100"], [4])
    place = cl.place(Allocation("a100", 4, 1))
    assert place is not None
    cl.take(place)
    a = RunningJob(job("a", iters=100_000), place, 3.0, base=place.alloc)
    d = decide(cl, [job("b", iters=10)], [a], Policy("jct"), speed)
    assert {x.job_id: (x.kind, x.placement.alloc) for x in d.actions} == {
        "a": ("shrink", Allocation("a100", 2, 1)),
        "b": ("start", Allocation("a100", 2, 1)),
    }
    assert "so that 1 waiting job(s) start" in next(x.reason for x in d.actions if x.job_id == "a")
    # the same job near its end: Δ = 550 + 60 − 300 = 310 s ≥ the 300 s b waits for it — b waits
    near_end = RunningJob(job("a", iters=100), place, 3.0, base=place.alloc)
    d = decide(cl, [job("b", iters=10)], [near_end], Policy("jct"), speed)
    assert d.actions == () and d.waiting == ("b",)
    # a waiting job that half the node cannot run ("big" needs 4 a100) shrinks nobody
    d = decide(cl, [job("b", model="big", iters=10)], [a], Policy("jct"), speed)
    assert d.actions == () and d.waiting == ("b",)
    # and the policy can keep admitted sizes as a floor
    d = decide(cl, [job("b", iters=10)], [a], Policy("jct", shrink_below_base=False), speed)
    assert d.actions == ()
