"""Stage coefficients of a candidate as numpy arrays, priced exactly as `planner.cost.estimate` would.

The links each stage sees follow from the device placement (`build.py`): inside a class, stage s of
a segment occupies class devices [s·dp·tp, (s+1)·dp·tp), replica-major, so a stage's DP ring stays
on one node iff dp·tp ≤ devices per node, and stages s and s+1 share a node iff their blocks do.

A pipeline is built segment by segment, not stage by stage: the stages of one class segment share
one stage context except at the pipeline's ends, so each segment costs a few memoised coefficient
lookups and numpy fills whatever its stage count (a 64-stage pipeline is as cheap as a 2-stage one).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from planner.cost import formulas as F
from planner.cost.compute import stack_time_delta_s
from planner.cost.devices import Link, cross_node_link, ring_ranks_per_node
from planner.cost.estimate import gpu_device
from planner.cost.memory import RUNTIME, Stack
from planner.cost.overlap import MESHPLAN, Runtime
from planner.cost.runtimes import Pricing
from planner.cost.stage import (
    NO_OVERHEADS,
    LocalTerms,
    StageCoeffs,
    StageContext,
    boundary_p2p_s,
    local_terms,
    stage_coeffs,
)
from planner.measure.calibrate import Calibration
from planner.measure.profiles import ProfileTable
from planner.search.classes import DeviceClass
from planner.search.inner import StageArrays
from planner.specs import flops
from planner.specs.model import ModelSpec


@dataclass
class Pricer:
    """Shared, memoised access to stage coefficients for one search."""

    model: ModelSpec
    classes: list[DeviceClass]
    profiles: ProfileTable
    dtype: str
    seq: int
    calib: Calibration | None = None  # measured corrections (planner.measure.calibrate), as estimate() takes them
    # the stack every stage runs (fp8, recompute_every on recomputed stages, sequence parallelism
    # where tp > 1), as estimate's stage_stack gives it for the plans this search builds
    stack: Stack = RUNTIME
    # the Pricer of the pass that differs from this one only in recompute_every = 1 (same model, classes,
    # profiles, dtype, seq, calibration): a stage without recompute is priced the same under any
    # recompute_every (local_terms reads it only through f_rec and the mixed kept bytes, both for
    # recomputed stages; stack_time_delta_s compares stacks field by field with the stack's own
    # recompute_every; tests/planner/test_search_bounds.py checks the equality), so such stages
    # are asked of `plain` and priced once for both passes
    plain: Pricer | None = None
    # the runtime every stage is priced under (planner.cost.runtimes.Pricing: its kernels on the
    # devices' roofline, its overlap, its fixed costs as stage terms); None: meshplan's plain estimate.
    # The stack above carries its attention, loss, dropout and sequence parallelism (search.stack_variants)
    pricing: Pricing | None = None

    def __post_init__(self) -> None:
        self.memo: dict[StageContext, StageCoeffs] = {}
        self.ctx_memo: dict[tuple, StageCoeffs] = {}
        self.local_memo: dict[tuple, LocalTerms] = {}
        self.p2p_memo: dict[tuple, float] = {}
        self.inflight_memo: dict[tuple, np.ndarray] = {}
        self.row_memo: dict[int, tuple[float, ...]] = {}  # by id: every StageCoeffs lives in a memo here
        self.layout_memo: dict[tuple, Layout] = {}
        self.segment_memo: dict[tuple, SegmentRows] = {}
        self.room_memo: dict[tuple, np.ndarray] = {}
        self.dplink_memo: dict[tuple, Link] = {}
        # links by id (an int hashes in nanoseconds, a Link dataclass in microseconds); every link
        # keyed so is kept here, so its id is never reused by another object
        self.link_keep: dict[int, Link] = {}
        self.link_intern: dict[Link, Link] = {}
        # per class, looked up once: every stage of every candidate needs them (each is a catalog lookup)
        self.capacity_bytes = [c.memory_bytes for c in self.classes]
        measured = self.calib.runtime_reserve_bytes if self.calib is not None else None  # as estimate takes it
        self.reserve_bytes = [F.runtime_reserve_bytes(c.kind, measured) for c in self.classes]
        self.kinds = [c.kind for c in self.classes]
        self.intra = [c.intra for c in self.classes]
        self.inter = [c.inter for c in self.classes]
        self.memory_bw = [c.spec.memory_bandwidth_bytes_per_s for c in self.classes]
        pc = self.pricing
        self.runtime: Runtime = pc.overlap if pc is not None else MESHPLAN
        self.overheads = pc.overheads if pc is not None else NO_OVERHEADS
        kernels = pc.kernels if pc is not None else None
        self.devices = [gpu_device(c.spec, self.dtype, kernels) for c in self.classes]  # as estimate prices them
        self.keep_memo: dict[str, list[float] | None] = {}
        self.stacks = {False: replace(self.stack, sequence_parallel=False), True: self.stack}  # by tp > 1
        if self.plain is not None:
            pl = self.plain
            assert (pl.model, pl.profiles, pl.dtype, pl.seq, pl.calib, pl.pricing) == (self.model, self.profiles,
                    self.dtype, self.seq, self.calib, self.pricing) and pl.classes is self.classes, "plain: the same search's pass"  # fmt: skip
            assert replace(pl.stack, recompute_every=1) == replace(self.stack, recompute_every=1), "plain: its stack"
            # one Link object per ring for both passes, so the memos keyed by link id hit across them
            self.link_keep, self.link_intern, self.dplink_memo = pl.link_keep, pl.link_intern, pl.dplink_memo

    def coeffs(self, ctx: StageContext) -> StageCoeffs:
        co = self.memo.get(ctx)
        if co is None:
            co = self.memo[ctx] = stage_coeffs(ctx, self.model, self.profiles)
        return co

    def stage(
        self, cls: int, tp: int, mbs: int, recompute: bool, first: bool, last: bool, pp: int, sharding: str, dp: int,
        dplink: Link,
    ) -> StageCoeffs:  # fmt: skip
        """Coefficients of a stage of class `cls`, memoised on a plain tuple (hashing a StageContext,
        with its links and calibration, costs more than the lookup it saves). The tuple holds only
        what the coefficients depend on (`stage_key`), so contexts that differ elsewhere share one."""
        # stage_key inlined (this lookup runs ~30,000 times a search): the ring by id, 0 when dp = 1
        # (then the class's own tp link, and cls is in the key); every id in a key was kept alive by
        # link_id when its entry was made, so no other object can carry it
        key = (cls, tp, mbs, recompute, first, last, (2 if pp > 1 else 1) if last else 1, sharding, dp,
               id(dplink) if dp > 1 else 0)  # fmt: skip
        co = self.ctx_memo.get(key)
        if co is None and not recompute and self.plain is not None:
            co = self.ctx_memo[key] = self.plain.stage(cls, tp, mbs, recompute, first, last, pp, sharding, dp, dplink)
        if co is None:
            pp_k, dplink_k = stage_key(self.intra[cls], last, pp, dp, dplink)
            if dp > 1:
                self.link_id(dplink)
            ctx = StageContext(
                kind=self.kinds[cls],
                dtype=self.dtype,
                mbs=mbs,
                seq=self.seq,
                tp=tp,
                recompute=recompute,
                first=first,
                last=last,
                pp=pp_k,
                sharding=sharding,
                dp=dp,
                inflight=0.0,
                memory_bandwidth_bytes_per_s=self.memory_bw[cls],
                tp_link=self.intra[cls],
                dp_link=dplink_k,
                next_link=None,
                next_tp=tp,
                calib=self.calib,
                stack=self.stacks[tp > 1],
                device=self.devices[cls],
                cp_link=self.intra[cls] if self.stack.cp > 1 else None,  # a cp group is inside a node
                runtime=self.runtime,
                overheads=self.overheads,
            )
            # the local terms (profile rows, compute, activations) are shared by every dp, sharding and
            # ring of the stage: ~300 distinct local keys against ~5,000 contexts at 1,024 GPUs
            lkey = key[:7]
            lt = self.local_memo.get(lkey)
            if lt is None:
                lt = self.local_memo[lkey] = local_terms(ctx, self.model, self.profiles)
            # the key fixes the context (the rest is this Pricer's), so no second memo on the context
            # itself: hashing a StageContext with its links and stack costs more than a miss saves
            co = self.ctx_memo[key] = stage_coeffs(ctx, self.model, self.profiles, lt)
        return co

    def local(self, cls: int, tp: int, mbs: int, recompute: bool, first: bool, last: bool, pp: int) -> LocalTerms:
        """`local_terms` of a stage of class `cls` (what its dp, sharding and ring leave alone), memoised
        on the key `stage` shares them under, so built from the very context `stage` builds (the pass's
        stack by tp, the class's roofline device): whichever of the two runs first decides the other's
        terms. The bounds call this first; built on the runtime's stack, it gave every stage priced
        after it all blocks recomputed (not one in k), no sequence parallelism and no GPU stack terms,
        so the search kept plans the estimate found over memory (gpt3-175b, 64 GPUs of four kinds)."""
        lkey = (cls, tp, mbs, recompute, first, last, (2 if pp > 1 else 1) if last else 1)
        lt = self.local_memo.get(lkey)
        if lt is None and not recompute and self.plain is not None:
            lt = self.local_memo[lkey] = self.plain.local(cls, tp, mbs, recompute, first, last, pp)
        if lt is None:
            ctx = StageContext(
                kind=self.kinds[cls], dtype=self.dtype, mbs=mbs, seq=self.seq, tp=tp, recompute=recompute,
                first=first, last=last, pp=min(pp, 2) if last else 1, sharding="none", dp=1, inflight=0.0,
                memory_bandwidth_bytes_per_s=self.memory_bw[cls], tp_link=self.intra[cls],
                dp_link=self.intra[cls], next_link=None, next_tp=tp, calib=self.calib,
                stack=self.stacks[tp > 1], device=self.devices[cls],
                cp_link=self.intra[cls] if self.stack.cp > 1 else None, runtime=self.runtime,
                overheads=self.overheads,
            )  # fmt: skip
            lt = self.local_memo[lkey] = local_terms(ctx, self.model, self.profiles)
        return lt

    def link_id(self, link: Link) -> int:
        """id(link) as a memo key: kept alive here, so no other object can take the id."""
        lid = id(link)
        if lid not in self.link_keep:
            self.link_keep[lid] = link
        return lid

    def intern(self, link: Link) -> Link:
        """One object per distinct link value, so memos keyed on `link_id` hit for equal links."""
        return self.link_intern.setdefault(link, link)

    def dp_link(self, cls: int, width: int, tp: int) -> Link:
        """`dp_link` of a one-class stage, memoised: the same Link object for the same ring."""
        key = (cls, width, tp)
        ln = self.dplink_memo.get(key)
        if ln is None:
            ln = self.dplink_memo[key] = self.intern(dp_link(self.classes[cls], width, False, [], tp, self.stack.cp))
        return ln

    def row(self, co: StageCoeffs) -> tuple[float, ...]:
        """The fields of a stage's coefficients the search's arrays hold, in `pipeline_arrays`' column order."""
        r = self.row_memo.get(id(co))
        if r is None:
            r = self.row_memo[id(co)] = (
                co.time_s_per_block,
                co.time_s_fixed,
                co.grad_sync_s_fixed,
                co.grad_sync_s_per_block,
                co.drain_s_fixed + co.optimizer_s_fixed,
                co.drain_s_per_block + co.optimizer_s_per_block,
                co.state_bytes_per_block,
                co.activation_bytes_per_block,
                co.state_bytes_fixed,
                co.activation_bytes_fixed,
                co.workspace_bytes,
            )
        return r

    def segment_rows(
        self, sg: SegmentSpec, mbs: int, recompute: bool, sharding: str, dp: int, first: bool, last: bool, pp: int
    ) -> SegmentRows:
        """`row` of each stage of segment `sg` and its coefficients, memoised: a segment's stages share
        one context but at the pipeline's ends (`first`/`last`: the segment holds that end), and a
        pipeline reads only whether pp > 1, so one entry serves every pipeline holding the segment
        at the same place (~5,000 pipelines a search, far fewer distinct segments)."""
        key = (sg.cls, sg.tp, sg.stages, id(sg.dplink) if dp > 1 else 0, mbs, recompute, sharding, dp, first, last,
               pp > 1)  # fmt: skip
        out = self.segment_memo.get(key)
        if out is None and not recompute and self.plain is not None:
            out = self.segment_memo[key] = self.plain.segment_rows(sg, mbs, recompute, sharding, dp, first, last, pp)
        if out is None:
            args, rest = (sg.cls, sg.tp, mbs, recompute), (pp, sharding, dp, sg.dplink)
            mid = self.stage(*args, False, False, *rest)
            cos = [mid] * sg.stages
            if first:
                cos[0] = self.stage(*args, True, pp == 1, *rest)
            if last and pp > 1:
                cos[-1] = self.stage(*args, False, True, *rest)
            # three distinct rows at most (mid, first, last), gathered per stage
            where = np.zeros(sg.stages, dtype=np.int64)
            if first:
                where[0] = 1
            if last and pp > 1:
                where[-1] = 2
            rows = np.array([self.row(mid), self.row(cos[0]), self.row(cos[-1])])[where]
            out = self.segment_memo[key] = SegmentRows(rows, cos)
            if dp > 1:
                self.link_id(sg.dplink)  # the key holds its id: keep it alive
        return out

    def pipeline_rows(
        self, segs: list[SegmentSpec], mbs: int, recompute: bool, sharding: str, dp: int
    ) -> tuple[np.ndarray, list[StageCoeffs]]:
        """`segment_rows` of every segment of a pipeline, stacked: [pp, 11] rows and pp coefficients."""
        pp = sum(sg.stages for sg in segs)
        n = len(segs)
        parts = [
            self.segment_rows(sg, mbs, recompute, sharding, dp, j == 0, j == n - 1, pp) for j, sg in enumerate(segs)
        ]
        if n == 1:
            return parts[0].rows, parts[0].coeffs
        return np.concatenate([x.rows for x in parts]), [co for x in parts for co in x.coeffs]

    def room_bytes(self, segs: list[SegmentSpec]) -> np.ndarray:
        """Per stage, (capacity + 1 − reserve) / (1 + fragmentation): the bytes an allocation may
        take before its peak's floor exceeds the device (pipeline_arrays' memory test solved for it)."""
        key = tuple((sg.cls, sg.stages) for sg in segs)
        out = self.room_memo.get(key)
        if out is None:
            frag = 1 + F.FRAGMENTATION_FRACTION
            per = [(self.capacity_bytes[sg.cls] + 1 - self.reserve_bytes[sg.cls]) / frag for sg in segs]
            out = self.room_memo[key] = np.repeat(per, [sg.stages for sg in segs])
        return out

    def layout(self, mbs: int, segs: list[SegmentSpec], num_layers: int) -> Layout:
        """What a pipeline's arrays share across shardings and recompute settings: p2p per stage, the
        stages' memory capacities and reserves, the block counts n = 1 … L − pp + 1."""
        key = (mbs, num_layers, tuple((sg.cls, sg.tp, sg.stages, sg.width) for sg in segs))
        out = self.layout_memo.get(key)
        if out is None:
            pp = sum(sg.stages for sg in segs)
            cls = np.repeat([sg.cls for sg in segs], [sg.stages for sg in segs])
            out = self.layout_memo[key] = Layout(
                segment_p2p(self, mbs, segs),
                np.array(self.capacity_bytes, dtype=np.float64)[cls],
                np.array(self.reserve_bytes, dtype=np.float64)[cls],
                np.arange(1, max(1, num_layers - pp + 1) + 1, dtype=np.float64),
            )
        return out

    def stack_delta_s(self, cls: int, tp: int, mbs: int) -> tuple[float, float]:
        """(forward, backward) seconds this search's stack adds to a block of class `cls` beyond its
        profile row (compute.stack_time_delta_s, as local_terms adds it; 0 on measured CPU rows)."""
        dev = self.devices[cls]
        if dev is None:
            return 0.0, 0.0
        return stack_time_delta_s(self.model, mbs, self.seq, tp, self.dtype, dev, self.stacks[tp > 1])

    def hidden_bytes(self, mbs: int) -> float:
        """A block's input on one rank: seq / cp tokens under context parallelism."""
        return flops.block_input_bytes(self.model, mbs, self.seq, self.dtype) / self.stack.cp

    def p2p_s(self, mbs: int, a: StageSpec, b: StageSpec) -> float:
        """boundary_p2p_s from stage a to stage b, memoised: the link depends only on the two classes
        and, inside one class, on whether the stages share a node (next_link), so that is the key."""
        g = self.classes[a.cls].devices_per_node
        same = a.cls == b.cls and (a.local * a.width) // g == (b.local * b.width) // g
        return self.p2p_pair(mbs, a.cls, a.tp, b.cls, b.tp, same)

    def p2p_pair(self, mbs: int, ca: int, tpa: int, cb: int, tpb: int, same_node: bool) -> float:
        key = (mbs, ca, tpa, cb, tpb, same_node)
        v = self.p2p_memo.get(key)
        if v is None:
            if ca != cb:
                ln = cross_node_link([self.classes[ca].spec, self.classes[cb].spec])
            else:
                ln = self.intra[ca] if same_node else self.inter[ca]
            v = self.p2p_memo[key] = boundary_p2p_s(
                self.hidden_bytes(mbs), tpa, tpb, ln, self.calib, self.runtime, self.seq
            )
        return v

    def p2p_keep(self, schedule: str) -> list[float] | None:
        """Per class, the fraction of a boundary p2p its sending stage leaves exposed under `schedule`
        (stage_coeffs: 1 − the runtime's p2p overlap for the schedule, none hidden on CPU ranks), or
        None when the runtime hides none (p2p_s prices the whole transfer)."""
        if schedule not in self.keep_memo:
            rts = [(self.runtime.on_cpu() if k == "cpu" else self.runtime).for_schedule(schedule) for k in self.kinds]
            keep = [1.0 - rt.p2p_overlap for rt in rts]
            self.keep_memo[schedule] = None if all(k == 1.0 for k in keep) else keep
        return self.keep_memo[schedule]

    def inflight(self, schedule: str, pp: int, m: int, v: int = 1) -> np.ndarray:
        """formulas.inflight_microbatches for every stage (rank) of a pipeline, memoised."""
        key = (schedule, pp, m, v)
        out = self.inflight_memo.get(key)
        if out is None:
            out = self.inflight_memo[key] = np.array(
                [F.inflight_microbatches(schedule, i, pp, m, v) for i in range(pp)], dtype=np.float64
            )
        return out


def stage_key(tp_link: Link, last: bool, pp: int, dp: int, dplink: Link) -> tuple[int, Link]:
    """The (pp, dp link) a stage's coefficients see: `stage_coeffs` reads pp only on the last stage,
    and there only whether pp > 1 (a tied embedding's head copy), and the dp link only when dp > 1
    (gradient sync, ZeRO gathers). Mapping the rest to one value gives equal coefficients from
    fewer distinct contexts (tests/planner/test_search_bounds.py checks the equality)."""
    return (min(pp, 2) if last else 1), (dplink if dp > 1 else tp_link)


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One pipeline stage of a candidate, before its block count is known."""

    cls: int
    tp: int
    local: int  # index of the stage inside its class segment
    width: int  # devices per stage in this class (replicas of this class × tp)


@dataclass(frozen=True, slots=True)
class Layout:
    p2p: np.ndarray
    cap: np.ndarray
    reserve: np.ndarray
    ns: np.ndarray


class SegmentRows(NamedTuple):
    """A segment's stages as `Pricer.row` rows ([stages, 11]) and their coefficients."""

    rows: np.ndarray
    coeffs: list[StageCoeffs]


@dataclass(frozen=True, slots=True)
class SegmentSpec:
    """`stages` consecutive pipeline stages on one class, each `width` devices wide (replicas × tp)."""

    cls: int
    tp: int
    stages: int
    width: int
    dplink: Link


def dp_link(c: DeviceClass, width: int, multi_class: bool, specs: list, tp: int = 1, cp: int = 1) -> Link:
    """The data-parallel ring of a stage `width` devices wide (dp replicas × tp): intra-node, or across
    nodes with as many NIC shares per node as the ring has ranks there (cost.devices.DeviceIndex.ring_link).
    On cp-folded classes (planner.search.cp) the ring holds each replica's cp ranks, all on its node:
    cp times the ranks per node, on the physical node."""
    if multi_class:
        return cross_node_link(specs)
    g = c.devices_per_node
    if width <= g:
        return c.intra
    nodes = [off // g for off in range(0, width, tp)]  # tp rank 0 of each replica
    spec = c.spec if cp == 1 else c.spec.model_copy(update={"num_devices": g * cp})
    return cross_node_link([spec], ranks_per_node=ring_ranks_per_node(nodes) * cp, num_nodes=len(set(nodes)))


def next_link(a: DeviceClass, sa: StageSpec, b: DeviceClass, sb: StageSpec) -> Link:
    if a.index != b.index:
        return cross_node_link([a.spec, b.spec])
    g = a.devices_per_node
    same = (sa.local * sa.width) // g == (sb.local * sb.width) // g
    return a.intra if same else a.inter


def segment_p2p(pr: Pricer, mbs: int, segs: list[SegmentSpec]) -> np.ndarray:
    """Per stage, boundary_p2p_s to the next stage (0 for the last), as Pricer.p2p_s prices each pair."""
    out = []
    for j, sg in enumerate(segs):
        g = pr.classes[sg.cls].devices_per_node
        s = np.arange(sg.stages)
        same = (s * sg.width) // g == ((s + 1) * sg.width) // g
        inside = np.where(
            same,
            pr.p2p_pair(mbs, sg.cls, sg.tp, sg.cls, sg.tp, True),
            pr.p2p_pair(mbs, sg.cls, sg.tp, sg.cls, sg.tp, False),
        )
        if j + 1 < len(segs):
            nx = segs[j + 1]
            # stage 0 of the next segment is local index 0: on one class it shares a node iff the
            # boundary does (never across classes)
            inside[-1] = pr.p2p_s(
                mbs, StageSpec(sg.cls, sg.tp, sg.stages - 1, sg.width), StageSpec(nx.cls, nx.tp, 0, nx.width)
            )
        else:
            inside[-1] = 0.0
        out.append(inside)
    return np.concatenate(out)


def pipeline_arrays(
    pr: Pricer,
    segs: list[SegmentSpec],
    num_layers: int,
    *,
    mbs: int,
    schedule: str,
    sharding: str,
    dp: int,
    recompute: bool,
    m: int,
) -> tuple[StageArrays, list[StageCoeffs]]:
    """Arrays for the inner solver (every stage with or without full recompute; `mix_prefix` combines
    the two) plus each stage's base coefficients (no p2p, no activations)."""
    v, coeffs = pr.pipeline_rows(segs, mbs, recompute, sharding, dp)
    fixed = pr.layout(mbs, segs, num_layers)
    peak = _peak_bytes(v, fixed, pr.inflight(schedule, sum(sg.stages for sg in segs), m))
    mem_ok = np.floor(peak) <= fixed.cap[:, None]
    p2p, keep = fixed.p2p, pr.p2p_keep(schedule)
    if keep is not None:  # what the runtime hides of each boundary (Pricer.p2p_keep)
        p2p = p2p * np.repeat([keep[sg.cls] for sg in segs], [sg.stages for sg in segs])
    arrays = StageArrays(v[:, 0], v[:, 1] + p2p, v[:, 2], v[:, 3], v[:, 4], v[:, 5], mem_ok)
    return arrays, coeffs


def _peak_bytes(v: np.ndarray, fixed: Layout, k: np.ndarray) -> np.ndarray:
    """[pp, n] peak bytes of each stage holding n = 1 … blocks, as estimate's memory_per_stage prices
    them (formulas.peak_memory_bytes of state + k in-flight micro-batches' activations + workspace)."""
    mem_a = v[:, 6] + k * v[:, 7]
    mem_b = v[:, 8] + k * v[:, 9]
    return ((mem_a[:, None] * fixed.ns[None, :] + mem_b[:, None]) + v[:, 10, None]) * (
        1 + F.FRAGMENTATION_FRACTION
    ) + fixed.reserve[:, None]


def pipeline_peak_bytes(
    pr: Pricer, segs: list[SegmentSpec], num_layers: int, *, mbs: int, schedule: str, sharding: str, dp: int,
    recompute: bool, m: int,
) -> np.ndarray:  # fmt: skip
    """The search's memory figure: [pp, n] peak bytes of each stage at n blocks, the figure
    `pipeline_arrays` tests against each device's capacity (tests compare it with estimate's)."""
    v, _ = pr.pipeline_rows(segs, mbs, recompute, sharding, dp)
    fixed = pr.layout(mbs, segs, num_layers)
    return _peak_bytes(v, fixed, pr.inflight(schedule, sum(sg.stages for sg in segs), m))


def mix_prefix(none: StageArrays, full: StageArrays, k: int) -> StageArrays:
    """Arrays with full recompute on stages [0, k) — stage terms are independent, so rows combine."""
    if k == 0:
        return none
    if k >= len(none.a):
        return full

    def pick(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        out = x.copy()
        out[:k] = y[:k]
        return out

    return StageArrays(
        pick(none.a, full.a),
        pick(none.b, full.b),
        pick(none.e0, full.e0),
        pick(none.e1, full.e1),
        pick(none.z0, full.z0),
        pick(none.z1, full.z1),
        pick(none.mem_ok, full.mem_ok),
    )
