"""One scheduling round: which queued jobs start where, with which plan, and which running jobs resize.

`decide(cluster, queue, running, policy, speed, now_s)` is the one entry point of the simulator and
the real scheduler's rounds. The default policy, `srtf`, is planner/scheduler/srtf.py; `crius` and
`sia`, the published baselines, are planner/scheduler/baselines.py; the rest are here.

It prices every (job, allocation) through a
`SpeedSource` (the planner's search or a measured table, cached) and chooses allocation and plan
together. Co-designed policies (`jct`, `throughput`, `deadline`, `fairness`) differ in the order
they serve jobs; each job gets the fastest placeable allocation whose GPU-seconds
(`count × remaining iterations × iter_time_s`) are within `max_inefficiency` of the fewest its GPU
kind allows, and spare devices go to running jobs when the time saved beats the priced switch:

    gain_s = remaining_s(now) − (remaining_s(new) + switch_s),   switch_s = relaunch_s + 2 · state_bytes / checkpoint_bytes_per_s

(save then load of the resharded checkpoint). Running jobs give devices back when that lets a
waiting job start: a grown job shrinks to the allocation it was admitted with, and any job one step
below it when the shrink costs it less than the wait it saves (`_shrink_for`). Baselines in the
same code: `fcfs` runs the user's requested allocation in arrival order (first fit, never resized); `gavel`
keeps the requested GPU count (static parallelism) but picks the fastest GPU kind that fits now
(heterogeneity-aware, after Narayanan et al., OSDI'20, without its LP or time slicing).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import MeshplanError
from planner.scheduler.baselines import BASELINES, decide_crius, decide_sia
from planner.scheduler.speed import Price, SpeedSource
from planner.scheduler.srtf import decide_srtf
from planner.scheduler.types import (
    DEFAULT_POLICY,
    POLICIES,
    Action,
    Allocation,
    ClusterState,
    Decision,
    Job,
    Placement,
    Rejection,
    RunningJob,
)

CO_DESIGNED = ("jct", "throughput", "deadline", "fairness")


@dataclass(frozen=True)
class Policy:
    name: str = DEFAULT_POLICY
    relaunch_s: float = 60.0  # process start, rendezvous, data loader and first-step warm-up
    checkpoint_bytes_per_s: float = 2e9  # resharded save + load through shared storage
    min_gain_s: float = 600.0  # two 300 s rounds: smaller gains are noise against the switch risk
    max_inefficiency: float = 1.25  # accept up to 25 % more GPU-seconds to start or run faster
    max_resizes: int = 16  # bound on grow/shrink/move actions per round
    shrink_below_base: bool = True  # may shrink a job below the allocation it was admitted with

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise MeshplanError("policy", self.name, f"choose one of {', '.join(POLICIES)}")

    def switch_s(self, job: Job) -> float:
        return self.relaunch_s + 2.0 * job.state_bytes / self.checkpoint_bytes_per_s


def _gpu_s(p: Price, iters: float) -> float:
    return p.alloc.count * p.iter_time_s * iters


def _order(policy: str, queue: list[Job], opts: dict[str, list[Price]], now_s: float) -> list[Job]:
    def best_time(j: Job) -> float:
        return min(p.iter_time_s for p in opts[j.job_id]) * j.iterations

    def per_gpu_rate(j: Job) -> float:
        return max(j.global_batch / (p.iter_time_s * p.alloc.count) for p in opts[j.job_id])

    if policy in ("fcfs", "gavel", "fairness"):  # arrival order; fairness: queued jobs have attained nothing
        key = lambda j: (-j.priority, j.submit_s, j.job_id)  # noqa: E731
    elif policy == "jct":  # shortest remaining time first minimises the mean (SRPT)
        key = lambda j: (-j.priority, best_time(j), j.job_id)  # noqa: E731
    elif policy == "throughput":
        key = lambda j: (-j.priority, -per_gpu_rate(j), j.job_id)  # noqa: E731
    else:  # deadline: earliest deadline first, then shortest
        key = lambda j: (-j.priority, j.deadline_s if j.deadline_s is not None else float("inf"), best_time(j))  # noqa: E731
    return sorted(queue, key=key)


def _candidates(policy: Policy, job: Job, all_opts: list[Price]) -> tuple[list[Price], str]:
    if policy.name == "fcfs":
        if job.requested is None:
            return [], "fcfs needs the job's requested allocation"
        opts = [p for p in all_opts if p.alloc == job.requested]
        return opts, f"the requested allocation ({job.requested}) cannot run it"
    if policy.name == "gavel":
        if job.requested is None:
            return [], "gavel needs the job's requested GPU count"
        opts = [p for p in all_opts if p.alloc.count == job.requested.count]
        return opts, f"no GPU kind can run it on its requested {job.requested.count} GPUs"
    return all_opts, ""


def _choose(policy: Policy, job: Job, opts: list[Price], cl: ClusterState, now_s: float, iters: float) -> Price | None:
    placeable = [p for p in opts if cl.can_place(p.alloc)]
    if not placeable:
        return None
    if policy.name == "fcfs":
        return placeable[0]
    if policy.name == "gavel":
        return min(placeable, key=lambda p: (p.iter_time_s, p.alloc.num_nodes))
    # GPU-seconds are compared within a kind only: an idle V100 is not a spare A100, so a job takes
    # a slower kind that is free now rather than wait, but not 16 GPUs of a kind where 4 do as well.
    floor: dict[str, float] = {}
    for p in opts:
        floor[p.alloc.kind] = min(floor.get(p.alloc.kind, float("inf")), _gpu_s(p, iters))
    ok = [p for p in placeable if _gpu_s(p, iters) <= policy.max_inefficiency * floor[p.alloc.kind]]
    if not ok:
        return None  # waiting for an efficient allocation beats running on a wasteful one
    if policy.name == "deadline" and job.deadline_s is not None:
        meets = [p for p in ok if now_s + policy.relaunch_s + p.iter_time_s * iters <= job.deadline_s]
        if meets:
            return min(meets, key=lambda p: (_gpu_s(p, iters), p.iter_time_s))
    return min(ok, key=lambda p: (p.iter_time_s, _gpu_s(p, iters)))


def decide(
    cluster: ClusterState,
    queue: list[Job],
    running: list[RunningJob],
    policy: Policy,
    speed: SpeedSource,
    now_s: float = 0.0,
) -> Decision:
    """The round's actions (inputs are not mutated); jobs that nothing can ever run are rejected with why."""
    if policy.name == "srtf":
        q0 = speed.queries
        d = decide_srtf(cluster, queue, running, policy, speed, now_s)
        return Decision(d.policy, d.actions, d.rejections, d.waiting, speed.queries - q0)
    if policy.name in BASELINES:
        q0 = speed.queries
        fn = decide_crius if policy.name == "crius" else decide_sia
        d = fn(cluster, queue, running, policy, speed, now_s)
        return Decision(d.policy, d.actions, d.rejections, d.waiting, speed.queries - q0)
    q0 = speed.queries
    cl = cluster.copy()
    run_by_id = {r.job.job_id: r for r in running}
    opts: dict[str, list[Price]] = {}
    rejections: list[Rejection] = []
    for job in queue:
        every = speed.options(job, cl)
        cands, why = _candidates(policy, job, every)
        if not cands:
            kinds = ", ".join(job.kinds) if job.kinds else "any kind"
            rejections.append(
                Rejection(job.job_id, why or f"no allocation on this cluster ({kinds}) can run {job.model}")
            )
            continue
        opts[job.job_id] = cands
    live = [j for j in queue if j.job_id in opts]

    starts: dict[str, tuple[Price, Placement, Allocation]] = {}
    waiting: list[Job] = []
    for job in _order(policy.name, live, opts, now_s):
        if cl.free_total() == 0:
            waiting.append(job)
            continue
        p = _choose(policy, job, opts[job.job_id], cl, now_s, job.iterations)
        if p is None:
            waiting.append(job)
            continue
        place = cl.place(p.alloc)
        assert place is not None
        cl.take(place)
        starts[job.job_id] = (p, place, p.alloc)

    resizes: dict[str, tuple[str, Price, Placement, str]] = {}
    if policy.name in CO_DESIGNED:
        if waiting:
            _shrink_for(policy, waiting, running, opts, cl, starts, resizes, speed, now_s)
        else:
            _grow(policy, queue, running, cl, starts, resizes, speed)

    actions = [
        Action(
            jid, "start", place, p.iter_time_s, p.plan, f"{policy.name}: {p.alloc}, {p.iter_time_s:.3g} s/iter", base
        )
        for jid, (p, place, base) in starts.items()
    ]
    actions += [
        Action(jid, kind, place, p.iter_time_s, p.plan, why, run_by_id[jid].base)
        for jid, (kind, p, place, why) in resizes.items()
    ]
    waiting_ids = tuple(j.job_id for j in waiting if j.job_id not in starts)
    return Decision(policy.name, tuple(actions), tuple(rejections), waiting_ids, speed.queries - q0)


