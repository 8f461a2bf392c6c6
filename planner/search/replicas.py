"""Kind-pure replicas of unequal speed: a shared layer split, unequal batch shares.

All replicas share pp, tp and the split (our runtime's FSDP/DDP over dp needs that); replica r
runs m_r micro-batches and finishes at T_r = S_c + (m_r − 1)·X_c, with S_c, X_c the sum and max of
its class's stage times. Given a split, handing out micro-batches one at a time to the replica that
would finish first minimises max_r T_r (greedy water-filling; each T_r is increasing in m_r). The
split is taken from the exact inner solver run per class, plus the even split, and the best is
kept — a heuristic: the oracle enumerates every split and share vector.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from planner.cost.stage import StageCoeffs
from planner.search.inner import StageArrays, solve_split, sorted_unique
from planner.search.space import Shape


def water_fill(S: list[float], X: list[float], counts: list[int], total: int) -> list[int] | None:
    """Micro-batches per replica (≥ 1 each) minimising max S_c + (m_r − 1)·X_c, for classes of
    `counts[c]` identical replicas: the smallest finish time T* at which the replicas can take
    `total` micro-batches, then the surplus is taken back from replicas finishing exactly at T*
    (and, when T* = max S_c leaves more, from the ones finishing latest before it): Σ = total."""
    if total < sum(counts):
        return None
    finish = [S[c] + np.arange(total) * X[c] for c in range(len(S))]
    cands = sorted_unique(np.concatenate(finish))

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
    owner: list[int] = []
    at_top: list[int] = []
    for c, (f, n) in enumerate(zip(finish, counts, strict=True)):
        k = int(np.searchsorted(f, t, side="right"))
        for _ in range(n):
            if k > 1 and f[k - 1] == t:
                at_top.append(len(out))
            out.append(k)
            owner.append(c)
    surplus = sum(out) - total
    top = at_top[len(at_top) - min(surplus, len(at_top)) :] if surplus else []
    for r in reversed(top):
        out[r] -= 1
    surplus -= len(top)
    # T* = max S_c (every replica runs ≥ 1) can leave more surplus than replicas finishing at T*:
    # the rest comes back from replicas that finish earlier, latest finish first (the makespan stays T*)
    while surplus > 0:
        r = max((r for r in range(len(out)) if out[r] > 1), key=lambda r: (finish[owner[r]][out[r] - 1], r))
        out[r] -= 1
        surplus -= 1
    return out


def even_split(num_layers: int, pp: int) -> tuple[int, ...]:
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if i < extra else 0) for i in range(pp))


def solve_replicas(
    shape: Shape,
    arrays: Callable[[int, int], tuple[StageArrays, list[StageCoeffs]]],
    *,
    m_guess: int,
    total_mb: int,
    num_layers: int,
) -> tuple[float, tuple[int, ...], tuple[int, ...], bool] | None:
    """(step time, split, micro-batches per replica, memory never binds) of the best split tried, or None.
    `arrays(i, m)` gives group i's stage arrays and coefficients with m micro-batches per replica
    (the caller memoises them: explore.Explorer)."""
    pp, dp = shape.pp, shape.dp
    groups = list(enumerate(n for _, n in shape.groups))
    base = [arrays(i, m_guess) for i, _ in groups]
    splits = {even_split(num_layers, pp)} if num_layers >= pp else set()
    for i, _ in groups:
        sol = solve_split(base[i][0], num_layers, m_guess)
        if sol is not None:
            splits.add(sol.layers)
    best = None
    for split in splits:
        ns = np.array(split, dtype=np.float64)
        Sc, Xc, owner = [], [], []
        for i, n in groups:
            t = base[i][0].a * ns + base[i][0].b
            Sc.append(float(t.sum()))
            Xc.append(float(t.max()))
            owner += [i] * n
        mb = water_fill(Sc, Xc, [n for _, n in groups], total_mb)
        if mb is None:
            continue
        S = [Sc[j] for j, n in groups for _ in range(n)]
        X = [Xc[j] for j, n in groups for _ in range(n)]
        fits = True
        start = 0
        for i, n in groups:
            top = max(mb[start : start + n])
            start += n
            ok = arrays(i, top)[0].mem_ok if top != m_guess else base[i][0].mem_ok
            if not all(ok[s, split[s] - 1] for s in range(pp)):
                fits = False
                break
        if not fits:
            continue
        times = [S[r] + (mb[r] - 1) * X[r] for r in range(dp)]
        rc = max(range(dp), key=lambda r: times[r])
        crit = base[owner[rc]][1]
        tail = 0.0
        for s in range(pp):
            n = split[s]
            e = max(0.0, crit[s].grad_sync_s_fixed + crit[s].grad_sync_s_per_block * n)
            g = crit[s].drain_s_fixed + crit[s].drain_s_per_block * n
            o = max(base[i][1][s].optimizer_s_fixed + base[i][1][s].optimizer_s_per_block * n for i, _ in groups)
            tail = max(tail, e + g + o)
        cost = times[rc] + tail
        if best is None or cost < best[0]:
            best = (cost, split, tuple(mb))
    if best is None:
        return None
    loose = all(bool(base[i][0].mem_ok.all()) for i, _ in groups)
    return (*best, loose)
