"""Lower bounds on the step time of sets of candidates, and the recompute dominance rule.

Every bound is derived from the coefficients the inner solvers price (`arrays.Pricer`, hence
`planner.cost.stage.stage_coeffs`), never from constants, so it stays a lower bound under any cost
terms. The pipeline cost of a split is w_sum·Σ τ_i + w_max·max τ_i + max Z_i with τ_i = a_i·n_i + b_i
(inner.py); the bounds below use only that structure, Σ n_i = L, n_i ≥ 1, and that the constant
terms b_i and tails Z_i are not negative (times):

    Σ τ_i ≥ L·min a + Σ b                           (every block on the cheapest slope)
    max τ_i ≥ (L + Σ b/a) / Σ 1/a                   (stages paced to X hold n_i ≤ (X − b_i)/a_i blocks)
    max Z_i ≥ max_i min_{1 ≤ n ≤ nmax} Z_i(n)       (each stage holds some n; Z is linear + a hinge)

Kind-pure replicas (replicas.py) finish at T = max_r S_c + (m_r − 1)·X_c with Σ m_r = M: replica r
takes m_r ≤ 1 + (T − S_c)/X_c micro-batches, so M ≤ Σ_c n_c·(1 + (T − S_c)/X_c), i.e.
T ≥ (M − Σ n_c + Σ n_c·S_c/X_c) / Σ n_c/X_c, and T ≥ max S_c (every replica runs ≥ 1); both terms
grow with S_c and X_c, so lower bounds of those give a lower bound of T.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from planner.cost import formulas as F
from planner.cost import nccl as N
from planner.cost.overlap import MAX_HIDE_FRACTION
from planner.measure.calibrate import Calibration
from planner.measure.ops import BenchOp
from planner.measure.profiles import LayerProfile, ProfileKey, ProfileTable
from planner.search.arrays import Pricer, SegmentSpec
from planner.search.inner import StageArrays
from planner.search.space import SearchSpace, Segment, Shape


def tail_bound(s: StageArrays) -> float:
    """max_i of a lower bound of Z_i(n) = max(0, e0 + e1·n) + z0 + z1·n over 1 ≤ n ≤ nmax."""
    nmax = s.mem_ok.shape[1]
    e = np.maximum(0.0, s.e0 + np.minimum(s.e1, s.e1 * nmax))
    return float((e + s.z0 + np.minimum(s.z1, s.z1 * nmax)).max())


def split_bound(s: StageArrays, num_layers: int, w_sum: float, w_max: float) -> float:
    """A lower bound on solve_split(s, num_layers, …, w_sum, w_max)'s cost (module docstring)."""
    inv = 1.0 / s.a
    total = num_layers * float(s.a.min()) + float(s.b.sum())
    worst = (num_layers + float((s.b * inv).sum())) / float(inv.sum())
    return w_sum * total + w_max * worst + tail_bound(s)


def pool_bound(S: list[float], X: list[float], counts: list[int], total_mb: int) -> float:
    """Lower bound on the makespan of replicas with per-class S_c ≥ S[c], X_c ≥ X[c] (module docstring)."""
    rate = sum(n / x for n, x in zip(counts, X, strict=True))
    work = total_mb - sum(counts) + sum(n * s / x for n, s, x in zip(counts, S, X, strict=True))
    return max(max(S), work / rate)


class ShapeTable(NamedTuple):
    """A shape list as padded arrays, for `Bounds.shape_bounds` (one numpy pass instead of one Python
    call per shape × micro-batch size): row s holds shape s's (class, tp) combination ids and their
    weights (a pipeline segment's stages, a replica group's replicas; padding: id `len(combos)`, 0)."""

    shapes: list[Shape]
    combos: list[tuple[int, int]]
    idx: np.ndarray  # [S, K] int
    weight: np.ndarray  # [S, K] float
    pipe: np.ndarray  # [S] bool: pipeline family
    pp: np.ndarray  # [S] int
    dp: np.ndarray  # [S] int


def shape_table(shapes: list[Shape]) -> ShapeTable:
    ids: dict[tuple[int, int], int] = {}
    # flat (row, column, combination id, weight) entries, scattered into the padded arrays at once
    # (element-wise numpy stores cost more than building the list: ~100,000 shapes at four kinds)
    at_row: list[int] = []
    at_col: list[int] = []
    cid: list[int] = []
    wts: list[int] = []
    pipe: list[bool] = []
    pps: list[int] = []
    for i, sh in enumerate(shapes):
        if sh.family == "pipeline":
            pairs = [(g.cls, g.tp, g.stages) for g in sh.segments]
            pipe.append(True)
        else:
            tp = sh.segments[0].tp
            pairs = [(c, tp, n) for c, n in sh.groups]
            pipe.append(False)
        pps.append(sum(g.stages for g in sh.segments))  # Shape.pp
        for j, (c, t, w) in enumerate(pairs):
            at_row.append(i)
            at_col.append(j)
            cid.append(ids.setdefault((c, t), len(ids)))
            wts.append(w)
    K = max(at_col, default=0) + 1
    idx = np.full((len(shapes), K), len(ids), dtype=np.int64)
    weight = np.zeros((len(shapes), K))
    idx[at_row, at_col] = cid
    weight[at_row, at_col] = wts
    return ShapeTable(
        shapes,
        list(ids),
        idx,
        weight,
        np.array(pipe, dtype=bool),
        np.array(pps, dtype=np.int64),
        np.array([sh.dp for sh in shapes], dtype=np.int64),
    )


