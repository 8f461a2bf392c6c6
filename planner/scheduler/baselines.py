"""Two published elastic schedulers as baselines, decided under meshplan's own simulator and charges.

Both see the same `SpeedSource` (measured per-allocation iteration times) as meshplan's policies and
pay the same switch (`Policy.switch_s`) for every start and resize; neither preempts a running job
back to the queue (the simulator and the real scheduler have no such action), so each may shrink,
grow or move a running job but never stop it.

`crius` — after Crius (Xue et al., "A Codesign of Scheduling and Parallelization for Large Model
Training in Heterogeneous Clusters", arXiv 2403.16125; the Arena/Crius EuroSys'26 artifact): jobs are
served in arrival order (FIFO); a new job is started on the *smallest* GPU count it can run on, on
the kind where that count runs fastest among those free (its Cell: GPU kind, count, best plan); when
nothing is free it shrinks running jobs one power-of-two step (halving, fewest throughput lost first,
at most `CRIUS_SHRINK_STEPS` per arrival) until it fits — so it does not queue while others hold more
than their smallest allocation. Spare GPUs then go, one doubling or one kind change at a time, to the
job with the largest *structured marginal gain* (relative throughput gain, Δthr / thr, per added GPU),
at most `CRIUS_UPGRADE_STEPS` upgrades per job and round; a running job's upgrade must repay its
switch over its remaining time. The artifact's search over Cells is exhaustive per step (its rounds
took up to minutes); this is its greedy order on the same moves.

`sia` — after Sia (Jayaram Subramanya et al., "Sia: Heterogeneity-aware, goodput-optimized ML-cluster
scheduling", SOSP'23): every round re-solves the allocation of all active jobs to maximise the sum of
each job's *normalised goodput* (its throughput on a configuration divided by its throughput on its
smallest configuration, so a 1-GPU job and a 16-GPU job count alike), with a restart penalty for any
job whose configuration changes. Sia solves that as an ILP; this is a faithful greedy approximation
of it: every active job first gets one configuration (running jobs keep theirs, queued jobs the
smallest count on the kind with the best normalised goodput per GPU, oldest first — Sia's objective
rewards giving every job something), then configurations are improved one at a time by the best
gain in normalised goodput per added GPU, a running job's change discounted by its restart
(switch seconds over the job's remaining time), until no improvement fits.
"""

from __future__ import annotations

from planner.scheduler.speed import Price, SpeedSource
from planner.scheduler.types import (
    Action,
    Allocation,
    ClusterState,
    Decision,
    Job,
    Placement,
    Rejection,
    RunningJob,
)

CRIUS_SHRINK_STEPS = 2  # the artifact's ITER_NUM_OF_DOWNGRADE_SEARCH (simulation)
CRIUS_UPGRADE_STEPS = 10  # the artifact's MAX_UPGRADE_STEP_NUM
BASELINES = ("crius", "sia")