def _kind_of(old: Allocation, new: Allocation) -> str:
    if new.count > old.count:
        return "grow"
    if new.count < old.count:
        return "shrink"
    return "move"


def _grow(
    policy: Policy,
    queue: list[Job],
    running: list[RunningJob],
    cl: ClusterState,
    starts: dict[str, tuple[Price, Placement, Allocation]],
    resizes: dict[str, tuple[str, Price, Placement, str]],
    speed: SpeedSource,
) -> None:
    """Spare devices, nobody waiting: upgrade a just-started job for free, a running one if the gain beats the switch."""
    by_id = {j.job_id: j for j in queue}
    for jid in list(starts):  # not launched yet: a bigger allocation costs no switch
        if cl.free_total() == 0:
            return
        p, place, base = starts[jid]
        job = by_id[jid]
        cl.release(place)
        best = min((o for o in speed.options(job, cl) if cl.can_place(o.alloc)), key=lambda o: o.iter_time_s)
        new_place = cl.place(best.alloc)
        assert new_place is not None
        cl.take(new_place)
        starts[jid] = (best, new_place, base)
    moves = 0
    for r in sorted(running, key=lambda r: -r.remaining_s()):
        if moves >= policy.max_resizes or cl.free_total() == 0:
            return
        cl.release(r.placement)
        now_left = r.remaining_s()
        best, best_left = None, now_left - policy.min_gain_s
        for o in speed.options(r.job, cl):
            left = r.remaining_iterations * o.iter_time_s + policy.switch_s(r.job)
            if left < best_left and o.alloc != r.placement.alloc and cl.can_place(o.alloc):
                best, best_left = o, left
        if best is None:
            cl.take(r.placement)
            continue
        new_place = cl.place(best.alloc)
        assert new_place is not None
        cl.take(new_place)
        why = f"{policy.name}: {r.placement.alloc} → {best.alloc} saves {now_left - best_left:.0f} s (switch priced {policy.switch_s(r.job):.0f} s)"
        resizes[r.job.job_id] = (_kind_of(r.placement.alloc, best.alloc), best, new_place, why)
        moves += 1


