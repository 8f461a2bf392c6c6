"""Stage coefficients of a candidate as numpy arrays, priced exactly as `planner.cost.estimate` would.

The links each stage sees follow from the device placement (`build.py`): inside a class, stage s of
a segment occupies class devices [s·dp·tp, (s+1)·dp·tp), replica-major, so a stage's DP ring stays
on one node iff dp·tp ≤ devices per node, and stages s and s+1 share a node iff their blocks do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost import formulas as F
from planner.cost.devices import Link, cross_node_link
from planner.cost.stage import StageCoeffs, StageContext, boundary_p2p_s, stage_coeffs
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

    def __post_init__(self) -> None:
        self.memo: dict[StageContext, StageCoeffs] = {}

    def coeffs(self, ctx: StageContext) -> StageCoeffs:
        co = self.memo.get(ctx)
        if co is None:
            co = self.memo[ctx] = stage_coeffs(ctx, self.model, self.profiles)
        return co

    def hidden_bytes(self, mbs: int) -> float:
        return flops.block_input_bytes(self.model, mbs, self.seq, self.dtype)


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One pipeline stage of a candidate, before its block count is known."""

    cls: int
    tp: int
    local: int  # index of the stage inside its class segment
    width: int  # devices per stage in this class (replicas of this class × tp)


def dp_link(c: DeviceClass, width: int, multi_class: bool, specs: list) -> Link:
    if multi_class:
        return cross_node_link(specs)
    return c.intra if width <= c.devices_per_node else c.inter


def next_link(a: DeviceClass, sa: StageSpec, b: DeviceClass, sb: StageSpec) -> Link:
    if a.index != b.index:
        return cross_node_link([a.spec, b.spec])
    g = a.devices_per_node
    same = (sa.local * sa.width) // g == (sb.local * sb.width) // g
    return a.intra if same else a.inter


def stage_arrays(
    pr: Pricer,
    stages: list[StageSpec],
    num_layers: int,
    *,
    mbs: int,
    schedule: str,
    sharding: str,
    dp: int,
    recompute_prefix: int,
    m: int,
    dplink: list[Link],
) -> tuple[StageArrays, list[StageCoeffs]]:
    """Arrays for the inner solver plus each stage's base coefficients (no p2p, no activations)."""
    pp = len(stages)
    nmax = max(1, num_layers - pp + 1)
    ns = np.arange(1, nmax + 1, dtype=np.float64)
    hidden = pr.hidden_bytes(mbs)
    cols: list[tuple] = []
    bases: list[StageCoeffs] = []
    kinds = []
    prev_ctx = None
    for i, st in enumerate(stages):
        c = pr.classes[st.cls]
        # interior stages of a segment share one context; only first/last/recompute/class change it
        key = (st.cls, st.tp, i < recompute_prefix, i == 0, i == pp - 1, dplink[i])
        if prev_ctx is None or prev_ctx[0] != key:
            ctx = StageContext(
                kind=c.kind,
                dtype=pr.dtype,
                mbs=mbs,
                seq=pr.seq,
                tp=st.tp,
                recompute=i < recompute_prefix,
                first=i == 0,
                last=i == pp - 1,
                pp=pp,
                sharding=sharding,
                dp=dp,
                inflight=0.0,
                memory_bandwidth_bytes_per_s=c.spec.memory_bandwidth_bytes_per_s,
                tp_link=c.intra,
                dp_link=dplink[i],
                next_link=None,
                next_tp=st.tp,
                calib=pr.calib,
            )
            prev_ctx = (key, pr.coeffs(ctx))
        co = prev_ctx[1]
        bases.append(co)
        p2p = 0.0
        if i + 1 < pp:
            nx = stages[i + 1]
            ln = next_link(c, st, pr.classes[nx.cls], nx)
            p2p = boundary_p2p_s(hidden, st.tp, nx.tp, ln, pr.calib)
        k = F.inflight_microbatches(schedule, i, pp, m)
        cols.append(
            (
                co.a,
                co.b + p2p,
                co.e0,
                co.e1,
                co.g0 + co.o0,
                co.g1 + co.o1,
                co.state_a + k * co.act_a,
                co.state_b + k * co.act_b,
                co.workspace_bytes,
                c.memory_bytes,
                F.runtime_reserve_bytes(c.kind),
            )
        )
        kinds.append(c.kind)
    a, b, e0, e1, z0, z1, mem_a, mem_b, ws, cap, reserve = (np.array(x) for x in zip(*cols, strict=True))
    peak = ((mem_a[:, None] * ns[None, :] + mem_b[:, None]) + ws[:, None]) * (1 + F.FRAGMENTATION_FRACTION) + reserve[
        :, None
    ]
    mem_ok = np.floor(peak) <= cap[:, None]
    return StageArrays(a, b, e0, e1, z0, z1, mem_ok), bases


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