class _State:
    """A round in progress: a trial cluster, every job's current price and placement, what changed."""

    def __init__(self, cluster: ClusterState, running: list[RunningJob], speed: SpeedSource) -> None:
        self.cl = cluster.copy()
        self.speed = speed
        self.cur: dict[str, tuple[Price, Placement]] = {}
        self.jobs: dict[str, Job] = {}
        self.run: dict[str, RunningJob] = {r.job.job_id: r for r in running}
        for r in running:
            self.cur[r.job.job_id] = (Price(r.placement.alloc, r.iter_time_s, r.plan), r.placement)
            self.jobs[r.job.job_id] = r.job
        self.started: set[str] = set()
        self.admitted: dict[str, Allocation] = {}  # a started job's first allocation, before growth
        self.upgrades: dict[str, int] = {}

    def options(self, jid: str) -> list[Price]:
        return self.speed.options(self.jobs[jid], self.cl)

    def move(self, jid: str, to: Price) -> bool:
        """Put job `jid` on `to` (releasing what it holds); False leaves everything as it was."""
        old = self.cur.get(jid)
        if old is not None:
            self.cl.release(old[1])
        place = self.cl.place(to.alloc)
        if place is None:
            if old is not None:
                self.cl.take(old[1])
            return False
        self.cl.take(place)
        self.cur[jid] = (to, place)
        return True

    def remaining_iters(self, jid: str) -> float:
        r = self.run.get(jid)
        return r.remaining_iterations if r is not None else float(self.jobs[jid].iterations)

    def repays(self, jid: str, to: Price, switch_s: float) -> bool:
        """A running job's change pays for its switch over its remaining iterations (a new job's is free)."""
        if jid in self.started or jid not in self.run:
            return True
        now = self.run[jid]
        return self.remaining_iters(jid) * (now.iter_time_s - to.iter_time_s) > switch_s

    def decision(self, name: str, queue: list[Job], rejections: list[Rejection]) -> Decision:
        actions = []
        for jid, (p, place) in self.cur.items():
            if jid in self.started:
                base = self.admitted.get(jid, p.alloc)
                actions.append(Action(jid, "start", place, p.iter_time_s, p.plan, f"{name}: {p.alloc}", base))
                continue
            r = self.run[jid]
            old = r.placement.alloc
            if p.alloc == old and place == r.placement:
                continue
            kind = "grow" if p.alloc.count > old.count else "shrink" if p.alloc.count < old.count else "move"
            actions.append(Action(jid, kind, place, p.iter_time_s, p.plan, f"{name}: {old} → {p.alloc}", r.base))
        rejected = {r.job_id for r in rejections}
        waiting = tuple(j.job_id for j in queue if j.job_id not in self.started and j.job_id not in rejected)
        return Decision(name, tuple(actions), tuple(rejections), waiting)


def _thr(p: Price) -> float:
    return 1.0 / p.iter_time_s


def _live(queue: list[Job], st: _State, name: str) -> tuple[list[Job], list[Rejection]]:
    live, rejections = [], []
    for j in queue:
        st.jobs[j.job_id] = j
        if st.options(j.job_id):
            live.append(j)
        else:
            kinds = ", ".join(j.kinds) if j.kinds else "any kind"
            rejections.append(Rejection(j.job_id, f"no allocation on this cluster ({kinds}) can run {j.model}"))
    return live, rejections


def _smallest_start(st: _State, jid: str, score) -> Price | None:
    """The placeable option with the fewest GPUs, best `score` among those (None if nothing fits now)."""
    ok = [p for p in st.options(jid) if st.cl.can_place(p.alloc)]
    if not ok:
        return None
    least = min(p.alloc.count for p in ok)
    return max((p for p in ok if p.alloc.count == least), key=score)


def decide_crius(
    cluster: ClusterState, queue: list[Job], running: list[RunningJob], policy, speed: SpeedSource, now_s: float
) -> Decision:
    st = _State(cluster, running, speed)
    live, rejections = _live(queue, st, "crius")
    for job in sorted(live, key=lambda j: (j.submit_s, j.job_id)):  # FIFO
        jid = job.job_id
        p = _smallest_start(st, jid, _thr)
        shrinks = 0
        while p is None and shrinks < CRIUS_SHRINK_STEPS:
            if not _crius_shrink_one(st, policy, job):
                break
            shrinks += 1
            p = _smallest_start(st, jid, _thr)
        if p is not None and st.move(jid, p):
            st.started.add(jid)
            st.admitted[jid] = p.alloc
    _crius_upgrade(st, policy)
    return st.decision("crius", queue, rejections)


