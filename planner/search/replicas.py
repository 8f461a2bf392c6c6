"""Kind-pure replicas of unequal speed: a shared layer split, unequal batch shares.

All replicas share pp, tp and the split (our runtime's FSDP/DDP over dp needs that); replica r
runs m_r micro-batches and finishes at T_r = S_c + (m_r − 1)·X_c, with S_c, X_c the sum and max of
its class's stage times. Given a split, handing out micro-batches one at a time to the replica that
would finish first minimises max_r T_r (greedy water-filling; each T_r is increasing in m_r). The
split is taken from the exact inner solver run per class, plus the even split, and the best is
kept — a heuristic: the oracle enumerates every split and share vector.
"""

from __future__ import annotations

import math

import numpy as np

from planner.cost.devices import cross_node_link
from planner.search.arrays import Pricer, StageSpec, stage_arrays
from planner.search.inner import solve_split
from planner.search.space import Shape


def water_fill(S: list[float], X: list[float], counts: list[int], total: int) -> list[int] | None:
    """Micro-batches per replica (≥ 1 each) minimising max S_c + (m_r − 1)·X_c, for classes of
    `counts[c]` identical replicas: the smallest finish time T* at which the replicas can take
    `total` micro-batches, then the surplus is taken back from replicas finishing exactly at T*."""
    if total < sum(counts):
        return None
    finish = [S[c] + np.arange(total) * X[c] for c in range(len(S))]
    cands = np.unique(np.concatenate(finish))

    def capacity(t: float) -> int:
        return sum(n * int(np.searchsorted(f, t, side="right")) for f, n in zip(finish, counts, strict=True))

    lo, hi = int(np.searchsorted(cands, max(S))), len(cands) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if capacity(cands[mid]) >= total:
            hi = mid
        else:
            lo = mid + 1
    t = cands[lo]
    out: list[int] = []
    at_top: list[int] = []
    for c, (f, n) in enumerate(zip(finish, counts, strict=True)):
        k = int(np.searchsorted(f, t, side="right"))
        for _ in range(n):
            if k > 1 and f[k - 1] == t:
                at_top.append(len(out))
            out.append(k)
        del c
    surplus = sum(out) - total
    for r in reversed(at_top[len(at_top) - surplus :] if surplus else []):
        out[r] -= 1
    return out


def even_split(num_layers: int, pp: int) -> tuple[int, ...]:
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if i < extra else 0) for i in range(pp))


def solve_replicas(
    pr: Pricer, shape: Shape, *, mbs: int, schedule: str, sharding: str, k: int, total_mb: int, num_layers: int
) -> tuple[float, tuple[int, ...], tuple[int, ...], bool] | None:
    """(step time, split, micro-batches per replica, memory never binds) of the best split tried, or None."""
    tp, pp, dp = shape.segments[0].tp, shape.pp, shape.dp
    link = cross_node_link([pr.classes[c].spec for c, _ in shape.groups])
    m_guess = math.ceil(total_mb / dp)

    def arrays(c: int, n: int, m: int):
        stages = [StageSpec(c, tp, s, n * tp) for s in range(pp)]
        return stage_arrays(
            pr,
            stages,
            num_layers,
            mbs=mbs,
            schedule=schedule,
            sharding=sharding,
            dp=dp,
            recompute_prefix=k,
            m=m,
            dplink=[link] * pp,
        )

    base = {c: arrays(c, n, m_guess) for c, n in shape.groups}
    splits = {even_split(num_layers, pp)} if num_layers >= pp else set()
    for c, _ in shape.groups:
        sol = solve_split(base[c][0], num_layers, m_guess)
        if sol is not None:
            splits.add(sol.layers)
    best = None
    for split in splits:
        ns = np.array(split, dtype=np.float64)
        Sc, Xc, owner = [], [], []
        for c, n in shape.groups:
            t = base[c][0].a * ns + base[c][0].b
            Sc.append(float(t.sum()))
            Xc.append(float(t.max()))
            owner += [c] * n
        mb = water_fill(Sc, Xc, [n for _, n in shape.groups], total_mb)
        if mb is None:
            continue
        S = [Sc[j] for j, (_, n) in enumerate(shape.groups) for _ in range(n)]
        X = [Xc[j] for j, (_, n) in enumerate(shape.groups) for _ in range(n)]
        fits = True
        start = 0
        for c, n in shape.groups:
            top = max(mb[start : start + n])
            start += n
            ok = arrays(c, n, top)[0].mem_ok if top != m_guess else base[c][0].mem_ok
            if not all(ok[i, split[i] - 1] for i in range(pp)):
                fits = False
                break
        if not fits:
            continue
        times = [S[r] + (mb[r] - 1) * X[r] for r in range(dp)]
        rc = max(range(dp), key=lambda r: times[r])
        crit = base[owner[rc]][1]
        tail = 0.0
        for i in range(pp):
            n = split[i]
            e = max(0.0, crit[i].e0 + crit[i].e1 * n)
            g = crit[i].g0 + crit[i].g1 * n
            o = max(base[c][1][i].o0 + base[c][1][i].o1 * n for c, _ in shape.groups)
            tail = max(tail, e + g + o)
        cost = times[rc] + tail
        if best is None or cost < best[0]:
            best = (cost, split, tuple(mb))
    if best is None:
        return None
    loose = all(bool(base[c][0].mem_ok.all()) for c, _ in shape.groups)
    return (*best, loose)
