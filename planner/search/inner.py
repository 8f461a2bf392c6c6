"""Inner solver: the layer→stage split of one pipeline, exact, vectorised over bottleneck values.

Stage i with n_i blocks costs τ_i(n) = a_i·n + b_i per micro-batch, has tail Z_i(n) (convex in n)
and fits in memory up to n ≤ cap_i. The step time of a split is
    Σ τ_i + (m − 1)·max τ_i + max Z_i          (formulas.pipeline_time_s + the slowest tail).
Fix an upper bound B on max τ_i and Z on max Z_i: each stage gets a box lo_i ≤ n_i ≤ hi_i, and
Σ τ_i is linear and separable, so filling the boxes cheapest-slope-first (after the lower bounds) is
an optimal split (a unit-item knapsack with a sum constraint). The optimum's own (max τ, max Z) is a
grid point, so the minimum over the grid of the true cost of each point's split is the optimum.
All grid points are solved at once with numpy ([G, p] arrays). When the grid would be large, Z is
sampled (16 quantiles + unconstrained) and the result is a near-optimum; tiny instances are exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

EXACT_GRID = 4096
Z_SAMPLES = 16


@dataclass(frozen=True, slots=True)
class Split:
    cost_s: float
    layers: tuple[int, ...]
    pipeline_s: float
    tail_s: float


class StageArrays(NamedTuple):
    """Per-stage coefficients of one candidate (length p each; a named tuple: thousands are built)."""

    a: np.ndarray
    b: np.ndarray
    e0: np.ndarray
    e1: np.ndarray
    z0: np.ndarray  # g0 + o0
    z1: np.ndarray  # g1 + o1
    mem_ok: np.ndarray  # [p, L - p + 1] bool: n = 1.. fits in memory


def solve_split(
    s: StageArrays, num_layers: int, m: int, upper_s: float = np.inf, w_sum: float = 1.0, w_max: float | None = None
) -> Split | None:
    """The cheapest split of `num_layers` blocks over the stages, or None if none fits in memory
    (or none can cost less than `upper_s`: B values that cannot beat it are dropped first).
    The pipeline term is w_sum·Σ τ + w_max·max τ: (1, m − 1) for GPipe/1F1B, (1/v, m − 1/v) for
    interleaved 1F1B over per-rank times (formulas.interleaved_time_s rearranged)."""
    w_max = float(m - 1) if w_max is None else w_max
    p = len(s.a)
    nmax = num_layers - p + 1
    if nmax < 1:
        return None
    ns = np.arange(1, nmax + 1, dtype=np.float64)
    caps = s.mem_ok.sum(axis=1)  # memory-feasible n form a prefix (allocation grows with n)
    if (caps < 1).any() or caps.sum() < num_layers:
        return None
    tau = s.a[:, None] * ns[None, :] + s.b[:, None]  # [p, nmax]
    zt = np.maximum(0.0, s.e0[:, None] + s.e1[:, None] * ns[None, :]) + (s.z0[:, None] + s.z1[:, None] * ns[None, :])
    ok = s.mem_ok
    # every stage holds ≥ 1 block, so B ≥ max τ_i(1); any split costs ≥ S_min + (m−1)·B + Z_min
    b_lo = float(tau[:, 0].max())
    s_min = w_sum * (num_layers * float(s.a.min()) + float(s.b.sum()))
    z_min = float(np.where(ok, zt, np.inf).min(axis=1).max())
    b_hi = (upper_s - s_min - z_min) / w_max if w_max > 0 else np.inf
    # stages paced to B hold n_i ≤ (B − b_i)/a_i blocks and must hold L: B ≥ (L + Σ b/a) / Σ 1/a
    inv = 1.0 / s.a
    b_lo = max(b_lo, (num_layers + float((s.b * inv).sum())) / float(inv.sum()) * (1 - 1e-12))
    bvals = sorted_unique(tau[ok])
    bvals = bvals[(bvals >= b_lo) & (bvals <= b_hi)]
    if len(bvals) == 0:
        return None
    zvals = sorted_unique(zt[ok])
    if w_max > 0 and len(bvals) > 8:
        # a quick incumbent from the lowest B values narrows the window: cost ≥ S_min + (m−1)·B + Z_min
        first = _grid(s, tau, zt, caps, bvals[:8], np.array([np.inf]), num_layers, w_sum, w_max)
        if first is not None:
            b_hi = min(b_hi, (first.cost_s - s_min - z_min) / w_max)
            bvals = bvals[bvals <= b_hi * (1 + 1e-12)]
    best = _grid(s, tau, zt, caps, bvals, zvals, num_layers, w_sum, w_max)
    return best


def sorted_unique(x: np.ndarray) -> np.ndarray:
    """np.unique of a 1-d float array (sorted, each value once), without np.unique: it imports numpy.ma
    on first use (~20 ms of a `meshplan plan` process) and checks for masks on every call."""
    v = np.sort(x, axis=None)
    if v.size < 2:
        return v
    keep = np.empty(v.size, dtype=bool)
    keep[0] = True
    np.not_equal(v[1:], v[:-1], out=keep[1:])
    return v[keep]


def _grid(
    s: StageArrays,
    tau: np.ndarray,
    zt: np.ndarray,
    caps: np.ndarray,
    bvals: np.ndarray,
    zvals: np.ndarray,
    num_layers: int,
    w_sum: float,
    w_max: float,
) -> Split | None:
    """Solve every (B, Z) grid point at once and return the best true cost among their splits."""
    p, nmax = tau.shape
    if len(bvals) * len(zvals) > EXACT_GRID and len(zvals) > Z_SAMPLES:
        qs = np.quantile(zvals, np.linspace(0, 1, Z_SAMPLES))
        zvals = sorted_unique(np.concatenate([qs, [np.inf]]))
    bg = np.repeat(bvals, len(zvals))
    zg = np.tile(zvals, len(bvals))
    lo = np.ones((len(bg), p), dtype=np.int64)
    hi = np.empty((len(bg), p), dtype=np.int64)
    for i in range(p):
        # τ ≤ B and memory are prefixes of n; Z ≤ Zb is an interval (Z is convex in n)
        top = np.minimum(np.searchsorted(tau[i], bg, side="right"), caps[i])
        k = int(np.argmin(zt[i]))
        left, right = zt[i, : k + 1], zt[i, k:]
        zlo = np.searchsorted(-left, -zg, side="left")
        zhi = np.where(zlo <= k, k + np.searchsorted(right, zg, side="right") - 1, -1)
        lo[:, i] = zlo + 1
        hi[:, i] = np.minimum(top, zhi + 1)
    good = (lo <= hi).all(axis=1) & (lo.sum(axis=1) <= num_layers) & (hi.sum(axis=1) >= num_layers)
    if not good.any():
        return None
    lo, hi = lo[good], hi[good]
    # fill cheapest slope first: a prefix of the slope order up to the remaining layer count
    order = np.argsort(s.a, kind="stable")
    room = (hi - lo)[:, order]
    rest = num_layers - lo.sum(axis=1)
    before = np.cumsum(room, axis=1) - room
    take = np.clip(rest[:, None] - before, 0, room)
    n = lo.copy()
    n[:, order] += take
    nf = n.astype(np.float64)
    t = s.a * nf + s.b
    z = np.maximum(0.0, s.e0 + s.e1 * nf) + (s.z0 + s.z1 * nf)
    pipe = w_sum * t.sum(axis=1) + w_max * t.max(axis=1)
    tails = z.max(axis=1)
    cost = pipe + tails
    best = int(np.argmin(cost))
    return Split(float(cost[best]), tuple(int(x) for x in n[best]), float(pipe[best]), float(tails[best]))
