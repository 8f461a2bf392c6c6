"""The default policy `srtf` under a burst: nothing feasible waits beside idle GPUs, nothing starves.
And the two published baselines it is measured against (crius, sia) behave as their papers say."""

from __future__ import annotations

import pytest

import planner.scheduler.simulate as sim_mod
import planner.scheduler.srtf as srtf_mod
from planner.scheduler import DEFAULT_POLICY, Allocation, ClusterState, Job, Policy, RunningJob, TableSpeed, decide
from planner.scheduler.simulate import simulate

# model "m": 1–8 a100 (sub-linear), 1–2 v100 (3× slower); "s": one a100 only
ROWS = [
    ("m", "a100", 1, 1, 1, 10.0),
    ("m", "a100", 2, 1, 2, 5.5),
    ("m", "a100", 4, 1, 4, 3.0),
    ("m", "a100", 8, 2, 4, 1.7),
    ("m", "v100", 1, 1, 1, 30.0),
    ("m", "v100", 2, 1, 2, 16.0),
    ("s", "a100", 1, 1, 1, 1.0),
]


def burst(n: int = 40) -> list[Job]:
    """n jobs in 20 minutes, mixed lengths (30 min to 2 days on one a100)."""
    return [Job(f"j{i:02d}", "m", 64, [180, 600, 2400, 17_000][i % 4], 60.0 * (i // 2)) for i in range(n)]


def test_srtf_is_the_default_policy() -> None:
    assert DEFAULT_POLICY == "srtf" and Policy().name == "srtf"


def test_under_a_burst_no_feasible_job_waits_while_gpus_it_could_use_sit_idle(monkeypatch) -> None:
    """Every round of a replayed burst: after the round's actions, no waiting job has an allocation
    that fits the devices left free (srtf starts small rather than queue, shrinks longer jobs for it)."""
    cl = ClusterState(["a100", "a100", "a100", "v100"], [4, 4, 4, 4])
    speed = TableSpeed(ROWS)
    rounds = {"checked": 0, "waiting": 0}

    def checked(cluster, queue, running, policy, speed_, now_s=0.0):
        d = decide(cluster, queue, running, policy, speed_, now_s)
        after = cluster.copy()
        for a in d.actions:
            if a.kind != "start":
                after.release(next(r.placement for r in running if r.job.job_id == a.job_id))
        for a in d.actions:
            after.take(a.placement)
        for jid in d.waiting:
            job = next(j for j in queue if j.job_id == jid)
            idle = [p.alloc for p in speed_.options(job, after) if after.can_place(p.alloc)]
            assert not idle, f"{jid} waits at {now_s:.0f} s while {idle[0]} is free"
        rounds["checked"] += 1
        rounds["waiting"] += len(d.waiting)
        return d

    monkeypatch.setattr(sim_mod, "decide", checked)
    jobs = burst()
    r = simulate(jobs, cl, Policy("srtf"), speed)
    assert r.finished == len(jobs) and rounds["checked"] > 10
    assert rounds["waiting"] > 0  # 40 jobs on 16 GPUs: some do wait, for GPUs that are all busy
    assert r.resizes > 0  # it grows and shrinks jobs, not only starts them


def test_a_long_job_does_not_starve_behind_a_stream_of_short_ones(monkeypatch) -> None:
    """One GPU; a 4 h job and a 1 h job every hour for 60 h. Shortest-first alone would keep the long
    job waiting until the stream ends; ageing (priority doubles every AGE_S of waiting) bounds its
    wait to when 4 h / (1 + wait / AGE_S) < 1 h: 3 × AGE_S = 12 h."""
    cl = ClusterState(["a100"], [1])
    speed = TableSpeed(ROWS)
    jobs = [Job("long", "s", 8, 4 * 3600, 0.0)] + [Job(f"s{i:02d}", "s", 8, 3600, 3600.0 * i) for i in range(60)]
    r = simulate(jobs, cl, Policy("srtf", relaunch_s=0.0), speed)
    long = next(o for o in r.jobs if o.job_id == "long")
    assert r.finished == len(jobs)
    assert long.queue_s is not None and long.queue_s <= 3 * srtf_mod.AGE_S + 2 * 3600
    monkeypatch.setattr(srtf_mod, "AGE_S", float("inf"))  # without ageing it starves until the stream ends
    r = simulate(jobs, cl, Policy("srtf", relaunch_s=0.0), speed)
    starved = next(o for o in r.jobs if o.job_id == "long")
    assert starved.queue_s is not None and starved.queue_s > 50 * 3600


def test_spare_gpus_go_to_the_job_nearest_its_end() -> None:
    """Two running jobs on one a100 each, 3 a100 spare, nobody waiting: the short one grows first
    (a GPU it holds comes back soon), the long one gets what is left after it."""
    cl = ClusterState(["a100", "a100"], [4, 4])
    speed = TableSpeed(ROWS)
    running = []
    for jid, iters in (("short", 2_000), ("long", 200_000)):
        place = cl.place(Allocation("a100", 1, 1))
        assert place is not None
        cl.take(place)
        running.append(RunningJob(Job(jid, "m", 64, iters, 0.0), place, 10.0, base=place.alloc))
    d = decide(cl, [], running, Policy("srtf"), speed, 0.0)
    got = {a.job_id: a.placement.alloc.count for a in d.actions}
    assert got.get("short", 1) >= 4 and got.get("short", 1) >= got.get("long", 1)


def test_growth_leaves_the_reserve_for_arrivals_free_however_many_jobs_grow() -> None:
    """Two jobs arrive together on 4 a100: both start on one, and growth leaves the next round's
    expected arrivals (the last hour's, rounded up: one a100) free — a move priced before another
    job's took free GPUs is re-priced, not applied into the reserve."""
    cl = ClusterState(["a100"], [4])
    jobs = [Job("short", "m", 64, 40, 0.0), Job("long", "m", 64, 300, 1.0)]
    d = decide(cl, jobs, [], Policy("srtf", relaunch_s=5.0, min_gain_s=0.5), TableSpeed(ROWS), 2.0)
    got = {a.job_id: (a.placement.alloc.count, a.base.count) for a in d.actions}
    assert got == {"short": (2, 1), "long": (1, 1)}


def test_crius_starts_every_job_on_its_smallest_allocation_and_grows_it() -> None:
    cl = ClusterState(["a100", "a100", "v100"], [4, 4, 4])
    speed = TableSpeed(ROWS)
    d = decide(cl, [Job("a", "m", 64, 10_000, 0.0)], [], Policy("crius"), speed)
    (a,) = d.actions
    assert a.kind == "start" and a.base == Allocation("a100", 1, 1)  # admitted on one GPU
    assert a.placement.alloc.count > 1  # grown in the same round: nobody else wants the GPUs


def test_crius_shrinks_a_running_job_rather_than_queue_a_new_one() -> None:
    cl = ClusterState(["a100"], [4])
    speed = TableSpeed(ROWS)
    place = cl.place(Allocation("a100", 4, 1))
    assert place is not None
    cl.take(place)
    run = RunningJob(Job("a", "m", 64, 100_000, 0.0), place, 3.0, base=Allocation("a100", 1, 1))
    d = decide(cl, [Job("b", "m", 64, 100, 0.0)], [run], Policy("crius"), speed)
    assert {x.job_id: x.kind for x in d.actions} == {"a": "shrink", "b": "start"} and d.waiting == ()


@pytest.mark.parametrize("name", ["crius", "sia", "srtf"])
def test_every_policy_finishes_a_burst_and_holds_no_device_twice(name: str) -> None:
    cl = ClusterState(["a100", "a100", "v100"], [4, 4, 4])
    r = simulate(burst(16), cl, Policy(name), TableSpeed(ROWS))
    assert r.finished == 16 and r.rejected == 0
    assert all(max(b) <= r.kind_totals[k] for k, b in r.busy.items())
