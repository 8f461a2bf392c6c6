"""`srtf`: shortest remaining time first, every job started small, spare GPUs by marginal gain per GPU.

Under a burst the cluster cannot give every job its fastest allocation; what keeps the average time
in system low is (1) nobody waiting while a small allocation could run them, (2) the short jobs
finishing first — on the fast GPUs, (3) spare GPUs going where they save the most time per GPU, and (4) no resize that
does not pay for itself. One round:

1. **Admit, small.** Queued jobs in priority order — their remaining time on their fastest allocation,
   divided by `1 + waited / AGE_S` (ageing: a long job's priority doubles every `AGE_S` it waits, so
   none starves) — each start on their *smallest* allocation (fewest GPUs; among those, the fastest
   kind free), so as many start as can.
2. **Make room.** A job that still does not fit takes GPUs from running jobs of lower priority: the
   one with the longest remaining time whose shrink by one power-of-two step (same kind) lets it start,
   and only when that victim will outlast the newcomer by `SHRINK_RATIO`× (the newcomer is the one
   SRPT serves first; the victim pays one switch).
3. **Rebalance.** A job running (or starting) `REBALANCE`× slower than on its fastest allocation
   takes that allocation from longer jobs holding its kind — each halved, longest first, only while
   its gain beats their summed loss (switches included) and each outlasts it by `SHRINK_RATIO`×:
   in the drain after a burst, the jobs about to finish get the A100s, the long ones keep running
   on fewer.
4. **Grow.** Spare GPUs go, one move at a time, to the job whose remaining time falls the most per
   added GPU: `gain = remaining(now) − remaining(new) − switch` (no switch for a job starting this
   round), over `new.count − now.count` (a same-count move to a faster kind counts as one GPU),
   divided by `remaining(now) ** SRPT_EXP`: a GPU that lets a short job finish comes back soon
   (measured on the trace's 3× burst: 0.98 h above the bound per job with it, 1.45 h without).
   A move must gain at least `min_gain_s` (it pays back its switch within the job's remaining time,
   with margin). While jobs keep arriving, growth leaves `reserve` of each kind free for the next
   round's arrivals (the GPUs the last hour's arrivals took at their smallest allocation, per round):
   growing into them now would only mean shrinking again.

A lazy max-heap of each job's best move keeps a round to milliseconds: a popped move that no longer
fits, or would now take the reserve, is re-priced for that job alone.
"""

from __future__ import annotations

import heapq
import math

from planner.scheduler.speed import Price, SpeedSource
from planner.scheduler.types import Action, ClusterState, Decision, Job, Placement, Rejection, RunningJob

AGE_S = 4 * 3600.0  # ageing: priority doubles every AGE_S of waiting
_MAX_TRIES = 16  # victims tried per job in one round: bounds a round's work
SHRINK_RATIO = 2.0  # shrink a running job for a shorter one only when it outlasts it by this factor
LOOKBACK_S = 3600.0  # arrivals in the last hour predict the next round's
SRPT_EXP = 2.0  # growth score: time saved per added GPU / remaining time ** SRPT_EXP (the short jobs first)
REBALANCE = 2.0  # a job this many times slower than its fastest allocation may take it from longer jobs


def decide_srtf(
    cluster: ClusterState,
    queue: list[Job],
    running: list[RunningJob],
    policy,
    speed: SpeedSource,
    now_s: float,
    round_s: float = 300.0,
) -> Decision:
    cl = cluster.copy()
    cur: dict[str, tuple[Price, Placement]] = {}
    jobs: dict[str, Job] = {}
    rem: dict[str, float] = {}
    run = {r.job.job_id: r for r in running}
    for r in running:
        cur[r.job.job_id] = (Price(r.placement.alloc, r.iter_time_s, r.plan), r.placement)
        jobs[r.job.job_id] = r.job
        rem[r.job.job_id] = r.remaining_iterations
    opts: dict[str, list[Price]] = {}
    rejections: list[Rejection] = []
    live: list[Job] = []
    for j in queue:
        o = speed.options(j, cl)
        if not o:
            kinds = ", ".join(j.kinds) if j.kinds else "any kind"
            rejections.append(Rejection(j.job_id, f"no allocation on this cluster ({kinds}) can run {j.model}"))
            continue
        opts[j.job_id], jobs[j.job_id], rem[j.job_id] = o, j, float(j.iterations)
        live.append(j)
    for r in running:
        opts[r.job.job_id] = speed.options(r.job, cl)
    best_t = {jid: min(p.iter_time_s for p in o) for jid, o in opts.items()}

    def left_s(jid: str) -> float:  # remaining time on its fastest allocation
        return rem[jid] * best_t[jid]

    def prio(j: Job) -> float:
        return left_s(j.job_id) / (1.0 + max(0.0, now_s - j.submit_s) / AGE_S)

    started: set[str] = set()
    admitted: dict = {}  # a started job's small first allocation (its base), before growth
    waiting: list[str] = []
    for job in sorted(live, key=lambda j: (-j.priority, prio(j), j.job_id)):
        jid = job.job_id
        p = _smallest(opts[jid], cl)
        if p is None:
            p = _make_room(jid, opts, cur, run, started, rem, left_s, cl, policy)
        if p is None:
            waiting.append(jid)
            continue
        place = cl.place(p.alloc)
        assert place is not None
        cl.take(place)
        cur[jid] = (p, place)
        started.add(jid)
        admitted[jid] = p.alloc
    _rebalance(cl, cur, opts, rem, run, started, jobs, policy, left_s)
    _grow(
        cl, cur, opts, rem, run, started, jobs, policy, _reserve(list(jobs.values()), opts, now_s, round_s, cl, speed)
    )

    actions = []
    for jid, (p, place) in cur.items():
        if jid in started:
            actions.append(Action(jid, "start", place, p.iter_time_s, p.plan, f"srtf: {p.alloc}", admitted[jid]))
            continue
        r = run[jid]
        old = r.placement.alloc
        if p.alloc == old and place == r.placement:
            continue
        kind = "grow" if p.alloc.count > old.count else "shrink" if p.alloc.count < old.count else "move"
        why = f"srtf: {old} → {p.alloc}, {rem[jid] * (r.iter_time_s - p.iter_time_s):.0f} s sooner before the switch"
        actions.append(Action(jid, kind, place, p.iter_time_s, p.plan, why, r.base))
    return Decision("srtf", tuple(actions), tuple(rejections), tuple(waiting))


