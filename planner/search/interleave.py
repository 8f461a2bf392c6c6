"""Interleaved 1F1B in the search: v model chunks per rank, priced at the rank level.

Under Megatron's interleaved schedule rank j runs stage entries j, j + pp, …, j + (v−1)·pp. Its
time, memory and tail are sums over its chunks, and every chunk's block coefficients are the same,
so a rank with n_j blocks costs a·n_j + Σ b_chunk whatever the chunk sizes: only the per-rank
totals matter (each ≥ v, one block per chunk). Shifting n_j = n' + v − 1 turns that into the plain
split problem, solved with the pipeline weights (1/v, m − 1/v) of formulas.interleaved_time_s.
"""

from __future__ import annotations

import numpy as np

from planner.cost import formulas as F
from planner.cost.devices import Link
from planner.cost.stage import StageCoeffs
from planner.search.arrays import Pricer, StageSpec
from planner.search.inner import StageArrays


def interleaved_arrays(
    pr: Pricer,
    ranks: list[StageSpec],
    dplink: list[Link],
    num_layers: int,
    *,
    mbs: int,
    sharding: str,
    dp: int,
    recompute: bool,
    m: int,
    v: int,
) -> StageArrays:
    """Rank-level arrays for n' = n_j − (v − 1) ≥ 1 blocks per rank, every rank with or without full
    recompute (rows are independent: `arrays.mix_prefix` combines the two)."""
    pp = len(ranks)
    entries = pp * v
    nmax = max(1, num_layers - pp * v + 1)
    ns = np.arange(1, nmax + 1, dtype=np.float64)
    kks = pr.inflight("interleaved-1f1b", pp, m, v)
    rows = []
    keep = pr.p2p_keep("interleaved-1f1b")  # what the runtime hides of each boundary
    mids: dict[tuple, StageCoeffs] = {}
    for j, st in enumerate(ranks):
        kk = float(kks[j])
        b = e0 = z0 = mem_b = 0.0
        ws = 0.0
        co = None
        # a rank's chunks differ only in first/last, and each but the pipeline's last sends to the
        # same next rank (j + 1 mod pp): three lookups per rank, whatever v
        args = (st.cls, st.tp, mbs, recompute)
        rest = (pp, sharding, dp, dplink[j])
        mkey = (st.cls, st.tp, id(dplink[j]))  # the ranks of a class segment share it (dplink outlives the loop)
        mid = mids.get(mkey)
        if mid is None:
            mid = mids[mkey] = pr.stage(*args, False, False, *rest)
        first = pr.stage(*args, True, entries == 1, *rest) if j == 0 else mid
        last = pr.stage(*args, False, True, *rest) if (entries - 1) % pp == j and entries > 1 else mid
        p2p_next = pr.p2p_s(mbs, st, ranks[(j + 1) % pp])
        if keep is not None:
            p2p_next *= keep[st.cls]
        for e in range(j, entries, pp):
            co = first if e == 0 else (last if e == entries - 1 else mid)
            p2p = p2p_next if e + 1 < entries else 0.0
            b += co.time_s_fixed + p2p
            e0 += co.grad_sync_s_fixed
            z0 += co.drain_s_fixed + co.optimizer_s_fixed
            mem_b += co.state_bytes_fixed + kk * co.activation_bytes_fixed
            ws = max(ws, co.workspace_bytes)
        assert co is not None
        if pr.overheads.microbatch_s:
            b -= (v - 1) * pr.overheads.microbatch_s  # paid once a rank, not once a chunk (stage.Overheads)
        a, mem_a, shift = co.time_s_per_block, co.state_bytes_per_block + kk * co.activation_bytes_per_block, v - 1
        rows.append(
            (
                a,
                b + a * shift,
                e0 + co.grad_sync_s_per_block * shift,
                co.grad_sync_s_per_block,
                z0 + (co.drain_s_per_block + co.optimizer_s_per_block) * shift,
                co.drain_s_per_block + co.optimizer_s_per_block,
                mem_a,
                mem_b + mem_a * shift,
                ws,
                pr.capacity_bytes[st.cls],
                pr.reserve_bytes[st.cls],
            )
        )
    a, b, e0, e1, z0, z1, mem_a, mem_b, ws, cap, reserve = (np.array(x) for x in zip(*rows, strict=True))
    peak = ((mem_a[:, None] * ns[None, :] + mem_b[:, None]) + ws[:, None]) * (1 + F.FRAGMENTATION_FRACTION)
    mem_ok = np.floor(peak + reserve[:, None]) <= cap[:, None]
    return StageArrays(a, b, e0, e1, z0, z1, mem_ok)


def chunk_layers(rank_layers: tuple[int, ...], v: int) -> tuple[int, ...]:
    """Entry-level layer counts (entry e = k·pp + j) splitting each rank's blocks evenly over its chunks."""
    pp = len(rank_layers)
    out = [0] * (pp * v)
    for j, n in enumerate(rank_layers):
        base, extra = divmod(n, v)
        for k in range(v):
            out[k * pp + j] = base + (1 if k < extra else 0)
    return tuple(out)