def _crius_shrink_one(st: _State, policy, job: Job) -> bool:
    """Halve one running job (same kind), the one losing the least relative throughput, if that lets
    the new job's smallest allocation fit somewhere (checked on the released devices)."""
    need = min(
        (p.alloc for p in st.speed.options(job, st.cl)),
        key=lambda a: a.count,
        default=None,
    )
    if need is None:
        return False
    best: tuple[float, str, Price] | None = None
    for jid, (p, _) in st.cur.items():
        if jid in st.started or p.alloc.count < 2:
            continue
        half = [o for o in st.options(jid) if o.alloc.kind == p.alloc.kind and o.alloc.count == p.alloc.count // 2]
        if not half:
            continue
        o = max(half, key=_thr)
        loss = (_thr(p) - _thr(o)) / _thr(p)
        if best is None or loss < best[0]:
            best = (loss, jid, o)
    if best is None:
        return False
    return st.move(best[1], best[2])


def _crius_upgrade(st: _State, policy) -> None:
    """Spare GPUs to the largest structured marginal gain per added GPU: double the count, or change kind."""
    while st.cl.free_total() > 0:
        best: tuple[float, str, Price] | None = None
        for jid, (p, _) in st.cur.items():
            if st.upgrades.get(jid, 0) >= CRIUS_UPGRADE_STEPS:
                continue
            for o in st.options(jid):
                a = o.alloc
                step = (a.kind == p.alloc.kind and a.count == 2 * p.alloc.count) or (
                    a.kind != p.alloc.kind and a.count == p.alloc.count
                )
                if not step or o.iter_time_s >= p.iter_time_s:
                    continue
                extra = max(1, a.count - p.alloc.count)
                gain = (_thr(o) - _thr(p)) / _thr(p) / extra
                if best is not None and gain <= best[0]:
                    continue
                if not st.repays(jid, o, policy.switch_s(st.jobs[jid])):
                    continue
                if not _fits_after_release(st, jid, a):
                    continue
                best = (gain, jid, o)
        if best is None:
            return
        _, jid, o = best
        if not st.move(jid, o):
            return
        st.upgrades[jid] = st.upgrades.get(jid, 0) + 1


def _fits_after_release(st: _State, jid: str, a: Allocation) -> bool:
    if st.cl.can_place(a):
        return True
    cur = st.cur.get(jid)
    if cur is None or cur[0].alloc.kind != a.kind:
        return False
    st.cl.release(cur[1])
    ok = st.cl.can_place(a)
    st.cl.take(cur[1])
    return ok


def decide_sia(
    cluster: ClusterState, queue: list[Job], running: list[RunningJob], policy, speed: SpeedSource, now_s: float
) -> Decision:
    st = _State(cluster, running, speed)
    live, rejections = _live(queue, st, "sia")
    base: dict[str, float] = {}  # throughput on the job's smallest configuration (normalisation)
    for jid in list(st.cur) + [j.job_id for j in live]:
        opts = st.options(jid)
        least = min(p.alloc.count for p in opts)
        base[jid] = min(_thr(p) for p in opts if p.alloc.count == least)

    def per_gpu(jid: str):
        return lambda p: _thr(p) / base[jid] / p.alloc.count

    for job in sorted(live, key=lambda j: (j.submit_s, j.job_id)):  # every job gets something, oldest first
        p = _smallest_start(st, job.job_id, per_gpu(job.job_id))
        if p is not None and st.move(job.job_id, p):
            st.started.add(job.job_id)
            st.admitted[job.job_id] = p.alloc
    while st.cl.free_total() > 0:
        best: tuple[float, str, Price] | None = None
        for jid, (p, _) in st.cur.items():
            rem = st.remaining_iters(jid)
            for o in st.options(jid):
                extra = o.alloc.count - p.alloc.count
                if extra <= 0 or o.iter_time_s >= p.iter_time_s:
                    continue
                util = (_thr(o) - _thr(p)) / base[jid]
                if jid not in st.started:  # restart penalty: the share of its remaining time the switch costs
                    left = rem * o.iter_time_s
                    util *= max(0.0, 1.0 - policy.switch_s(st.jobs[jid]) / max(left, 1.0))
                gain = util / extra
                if best is not None and gain <= best[0]:
                    continue
                if gain <= 0 or not st.repays(jid, o, policy.switch_s(st.jobs[jid])):
                    continue
                if not _fits_after_release(st, jid, o.alloc):
                    continue
                best = (gain, jid, o)
        if best is None:
            break
        if not st.move(best[1], best[2]):
            break
    return st.decision("sia", queue, rejections)