def _smallest(opts: list[Price], cl: ClusterState) -> Price | None:
    ok = [p for p in opts if cl.can_place(p.alloc)]
    if not ok:
        return None
    least = min(p.alloc.count for p in ok)
    return min((p for p in ok if p.alloc.count == least), key=lambda p: (p.iter_time_s, p.alloc.num_nodes))


def _make_room(jid, opts, cur, run, started, rem, left_s, cl: ClusterState, policy) -> Price | None:
    """Shrink one lower-priority running job one step if the newcomer then fits; its price, or None."""
    mine = left_s(jid)
    kinds = {p.alloc.kind for p in opts[jid]}
    victims = sorted(
        (v for v in cur if v not in started and v in run and cur[v][0].alloc.kind in kinds),
        key=lambda v: -rem[v] * cur[v][0].iter_time_s,
    )
    for v in victims:
        p, place = cur[v]
        if rem[v] * p.iter_time_s < SHRINK_RATIO * mine:
            break  # sorted: nobody later outlasts the newcomer enough
        smaller = [o for o in opts[v] if o.alloc.kind == p.alloc.kind and o.alloc.count < p.alloc.count]
        if not smaller:
            continue
        top = max(o.alloc.count for o in smaller)
        o = min((o for o in smaller if o.alloc.count == top), key=lambda o: o.iter_time_s)
        cl.release(place)
        new_place = cl.place(o.alloc)
        if new_place is None:
            cl.take(place)
            continue
        cl.take(new_place)
        fit = _smallest(opts[jid], cl)
        if fit is None:
            cl.release(new_place)
            cl.take(place)
            continue
        cur[v] = (o, new_place)
        return fit
    return None