def _shrink_for(
    policy: Policy,
    waiting: list[Job],
    running: list[RunningJob],
    opts: dict[str, list[Price]],
    cl: ClusterState,
    starts: dict[str, tuple[Price, Placement, Allocation]],
    resizes: dict[str, tuple[str, Price, Placement, str]],
    speed: SpeedSource,
    now_s: float,
) -> None:
    """Jobs wait while others hold the devices: shrink running jobs if a waiting job then starts.

    A shrink to allocation `b` costs the shrunk job `Δ = remaining(b) + switch − remaining(now)`;
    the waiting job it admits would otherwise wait about `remaining(now)` of that job, so the sum
    of completion times falls when `Δ < remaining(now)` (priced as if the shrink were for good: the
    job grows back once devices are spare, so the true Δ is smaller). Two passes:
    1. grown jobs go back to the allocation they were admitted with, shortest remaining first
       (all that pass, then the waiting jobs are admitted on what they freed);
    2. with `policy.shrink_below_base`, if jobs still wait, a running job gives up one step of its
       allocation (the largest smaller count of its kind it can run on), longest remaining first
       (the longer it runs, the longer a waiting job would wait for it), one job at a time, kept
       only if a waiting job then starts.
    """
    trial = cl.copy()
    grown = [r for r in running if r.base is not None and r.base.count < r.placement.alloc.count]
    shrunk: list[tuple[RunningJob, Price, Placement]] = []
    for r in sorted(grown, key=lambda r: r.remaining_s()):
        if len(shrunk) >= policy.max_resizes:
            break
        base = next((o for o in speed.options(r.job, trial) if o.alloc == r.base), None)
        step = _try_shrink(policy, r, base, trial)
        if step is not None:
            shrunk.append(step)
    admitted = _admit(policy, waiting, opts, trial, now_s) if shrunk else {}
    if not admitted:
        trial, shrunk = cl.copy(), []
    if policy.shrink_below_base:
        done = {r.job.job_id for r, _, _ in shrunk}
        for r in sorted(running, key=lambda r: -r.remaining_s()):
            left = [j for j in waiting if j.job_id not in admitted]
            if not left or len(shrunk) >= policy.max_resizes:
                break
            if r.job.job_id in done:
                continue
            smaller = [o for o in speed.options(r.job, trial) if _one_step_down(o.alloc, r.placement.alloc)]
            target = max(smaller, key=lambda o: (o.alloc.count, -o.iter_time_s), default=None)
            before = trial.copy()
            step = _try_shrink(policy, r, target, trial)
            if step is None:
                continue
            more = _admit(policy, left, opts, trial, now_s)
            if more:
                shrunk.append(step)
                admitted.update(more)
            else:
                trial = before
    if not admitted:
        return
    cl.node_busy[:] = trial.node_busy
    cl.invalidate()
    starts.update(admitted)
    for r, target, place in shrunk:
        why = f"{policy.name}: {r.placement.alloc} → {target.alloc} so that {len(admitted)} waiting job(s) start"
        resizes[r.job.job_id] = ("shrink", target, place, why)