class Bounds:
    """Bounds at three depths of the search tree: a shape (profile rows only), a shape × micro-batch ×
    sharding (stage slopes a), and a candidate (its stage arrays, `split_bound`)."""

    def __init__(
        self,
        pr: Pricer,
        table: ProfileTable,
        space: SearchSpace,
        *,
        seq: int,
        dtype: str,
        calibration: Calibration | None,
        global_batch: int,
    ) -> None:
        self.pr, self.table, self.space, self.seq, self.dtype = pr, table, space, seq, dtype
        self.calib, self.gb, self.L = calibration, global_batch, pr.model.num_layers
        self.v_max = max(space.virtual_stages, default=1)
        self.interleaved = "interleaved-1f1b" in space.schedules and self.v_max > 1
        self.recs = (False, True) if space.recompute else (False,)
        self._floor: dict[tuple[int, int, int], float] = {}
        self._shape: dict[tuple, float] = {}
        self._dom: dict[tuple[int, int, int], bool] = {}
        # keyed on Pricer.link_id(dplink)
        self._slope: dict[tuple, float] = {}
        self._local: dict[tuple, tuple[np.ndarray, float]] = {}
        self._mem: dict[tuple, tuple[np.ndarray, ...]] = {}
        self._end: dict[tuple, tuple[float, ...]] = {}
        self._local_l: dict[tuple, tuple[list, float]] = {}
        self._infl: dict[tuple, list[float]] = {}
        self._rooms: dict[tuple, list[float]] = {}
        # shape_bounds drops shapes whose memory cannot hold the model in any setting, as
        # optimistic / optimistic_replicas would find when expanded (a node with no child): not
        # under a calibration with FSDP overheads (those bounds cut nothing there), and pipelines
        # only with recompute in the space (without it their interleaved nodes are pushed anyway)
        primary = "1f1b" in space.schedules or "gpipe" in space.schedules
        fsdp = calibration is not None and calibration.fsdp is not None
        self.drop_replicas = primary and not fsdp
        self.drop_pipelines = self.drop_replicas and space.recompute

    def a_floor(self, cls: int, tp: int, mbs: int) -> float:
        """A lower bound on a stage's per-block time: the cheaper profile row + TP all-reduces, no ZeRO-3."""
        key = (cls, tp, mbs)
        if key not in self._floor:
            c, calib, pr = self.pr.classes[cls], self.calib, self.pr
            fit = calib.fit(BenchOp.ALL_REDUCE) if calib is not None else None
            if fit is not None:  # as stage_coeffs prices them
                ar = fit.time_s(pr.hidden_bytes(mbs), tp)
            else:
                ar = F.ring_allreduce_s(pr.hidden_bytes(mbs), tp, c.intra.bandwidth_bytes_per_s, c.intra.latency_s)
                if N.uses_nccl(c.intra):  # GPU ranks: NCCL's own choice, which can beat the α–β ring
                    ar = min(ar, N.collective_s(BenchOp.ALL_REDUCE, pr.hidden_bytes(mbs), tp, c.intra))
            rows = [self.table.lookup(ProfileKey(c.kind, "block", mbs, self.seq, tp, r, self.dtype)) for r in self.recs]

            def slow(r: LayerProfile) -> float:  # as stage_coeffs slows a block row
                return calib.slowdown(r.tp_comm_included) if calib is not None else 1.0

            # a row timed on a real tp group holds its all-reduces already (stage_coeffs adds none);
            # the stack's kernels (fp8, sequence parallel) change a GPU block's time, a recomputed
            # block runs the forward's change twice (local_terms); a stage mixing the two rows every
            # k-th block costs at least the cheaper one
            df, db = pr.stack_delta_s(cls, tp, mbs)
            cp = pr.stack.cp  # a cp rank runs 1/cp of the block (local_terms), its K/V exchange ≥ 0 on top
            rt = pr.runtime.on_cpu() if c.kind == "cpu" else pr.runtime  # as stage_coeffs keeps TP
            if rt.tp_overlap:
                ar *= 1 - rt.tp_overlap
            # (a runtime's host issue floor, planner.cost.stage.Overheads, only raises the block's time)
            self._floor[key] = min(
                slow(r) * (r.train_s + df + db + (df if r.key.recompute else 0.0)) / cp
                + (0.0 if r.tp_comm_included else 4 * ar)
                for r in rows
            )
        return self._floor[key]

    def recompute_dominated(self, shape: Shape, mbs: int) -> bool:
        """True when full recompute cannot pay off without memory pressure: it adds at least as much
        time per block as it lengthens the backward that hides the gradient sync (no runtime hides more than all of it:
        planner.cost.overlap.MAX_HIDE_FRACTION)."""
        out = True
        for g in (
            shape.segments
            if shape.family == "pipeline"
            else [Segment(c, 0, shape.segments[0].tp) for c, _ in shape.groups]
        ):
            key = (g.cls, g.tp, mbs)
            if key not in self._dom:
                kind = self.pr.classes[g.cls].kind
                plain, rec = (
                    self.table.lookup(ProfileKey(kind, "block", mbs, self.seq, g.tp, r, self.dtype))
                    for r in (False, True)
                )
                df, db = self.pr.stack_delta_s(g.cls, g.tp, mbs)  # recompute runs the stack's forward again
                d_train, d_bwd = rec.train_s - plain.train_s + df, rec.backward_s - plain.backward_s + df
                issue = self.pr.overheads.issue_s if self.pr.devices[g.cls] is not None else 0.0
                if issue:
                    # a GPU block's time floored by its kernels' issue (planner.cost.stage.Overheads), one
                    # block in k recomputed (local_terms): not linear in 1/k, so compared at the pass's k
                    f, base = 1.0 / self.pr.stack.recompute_every, plain.train_s + df + db
                    d_train = max(base + f * d_train, (3 + f) * issue) - max(base, 3 * issue)
                    d_bwd *= f
                self._dom[key] = d_train >= 0 and d_train >= MAX_HIDE_FRACTION * d_bwd
            out = out and self._dom[key]
        return out

    def shape(self, shape: Shape, mbs: int) -> float:
        """A cheap lower bound on any candidate of the shape: compute and TP traffic only. It does not
        depend on the order of a pipeline's class segments, so every ordering of the same segments
        shares one computation (the number of orderings is what grows with device kinds)."""
        key = (
            shape.family,
            tuple(sorted((g.cls, g.tp, g.stages) for g in shape.segments)),
            shape.dp,
            shape.groups,
            mbs,
        )
        out = self._shape.get(key)
        if out is None:
            out = self._shape[key] = self._shape_of(shape, mbs)
        return out

    def _shape_of(self, shape: Shape, mbs: int) -> float:
        L, total_mb = self.L, self.gb // mbs
        if shape.family == "pipeline":
            a = [(self.a_floor(g.cls, g.tp, mbs), g.stages) for g in shape.segments]
            m0 = math.ceil(total_mb / shape.dp)
            # pipeline term w·Σ τ + (m − w)·max τ: w = 1 for 1F1B/GPipe, 1/v for interleaved (the smaller),
            # where interleaving applies (explore.Explorer._interleaved_ok: equal m per replica, m % pp = 0)
            vs = [v for v in self.space.virtual_stages if v >= 2 and L >= shape.pp * v]
            inter = self.interleaved and shape.pp >= 2 and bool(vs) and total_mb % shape.dp == 0
            w = 1.0 / max(vs) if inter and (total_mb // shape.dp) % shape.pp == 0 else 1.0
            return w * L * min(x for x, _ in a) + (m0 - w) * L / sum(k / x for x, k in a)
        # each replica's bottleneck stage holds ≥ L/pp blocks: the pool drains M micro-batches no faster
        # and its first micro-batch passes all pp stages: T ≥ (M + dp·(pp − 1)) / Σ n_c·pp/(L·a_c)
        rate = sum(n * shape.pp / (L * self.a_floor(c, shape.segments[0].tp, mbs)) for c, n in shape.groups)
        return (total_mb + shape.dp * (shape.pp - 1)) / rate

    def shape_bounds(self, tab: ShapeTable, mbs: int) -> np.ndarray:
        """`shape` of every shape of `tab` at one micro-batch size, in one numpy pass (the same
        formulas; +inf where the shape needs more replicas than the batch has micro-batches)."""
        L, total_mb = self.L, self.gb // mbs
        if not tab.shapes:
            return np.zeros(0)
        A = np.array([self.a_floor(c, t, mbs) for c, t in tab.combos] + [math.inf])
        a = A[tab.idx]
        inv = (tab.weight / a).sum(axis=1)  # Σ stages/a (pipelines), Σ replicas/a (replicas)
        amin = a.min(axis=1)
        pp, dp = tab.pp, tab.dp
        m0 = -(-total_mb // dp)
        vmax = {
            p: max((v for v in self.space.virtual_stages if v >= 2 and L >= p * v), default=0) for p in set(pp.tolist())
        }
        vm = np.array([vmax[p] for p in pp.tolist()], dtype=np.float64)
        inter = (pp >= 2) & (vm > 0) & (total_mb % dp == 0) & ((total_mb // dp) % pp == 0) & self.interleaved
        w = np.where(inter, 1.0 / np.where(vm > 0, vm, 1.0), 1.0)
        with np.errstate(divide="ignore"):
            pipe = w * L * amin + (m0 - w) * L / inv
            repl = (total_mb + dp * (pp - 1)) / (pp / L * inv)
        out = np.where(tab.pipe, pipe, repl)
        if self.drop_pipelines or self.drop_replicas:
            out = np.where(self._may_fit(tab, mbs), out, math.inf)
        return np.where(total_mb >= dp, out, math.inf)

    def _may_fit(self, tab: ShapeTable, mbs: int) -> np.ndarray:
        """Per shape of `tab`, False when no stage split fits memory even under caps no smaller than
        the ones `optimistic` (pipelines) and `optimistic_replicas` (replicas) compute, so expanding
        it would push nothing. Each stage's cap from its class's interior local row (an end stage
        adds embedding / head parameters, bytes and workspace, all ≥ 0) at one micro-batch in
        flight (every schedule's in-flight count is ≥ 1) and the smallest bytes per parameter of
        every sharding at the shape's dp × cp; a pipeline at optimistic's recompute row, a replica
        at the larger cap of its recompute settings (as optimistic_replicas takes)."""
        pr, L = self.pr, self.L
        frag = 1 + F.FRAGMENTATION_FRACTION
        recs = [self.recs[-1]] + ([self.recs[0]] if len(self.recs) > 1 else [])  # [0]: the pipelines' row
        cols = [
            [pr.local(c, t, mbs, r, False, False, 2) for c, t in tab.combos] for r in recs
        ]  # per recompute setting, per combination
        room = np.array([(pr.capacity_bytes[c] + 1 - pr.reserve_bytes[c]) / frag for c, _ in tab.combos] + [0.0])
        dps = sorted(set(tab.dp.tolist()))
        cp = pr.stack.cp
        bpp_of = {d: min(F.state_bytes_per_param(self.dtype, s, d * cp) for s in self.space.shardings) for d in dps}
        bpp = np.array([bpp_of[d] for d in tab.dp.tolist()])[:, None]
        nmax = np.maximum(1, L - tab.pp + 1).astype(np.float64)[:, None]
        caps = []
        for lts in cols:
            ppb, pf, apb, af, ws = (
                np.array([getattr(lt, f) for lt in lts] + [0.0])[tab.idx]
                for f in ("num_params_per_block", "num_params_fixed", "activation_bytes_per_block",
                          "activation_bytes_fixed", "workspace_bytes")
            )  # fmt: skip
            mem_a = ppb * bpp + apb
            left = (room[tab.idx] - ws) - (pf * bpp + af)
            q = np.divide(left, mem_a, out=np.full(left.shape, np.inf), where=mem_a > 0)
            caps.append(np.minimum(np.maximum(np.floor(q) + 1, 0), nmax))
        used = tab.weight > 0
        pipe_cap = np.where(used, caps[0], np.inf)
        pipe_ok = (pipe_cap.min(axis=1) >= 1) & ((tab.weight * np.where(used, caps[0], 0.0)).sum(axis=1) >= L)
        joint = np.where(used, np.max(caps, axis=0), np.inf).min(axis=1)  # a replica's split fits every class
        repl_ok = (joint >= 1) & (tab.pp * joint >= L)
        ok = np.where(tab.pipe, pipe_ok | (not self.drop_pipelines), repl_ok | (not self.drop_replicas))
        return ok

    def slope(
        self, sg: SegmentSpec, first: bool, last: bool, pp: int, mbs: int, sharding: str, dp: int, interior: bool
    ) -> float:
        """The smallest per-block time a of the segment's stages, over both recompute settings: only the
        stage contexts the segment really has (its pipeline ends, its interior; an interleaved rank
        also runs interior chunks: `interior`), as pipeline_arrays and interleaved_arrays price them."""
        key = (sg.cls, sg.tp, sg.stages, self.pr.link_id(sg.dplink), first, last, pp, mbs, sharding, dp, interior)
        out = self._slope.get(key)
        if out is None:
            out = self._slope[key] = self._slope_of(sg, first, last, pp, mbs, sharding, dp, interior)
        return out

    def _slope_of(
        self, sg: SegmentSpec, first: bool, last: bool, pp: int, mbs: int, sharding: str, dp: int, interior: bool
    ) -> float:
        ends = []
        if first:
            ends.append((True, pp == 1))
        if last and pp > 1:
            ends.append((False, True))
        if sg.stages > len(ends) or interior:
            ends.append((False, False))
        pr = self.pr
        return min(
            pr.stage(sg.cls, sg.tp, mbs, r, f, la, pp, sharding, dp, sg.dplink).time_s_per_block
            for r in self.recs
            for f, la in ends
        )

    def pipeline(self, segs: list[SegmentSpec], m: int, w: float, mbs: int, sharding: str, dp: int) -> float:
        """w·L·min a + (m − w)·L / Σ stages/a over the segments' true slopes (b, tails ≥ 0 dropped)."""
        pp = sum(sg.stages for sg in segs)
        n = len(segs)
        a = [self.slope(sg, j == 0, j == n - 1, pp, mbs, sharding, dp, w < 1.0) for j, sg in enumerate(segs)]
        L = self.L
        return w * L * min(a) + (m - w) * L / sum(sg.stages / x for sg, x in zip(segs, a, strict=True))

    def capped_pipeline(
        self, segs: list[SegmentSpec], m: int, mbs: int, schedule: str, sharding: str, dp: int
    ) -> float:
        """A 1F1B/GPipe lower bound for every recompute prefix of a shape × mbs × sharding, before its
        arrays exist: `capped_row` over `pipeline_caps`. +inf when even those caps cannot hold L blocks."""
        parts = self.pipeline_caps(segs, m, mbs, schedule, sharding, dp)
        return math.inf if parts is None else capped_row(*parts[:3], self.L, 1.0, m - 1.0)

    def pipeline_caps(
        self, segs: list[SegmentSpec], m: int, mbs: int, schedule: str, sharding: str, dp: int, v: int = 1
    ) -> tuple[list[float], list[float], list[int], tuple | None] | None:
        """Per stage of a shape × mbs × sharding, (a, b, cap, per): the smaller a and b of its two recompute
        contexts (p2p ≥ 0 dropped) and a cap no smaller than its full-recompute cap (the loosest:
        `explore` skips a node whose full recompute does not fit), from pipeline_arrays' allocation
        formula solved for n and rounded up; `per` (None without recompute in the space): each
        setting's own (a, b) with recompute and without, and the caps without (prefix_row_bound).
        None when even those caps cannot hold L blocks. With
        schedule "interleaved-1f1b" and v chunks, per rank of the interleaved pipeline, n its total
        blocks: its stage j's row at the interleaved in-flight count (explore.Explorer._interleaved_node)."""
        pr, L = self.pr, self.L
        pp = sum(sg.stages for sg in segs)
        nmax = max(1, L - pp + 1)
        # the stages of a segment share one context but at the pipeline's ends (Pricer.segment_rows);
        # plain Python floats on these few stages (numpy's per-call cost is most of a node's bound)
        lo = pr.pipeline_rows(segs, mbs, self.recs[-1], sharding, dp)[0].tolist()
        k = self._inflight(schedule, pp, m, v)
        room = self._room(segs)
        # floor(peak(n)) ≤ capacity ⟺ n < room / mem_a; + 1 absorbs the rounding of this formula
        cap = _caps(room, [r[10] for r in lo], [r[6] + ki * r[7] for r, ki in zip(lo, k, strict=True)],
                    [r[8] + ki * r[9] for r, ki in zip(lo, k, strict=True)], nmax)  # fmt: skip
        if min(cap) < 1 or sum(cap) < L:
            return None  # as capped_row answers, before pricing the other recompute contexts
        if len(self.recs) == 1:
            return [r[0] for r in lo], [r[1] for r in lo], cap, None
        hi = pr.pipeline_rows(segs, mbs, self.recs[0], sharding, dp)[0].tolist()
        la, lb, ha, hb = [r[0] for r in lo], [r[1] for r in lo], [r[0] for r in hi], [r[1] for r in hi]
        a = [x if x <= y else y for x, y in zip(la, ha, strict=True)]  # np.minimum's pick (no NaN here)
        b = [x if x <= y else y for x, y in zip(lb, hb, strict=True)]
        # the no-recompute rows and caps, for bounds per recompute prefix (prefix_row_bound)
        cap_none = _caps(room, [r[10] for r in hi], [r[6] + ki * r[7] for r, ki in zip(hi, k, strict=True)],
                         [r[8] + ki * r[9] for r, ki in zip(hi, k, strict=True)], nmax)  # fmt: skip
        return a, b, cap, (la, lb, ha, hb, cap_none)

    def _inflight(self, schedule: str, pp: int, m: int, v: int = 1) -> list[float]:
        """Pricer.inflight as a list, memoised."""
        key = (schedule, pp, m, v)
        out = self._infl.get(key)
        if out is None:
            out = self._infl[key] = self.pr.inflight(schedule, pp, m, v).tolist()
        return out

    def _room(self, segs: list[SegmentSpec]) -> list[float]:
        """Pricer.room_bytes as a list, memoised."""
        key = tuple((sg.cls, sg.stages) for sg in segs)
        out = self._rooms.get(key)
        if out is None:
            out = self._rooms[key] = self.pr.room_bytes(segs).tolist()
        return out

    def optimistic(
        self,
        segs: list[SegmentSpec],
        m: int,
        mbs: int,
        schedule: str | None,
        shardings: list[str],
        dp: int,
        ws: list[float],
    ) -> tuple[float, list[float]]:
        """Lower bounds for every sharding of a pipeline shape × micro-batch size at once, before any
        stage's data-parallel terms are priced: (the `schedule`'s `capped_pipeline`, +inf when no
        sharding's memory holds L blocks; `pipeline` at each weight w of `ws`).

        Per stage, from its local terms only (Pricer.local): a ≥ the block's compute + exposed TP
        time and b ≥ the ends' (every sharding adds dp time ≥ 0 and p2p ≥ 0 to them), and its
        state bytes at the smallest bytes per parameter of `shardings` (ZeRO-3's working buffers
        ≥ 0 dropped), so every cap is at least the one `capped_pipeline` computes for any sharding;
        `capped_row` and the pipeline bound grow with a and b and shrink with the caps. A calibration
        with FSDP overheads can make a constant dp term negative: then (0, 0, …), which cuts nothing."""
        if self.calib is not None and self.calib.fsdp is not None:
            return 0.0, [0.0] * len(ws)
        pp = sum(sg.stages for sg in segs)
        n = len(segs)
        parts = [self._local_list(sg, mbs, j == 0, j == n - 1, pp) for j, sg in enumerate(segs)]
        rows = parts[0][0] if n == 1 else [r for rs, _ in parts for r in rs]
        slopes = [x for _, x in parts]
        L = self.L
        pipes = [
            w * L * min(slopes) + (m - w) * L / sum(sg.stages / x for sg, x in zip(segs, slopes, strict=True))
            for w in ws
        ]
        if schedule is None:
            return math.inf, pipes
        # ZeRO shards over every rank holding the parameters: dp × cp (planner.cost.stage._grad_ranks)
        bpp = min(F.state_bytes_per_param(self.dtype, s, dp * self.pr.stack.cp) for s in shardings)
        # plain Python floats on these few stages, as pipeline_caps
        k = self._inflight(schedule, pp, m)
        room, ws_b = self._room(segs), [r[6] for r in rows]
        nmax = max(1, L - pp + 1)
        cap = _caps(room, ws_b, [r[2] * bpp + ki * r[4] for r, ki in zip(rows, k, strict=True)],
                    [r[3] * bpp + ki * r[5] for r, ki in zip(rows, k, strict=True)], nmax)  # fmt: skip
        if min(cap) < 1 or sum(cap) < L:
            return math.inf, pipes
        a, b = [r[0] for r in rows], [r[1] for r in rows]
        if ws:
            # interleaved ranks at their own in-flight counts (explore.Explorer._interleaved_node says
            # why); rank 0's slope is its interior one: the first segment's smallest
            a_il = [min(a[0], slopes[0]), *a[1:]]
            out = []
            for p, w in zip(pipes, ws, strict=True):
                v = round(1.0 / w)
                kk = self._inflight("interleaved-1f1b", pp, m, v)
                c = _caps(room, ws_b, [r[2] * bpp + ki * r[4] for r, ki in zip(rows, kk, strict=True)],
                          [r[3] * bpp + ki * r[5] for r, ki in zip(rows, kk, strict=True)], nmax)  # fmt: skip
                out.append(max(p, interleaved_row(a_il, b, c, L, v, m)))
            pipes = out
        return capped_row(a, b, cap, L, 1.0, m - 1.0), pipes

    def optimistic_replicas(
        self, segs: list[SegmentSpec], counts: list[int], total_mb: int, mbs: int, shardings: list[str], dp: int
    ) -> float:
        """A lower bound for every sharding and recompute prefix of a kind-pure replica shape × mbs,
        before any dp context is priced: `capped_replica_bound` with each stage's a and b from its
        local terms (as `optimistic`), each cap the largest of its recompute settings at one
        micro-batch in flight and the smallest bytes per parameter of `shardings`, tails (≥ 0)
        dropped. +inf when no split fits every class even so."""
        if self.calib is not None and self.calib.fsdp is not None:
            return 0.0
        pp, L = segs[0].stages, self.L
        nmax = max(1, L - pp + 1)
        # ZeRO shards over every rank holding the parameters: dp × cp (planner.cost.stage._grad_ranks)
        bpp = min(F.state_bytes_per_param(self.dtype, s, dp * self.pr.stack.cp) for s in shardings)
        a, b, caps = [], [], []
        for sg in segs:
            rows, _ = self._local_rows(sg, mbs, True, True, pp)
            a.append(rows[:, 0])
            b.append(rows[:, 1])
            room = self.pr.room_bytes([sg])
            per_rec = []
            for r in self.recs:
                # one micro-batch in flight: mem = state + activations (formulas.inflight_microbatches ≥ 1)
                pa, act_a, pf, act_f, ws = self._replica_mem(sg.cls, sg.tp, mbs, r, pp)
                mem_a, mem_b = pa * bpp + act_a, pf * bpp + act_f
                left = (room - ws) - mem_b
                free = mem_a > 0
                q = np.divide(left, mem_a, out=np.full_like(left, float(nmax)), where=free)
                per_rec.append(np.where(free, np.clip(np.floor(q) + 1, 0, nmax), nmax))
            caps.append(np.max(per_rec, axis=0))
        cap = np.min(caps, axis=0)
        zero = np.zeros((len(segs), pp))
        A, B = np.array(a), np.array(b)
        total, worst, _, ok = capped_parts(A, B, zero, zero, zero, zero, np.broadcast_to(cap, A.shape), L)
        if not ok.all():
            return math.inf
        return pool_bound(list(total), list(worst), counts, total_mb)

    def local_slope(self, sg: SegmentSpec, mbs: int, first: bool, last: bool, pp: int) -> float:
        """A lower bound of every per-block time a of the segment's stages in any context (an interior
        one included), any sharding: its local terms' smallest (`_local_rows`); 0 under a calibration
        with FSDP overheads (`optimistic` says why)."""
        if self.calib is not None and self.calib.fsdp is not None:
            return 0.0
        return self._local_rows(sg, mbs, first, last, pp)[1]

    def _replica_mem(self, cls: int, tp: int, mbs: int, r: bool, pp: int) -> tuple[np.ndarray, ...]:
        """Per stage of a pp-stage replica of one class: (parameters per block, activation bytes per
        block, fixed parameters, fixed activation bytes, workspace) of its local terms, memoised."""
        key = (cls, tp, mbs, r, pp)
        out = self._mem.get(key)
        if out is None:
            lts = [self.pr.local(cls, tp, mbs, r, i == 0, i == pp - 1 or pp == 1, pp) for i in range(pp)]
            out = self._mem[key] = tuple(
                np.array([getattr(lt, f) for lt in lts])
                for f in (
                    "num_params_per_block",
                    "activation_bytes_per_block",
                    "num_params_fixed",
                    "activation_bytes_fixed",
                    "workspace_bytes",
                )
            )
        return out

    def _local_rows(self, sg: SegmentSpec, mbs: int, first: bool, last: bool, pp: int) -> tuple[np.ndarray, float]:
        """Per stage of a segment: [min a, min b over the recompute settings (compute + exposed TP),
        parameters per block, fixed parameters, kept activation bytes per block and fixed, workspace]
        at the loosest recompute setting; and the segment's smallest a over its stages and an interior
        stage (every context `slope` may read), memoised (`optimistic`)."""
        key = (sg.cls, sg.tp, sg.stages, mbs, first, last, pp > 1)
        out = self._local.get(key)
        if out is None:
            ends = [(False, False)] * sg.stages
            if first:
                ends[0] = (True, pp == 1)
            if last and pp > 1:
                ends[-1] = (False, True)
            vals = {e: self._end_row(sg.cls, sg.tp, mbs, *e, pp) for e in {*ends, (False, False)}}
            slope = min(vals[e][0] for e in vals)
            out = self._local[key] = (np.array([vals[e] for e in ends]), slope)
        return out

    def _local_list(self, sg: SegmentSpec, mbs: int, first: bool, last: bool, pp: int) -> tuple[list, float]:
        """`_local_rows` as a list of row tuples (the same floats), memoised."""
        key = (sg.cls, sg.tp, sg.stages, mbs, first, last, pp > 1)
        out = self._local_l.get(key)
        if out is None:
            rows, slope = self._local_rows(sg, mbs, first, last, pp)
            out = self._local_l[key] = ([tuple(r) for r in rows.tolist()], slope)
        return out

    def _end_row(self, cls: int, tp: int, mbs: int, first: bool, last: bool, pp: int) -> tuple[float, ...]:
        """`_local_row`, memoised on Pricer.local's key (pp matters only through a last stage's pp > 1):
        every segment length of a class × tp × mbs reads the same few rows."""
        key = (cls, tp, mbs, first, last, (2 if pp > 1 else 1) if last else 1)
        out = self._end.get(key)
        if out is None:
            out = self._end[key] = self._local_row(cls, tp, mbs, first, last, pp)
        return out

    def _local_row(self, cls: int, tp: int, mbs: int, first: bool, last: bool, pp: int) -> tuple[float, ...]:
        rt = self.pr.runtime.on_cpu() if self.pr.kinds[cls] == "cpu" else self.pr.runtime  # as Pricer's contexts
        keep = 1 - rt.tp_overlap if rt.tp_overlap else 1.0
        lts = [self.pr.local(cls, tp, mbs, r, first, last, pp) for r in self.recs]
        # as stage_coeffs books TP: (1 − overlap) of it when the runtime hides some
        a = min(lt.compute_s_per_block + (keep * lt.tp_comm_s_per_block if rt.tp_overlap else lt.tp_comm_s_per_block)
                for lt in lts)  # fmt: skip
        b = min(lt.compute_s_fixed + (keep * lt.tp_comm_s_fixed if rt.tp_overlap else lt.tp_comm_s_fixed) for lt in lts)
        lo = lts[-1]
        return (a, b, lo.num_params_per_block, lo.num_params_fixed, lo.activation_bytes_per_block,
                lo.activation_bytes_fixed, lo.workspace_bytes)  # fmt: skip

    def replicas(self, segs: list[SegmentSpec], counts: list[int], total_mb: int, mbs: int, sharding: str) -> float:
        """pool_bound with S_c ≥ L·a_c and X_c ≥ L·a_c/pp from each class's true slope."""
        pp, dp, L = segs[0].stages, sum(counts), self.L
        a = [self.slope(sg, True, True, pp, mbs, sharding, dp, False) for sg in segs]
        return pool_bound([L * x for x in a], [L * x / pp for x in a], counts, total_mb)


def _caps(room: list[float], ws: list[float], mem_a: list[float], mem_b: list[float], nmax: int) -> list[int]:
    """Per stage, the most blocks its allocation mem_a·n + mem_b + ws fits in `room`, + 1 (the rounding
    of that formula), within [0, nmax]; nmax where the allocation does not grow with n. The numpy
    expression clip(floor((room − ws − mem_b) / mem_a) + 1, 0, nmax) in plain Python floats."""
    out = []
    for r, w, ma, mb in zip(room, ws, mem_a, mem_b, strict=True):
        if not ma > 0:
            out.append(nmax)
            continue
        q = ((r - w) - mb) / ma
        if q >= nmax:  # inf included
            out.append(nmax)
        elif q < -1:  # -inf included
            out.append(0)
        else:
            out.append(min(max(math.floor(q) + 1, 0), nmax))
    return out


def capped_split_bound(s: StageArrays, num_layers: int, w_sum: float, w_max: float) -> float:
    """`split_bound` tightened by memory (`prefix_bounds` of one candidate); +inf when no split fits."""
    return float(prefix_bounds(s, s, [0], num_layers, w_sum, w_max)[0])


def prefix_bounds(
    none: StageArrays, full: StageArrays, ks: list[int], num_layers: int, w_sum: float, w_max: float
) -> np.ndarray:
    """Lower bounds on solve_split's cost for mix_prefix(none, full, k), every k in `ks` at once
    ([K, p] arrays); +inf where no split fits in memory.

    Stage i holds 1 ≤ n_i ≤ cap_i blocks (cap_i from mem_ok, a prefix of n). Σ τ is at least its
    cheapest-slope-first fill under the caps (exact for the sum alone). max τ ≥ the smallest X ≥ x0 =
    max τ_i(1) with f(X) = Σ_i min(cap_i, (X − b_i)/a_i) ≥ L: with the knees t_i = τ_i(cap_i) sorted,
    the first j stages are at their cap on [max(x0, t_{j−1}), t_j], where f is linear, so on the
    segment where f reaches L, X = (L − Σ_{i<j} cap_i + Σ_{i≥j} b_i/a_i) / Σ_{i≥j} 1/a_i.
    The tail is at least max_i min over 1 ≤ n ≤ cap_i of Z_i(n) (`tail_bound`)."""
    p = len(none.a)
    mask = np.arange(p)[None, :] < np.asarray(ks)[:, None]

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.where(mask, y[None, :], x[None, :])

    cap = mix(none.mem_ok.sum(axis=1).astype(np.float64), full.mem_ok.sum(axis=1).astype(np.float64))
    parts = (mix(none.a, full.a), mix(none.b, full.b), mix(none.e0, full.e0), mix(none.e1, full.e1))
    total, worst, tails, ok = capped_parts(*parts, mix(none.z0, full.z0), mix(none.z1, full.z1), cap, num_layers)
    return np.where(ok, w_sum * total + w_max * worst + tails, np.inf)


def capped_parts(
    a: np.ndarray,
    b: np.ndarray,
    e0: np.ndarray,
    e1: np.ndarray,
    z0: np.ndarray,
    z1: np.ndarray,
    cap: np.ndarray,
    num_layers: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row of [K, p] stage coefficients and caps: (lower bound on Σ τ, on max τ, on max Z, whether
    any split fits) — the three parts of `prefix_bounds`' docstring."""
    K, p = a.shape
    ok = (cap >= 1).all(axis=1) & (cap.sum(axis=1) >= num_layers)
    r = np.arange(K)[:, None]  # row index for gathering along axis 1 (take_along_axis, without its overhead)
    order = a.argsort(axis=1, kind="stable")
    room = (cap - 1.0)[r, order]
    take = np.clip((num_layers - p) - (room.cumsum(axis=1) - room), 0.0, room)
    total = a.sum(axis=1) + b.sum(axis=1) + (a[r, order] * take).sum(axis=1)
    x0 = (a + b).max(axis=1)
    knee = a * cap + b
    o = knee.argsort(axis=1, kind="stable")
    t, c, inv, binv = (x[r, o] for x in (knee, cap, 1.0 / a, b / a))
    zero = np.zeros((K, 1))
    capped = np.concatenate([zero, c.cumsum(axis=1)], axis=1)  # [K, p + 1]: Σ cap of the first j
    inv_left = np.concatenate([inv[:, ::-1].cumsum(axis=1)[:, ::-1], zero], axis=1)  # Σ 1/a of the rest
    binv_left = np.concatenate([binv[:, ::-1].cumsum(axis=1)[:, ::-1], zero], axis=1)
    right = np.concatenate([t, np.full((K, 1), np.inf)], axis=1)  # segment j ends at knee j
    with np.errstate(invalid="ignore"):
        f_right = capped + right * inv_left - binv_left
    f_right[:, p] = np.inf
    j0 = (t <= x0[:, None]).sum(axis=1)  # stages already at their cap at x0: segments before are empty
    seg = np.arange(p + 1)[None, :]
    j = np.argmax((seg >= j0[:, None]) & (f_right >= num_layers * (1 - 1e-12)), axis=1)
    rows = np.arange(K)
    left = np.maximum(x0, np.concatenate([np.full((K, 1), -np.inf), t], axis=1)[rows, j])
    il = inv_left[rows, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(il > 0, (num_layers - capped[rows, j] + binv_left[rows, j]) / il, left)
    worst = np.maximum(left, x)
    tails = (np.maximum(0.0, e0 + np.minimum(e1, e1 * cap)) + z0 + np.minimum(z1, z1 * cap)).max(axis=1)
    return total, worst, tails, ok


def capped_replica_bound(
    arrs: list[StageArrays], loose: list[StageArrays], counts: list[int], num_layers: int, total_mb: int
) -> float:
    """A lower bound on solve_replicas' cost: every class runs the same split, which must fit each
    class's memory at one micro-batch in flight (`loose`: the largest caps any share allows), so
    n_i ≤ min_c cap_c,i; per class S_c, X_c and the tail are bounded as in `prefix_bounds` under
    those joint caps, then the pool (`pool_bound`). +inf when no split fits every class."""
    cap = np.min([s.mem_ok.sum(axis=1) for s in loose], axis=0).astype(np.float64)
    rows = [np.stack([getattr(s, f) for s in arrs]) for f in ("a", "b", "e0", "e1", "z0", "z1")]
    total, worst, tails, ok = capped_parts(*rows, np.broadcast_to(cap, rows[0].shape), num_layers)
    if not ok.all():
        return math.inf
    return pool_bound(list(total), list(worst), counts, total_mb) + float(tails.min())


def capped_replica_bounds(
    none: list[StageArrays],
    full: list[StageArrays],
    loose_none: list[StageArrays],
    loose_full: list[StageArrays],
    ks: list[int],
    counts: list[int],
    num_layers: int,
    total_mb: int,
) -> list[float]:
    """`capped_replica_bound` of every recompute prefix k in `ks` at once: class c's arrays are
    mix_prefix(none[c], full[c], k), its loose ones (one micro-batch in flight) mix_prefix(loose_none[c],
    loose_full[c], k); one [K·G, p] `capped_parts` call instead of K calls on [G, p]."""
    G, p, K = len(none), len(none[0].a), len(ks)
    mask = np.arange(p)[None, :] < np.asarray(ks)[:, None]

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.where(mask, y[None, :], x[None, :])  # [K, p]

    cap = np.min(
        [mix(n.mem_ok.sum(axis=1), f.mem_ok.sum(axis=1)) for n, f in zip(loose_none, loose_full, strict=True)], axis=0
    ).astype(np.float64)
    rows = [
        np.stack([mix(getattr(n, f), getattr(fl, f)) for n, fl in zip(none, full, strict=True)], axis=1).reshape(
            K * G, p
        )
        for f in ("a", "b", "e0", "e1", "z0", "z1")
    ]
    caps = np.broadcast_to(cap[:, None, :], (K, G, p)).reshape(K * G, p)
    total, worst, tails, ok = (x.reshape(K, G) for x in capped_parts(*rows, caps, num_layers))
    out = []
    for i in range(K):
        if not ok[i].all():
            out.append(math.inf)
        else:
            out.append(pool_bound(list(total[i]), list(worst[i]), counts, total_mb) + float(tails[i].min()))
    return out


def interleaved_row(a: list[float], b: list[float], cap: list[int], num_layers: int, v: int, m: int) -> float:
    """`capped_row` of an interleaved pipeline over ranks holding n_j ≥ v blocks each (one per chunk),
    shifted as interleave.py does (n' = n_j − (v − 1) ≥ 1), at the weights (1/v, m − 1/v)."""
    s = v - 1
    pp = len(a)
    return capped_row(
        a,
        [bi + ai * s for ai, bi in zip(a, b, strict=True)],
        [c - s for c in cap],
        num_layers - pp * s,
        1.0 / v,
        m - 1.0 / v,
    )


def prefix_row_bound(parts: tuple, ks: list[int], num_layers: int, v: int, m: int, a0: float | None = None) -> float:
    """The smallest `capped_row` (v = 1) or `interleaved_row` over recompute prefixes `ks` (stages
    [0, k) with full recompute, the rest without, each with its own a, b and cap) from
    Bounds.pipeline_caps' `parts`: tighter than mixing the cheaper a with the looser cap per stage.
    `a0`: a smaller slope for stage 0 (an interleaved rank 0's interior one)."""
    a, b, cap, per = parts
    row = capped_row if v == 1 else (lambda a, b, c, L, *_: interleaved_row(a, b, c, L, v, m))
    if per is None:
        a = a if a0 is None else [min(a[0], a0), *a[1:]]
        return row(a, b, cap, num_layers, 1.0, m - 1.0)
    af, bf, an, bn, cn = per
    out = math.inf
    for k in ks:
        ak = af[:k] + an[k:]
        if a0 is not None:
            ak[0] = min(ak[0], a0)
        out = min(out, row(ak, bf[:k] + bn[k:], cap[:k] + cn[k:], num_layers, 1.0, m - 1.0))
    return out


def capped_row(a: list[float], b: list[float], cap: list[int], num_layers: int, w_sum: float, w_max: float) -> float:
    """`prefix_bounds` of one candidate without its tail, in plain Python (cheaper than numpy for the
    few stages of a node bound): Σ τ filled cheapest slope first under the caps, and the smallest
    bottleneck X ≥ max τ_i(1) the caps allow, walking the knees τ_i(cap_i) in order. +inf if none fits."""
    p = len(a)
    if min(cap) < 1 or sum(cap) < num_layers:
        return math.inf
    total, rest = sum(a) + sum(b), num_layers - p
    for i in sorted(range(p), key=a.__getitem__):
        if rest <= 0:
            break
        t = min(rest, cap[i] - 1)
        total += a[i] * t
        rest -= t
    x = max(ai + bi for ai, bi in zip(a, b, strict=True))
    if min(a) <= 0.0:  # a free layer (a measured slope of 0 on CPU ranks): the knee walk divides by a
        return w_sum * total + w_max * x  # still a lower bound: every stage holds at least one layer
    capped, inv, binv = 0.0, sum(1.0 / ai for ai in a), sum(bi / ai for ai, bi in zip(a, b, strict=True))
    for i in sorted(range(p), key=lambda i: a[i] * cap[i] + b[i]):
        knee = a[i] * cap[i] + b[i]
        if knee > x:
            # f is linear on [x, knee] (stage i still free, at its cap at the knee): the crossing is there
            if capped + knee * inv - binv >= num_layers * (1 - 1e-12):
                x = max(x, (num_layers - capped + binv) / inv)
                break
            x = knee
        capped, inv, binv = capped + cap[i], inv - 1.0 / a[i], binv - b[i] / a[i]
    # no break: every stage is at its cap at x, where f = Σ cap ≥ L (the crossing is x or before)
    return w_sum * total + w_max * x