def _rebalance(cl: ClusterState, cur, opts, rem, run, started, jobs, policy, left_s) -> None:
    """Fast GPUs to the short jobs: a job running (or starting) well below its fastest allocation takes
    that allocation from longer running jobs of the kind, each shrunk one step (halved), when its
    gain beats their summed loss (switches included) and each of them outlasts it by `SHRINK_RATIO`×."""
    fastest = {jid: min(opts[jid], key=lambda o: (o.iter_time_s, o.alloc.count)) for jid in cur}
    slow = [j for j in cur if cur[j][0].iter_time_s >= REBALANCE * fastest[j].iter_time_s]
    if not slow:
        return
    pool: dict[str, list[str]] = {}  # per kind: running jobs that could give GPUs, longest remaining first
    for v in sorted(cur, key=lambda v: -rem[v] * cur[v][0].iter_time_s):
        if v not in started and cur[v][0].alloc.count > 1:
            pool.setdefault(cur[v][0].alloc.kind, []).append(v)
    resizes = 0
    halves: dict[str, Price | None] = {}  # a victim's allocation one step down (its kind, half the GPUs)
    for jid in sorted(slow, key=left_s):
        if resizes >= policy.max_resizes:
            return
        p, place = cur[jid]
        best = fastest[jid]
        moved = jid in started or place != run[jid].placement
        gain = rem[jid] * (p.iter_time_s - best.iter_time_s) - (0.0 if moved else policy.switch_s(jobs[jid]))
        if gain < policy.min_gain_s:
            continue
        mine = rem[jid] * best.iter_time_s
        k = best.alloc.kind
        saved: dict[str, tuple[Price, Placement]] = {}
        loss, ok, tries = 0.0, False, 0
        cl.release(place)
        for v in pool.get(k, ()):
            tries += 1
            if tries > _MAX_TRIES:
                break
            vp, vplace = cur[v]
            if rem[v] * vp.iter_time_s <= SHRINK_RATIO * mine:
                break  # longest first: nobody later outlasts it enough
            if (
                v == jid
                or vplace != run[v].placement
                or vp.alloc.kind != k
                or len(saved) + resizes >= policy.max_resizes
            ):
                continue
            if v not in halves:
                half = [o for o in opts[v] if o.alloc.kind == k and o.alloc.count == vp.alloc.count // 2]
                halves[v] = min(half, key=lambda o: o.iter_time_s) if half else None
            o = halves[v]
            if o is None:
                continue
            cl.release(vplace)
            np_ = cl.place(o.alloc)
            if np_ is None:
                cl.take(vplace)
                continue
            cl.take(np_)
            saved[v] = cur[v]
            cur[v] = (o, np_)
            loss += rem[v] * (o.iter_time_s - vp.iter_time_s) + policy.switch_s(jobs[v])
            if loss >= gain:
                break
            if cl.can_place(best.alloc):
                ok = True
                break
        if ok:
            new_place = cl.place(best.alloc)
            assert new_place is not None
            cl.take(new_place)
            cur[jid] = (best, new_place)
            resizes += 1 + len(saved)
            continue
        for v in saved:  # undo
            cl.release(cur[v][1])
        for v, was in saved.items():
            cur[v] = was
            cl.take(was[1])
        cl.take(place)


def _reserve(
    recent: list[Job], opts, now_s: float, round_s: float, cl: ClusterState, speed: SpeedSource
) -> dict[str, int]:
    """GPUs per kind the next round's arrivals are expected to start on (last hour's, at their smallest)."""
    out: dict[str, int] = {}
    window = [j for j in recent if now_s - LOOKBACK_S < j.submit_s <= now_s]
    if not window:
        return out
    share = round_s / LOOKBACK_S
    for j in window:
        o = opts.get(j.job_id) or speed.options(j, cl)
        if not o:
            continue
        least = min(p.alloc.count for p in o)
        kinds = {p.alloc.kind for p in o if p.alloc.count == least}
        for k in kinds:
            out[k] = out.get(k, 0) + least
    return {k: math.ceil(v * share) for k, v in out.items()}


def _grow(cl: ClusterState, cur, opts, rem, run, started, jobs, policy, reserve: dict[str, int]) -> None:
    free = {k: cl.free(k) for k in cl.kinds}

    def best_move(jid: str) -> tuple[float, Price] | None:
        p = cur[jid][0]
        moved = jid in started or cur[jid][1] != run[jid].placement  # its switch is already paid this round
        switch = 0.0 if moved else policy.switch_s(jobs[jid])
        now = rem[jid] * p.iter_time_s
        best = None
        for o in opts[jid]:
            if o.iter_time_s >= p.iter_time_s:
                continue
            same = o.alloc.kind == p.alloc.kind
            extra = o.alloc.count - (p.alloc.count if same else 0)
            if extra > free.get(o.alloc.kind, 0) - reserve.get(o.alloc.kind, 0):
                continue
            gain = now - rem[jid] * o.iter_time_s - switch
            if gain < policy.min_gain_s:
                continue
            per = gain / max(1, extra) / now**SRPT_EXP
            if best is None or per > best[0]:
                best = (per, o)
        return best

    heap = []
    for jid in cur:
        m = best_move(jid)
        if m is not None:
            heapq.heappush(heap, (-m[0], jid, m[1]))
    moves = 0
    while heap and moves < policy.max_resizes * 64:
        neg, jid, o = heapq.heappop(heap)
        p, place = cur[jid]
        extra = o.alloc.count - (p.alloc.count if o.alloc.kind == p.alloc.kind else 0)
        if extra > free.get(o.alloc.kind, 0) - reserve.get(o.alloc.kind, 0):
            # priced before another job's move took free GPUs: it would now grow into the reserve
            m = best_move(jid)
            if m is not None:
                heapq.heappush(heap, (-m[0], jid, m[1]))
            continue
        cl.release(place)
        new_place = cl.place(o.alloc)
        if new_place is None:
            cl.take(place)
            m = best_move(jid)  # re-price this job alone: what fits has changed
            if m is not None and m[1] != o:
                heapq.heappush(heap, (-m[0], jid, m[1]))
            continue
        cl.take(new_place)
        free[p.alloc.kind] += p.alloc.count
        free[o.alloc.kind] -= o.alloc.count
        cur[jid] = (o, new_place)
        moves += 1
        m = best_move(jid)
        if m is not None:
            heapq.heappush(heap, (-m[0], jid, m[1]))