def _one_step_down(new: Allocation, old: Allocation) -> bool:
    return new.kind == old.kind and new.count < old.count


def _try_shrink(
    policy: Policy, r: RunningJob, target: Price | None, trial: ClusterState
) -> tuple[RunningJob, Price, Placement] | None:
    """Move `r` onto `target` in `trial` when the shrink pays (Δ < remaining(now)); None leaves `trial` as it was."""
    if target is None:
        return None
    delta = r.remaining_iterations * target.iter_time_s + policy.switch_s(r.job) - r.remaining_s()
    if delta >= r.remaining_s():
        return None
    trial.release(r.placement)
    place = trial.place(target.alloc)
    if place is None:
        trial.take(r.placement)
        return None
    trial.take(place)
    return r, target, place


def _admit(
    policy: Policy, waiting: list[Job], opts: dict[str, list[Price]], trial: ClusterState, now_s: float
) -> dict[str, tuple[Price, Placement, Allocation]]:
    """Waiting jobs that start on `trial`'s free devices now, in the round's order (taken in `trial`)."""
    admitted: dict[str, tuple[Price, Placement, Allocation]] = {}
    for job in waiting:
        p = _choose(policy, job, opts[job.job_id], trial, now_s, job.iterations)
        if p is None:
            continue
        place = trial.place(p.alloc)
        assert place is not None
        trial.take(place)
        admitted[job.job_id] = (p, place, p.alloc)
    return admitted
