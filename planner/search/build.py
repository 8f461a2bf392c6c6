"""Turn a solved candidate into a Plan with real device ids (generated from class id ranges)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.search.classes import DeviceClass
from planner.search.cp import Folding
from planner.search.space import Shape
from planner.specs.plan import Plan, Provenance, StagePlan


@dataclass(frozen=True, slots=True)
class Choice:
    """Everything besides the shape that a candidate fixed."""

    mbs: int
    schedule: str
    sharding: str
    recompute_prefix: int
    layers: tuple[int, ...]  # per stage entry (pp × virtual_stages of them)
    microbatches: tuple[int, ...]  # per replica
    virtual_stages: int = 1
    recompute_every: int = 1  # on the recomputed stages (StagePlan.recompute_every)
    sequence_parallel: bool = False  # on every stage with tp > 1
    fp8: bool = False  # Plan.fp8
    cp: int = 1  # StagePlan.cp on every stage (the shape is over cp-folded classes: planner.search.cp)


def stage_device_ids(classes: list[DeviceClass], shape: Shape) -> list[tuple[int, ...]]:
    """Device ids per stage, replica-major: class segment stage s uses class devices [s·w, (s+1)·w)."""
    out: list[tuple[int, ...]] = []
    if shape.family == "pipeline":
        for seg in shape.segments:
            w = shape.dp * seg.tp
            out.extend(tuple(classes[seg.cls].ids(s * w, w)) for s in range(seg.stages))
        return out
    tp = shape.segments[0].tp
    for s in range(shape.pp):
        ids: list[int] = []
        for c, n in shape.groups:
            ids.extend(classes[c].ids(s * n * tp, n * tp))
        out.append(tuple(ids))
    return out


def stage_tps(shape: Shape) -> list[int]:
    if shape.family == "pipeline":
        return [seg.tp for seg in shape.segments for _ in range(seg.stages)]
    return [shape.segments[0].tp] * shape.pp


def build_plan(
    classes: list[DeviceClass],
    shape: Shape,
    choice: Choice,
    *,
    model: str,
    cluster: str,
    seq: int,
    dtype: str,
    provenance: Provenance,
    folding: Folding | None = None,
) -> Plan:
    """The plan of a solved candidate; with `folding`, `classes` are its folded classes and each
    stage's ids are expanded to the physical dp × cp × tp devices (planner.search.cp)."""
    ids = stage_device_ids(classes, shape)
    tps = stage_tps(shape)
    cp = folding.cp if folding is not None else 1
    if folding is not None:
        ids = [folding.expand_stage_ids(x, tps[j], shape.dp) for j, x in enumerate(ids)]
    pp = len(ids)
    stages, start = [], 0
    for e, n in enumerate(choice.layers):
        j = e % pp  # interleaved: stage entry e runs on rank e mod pp
        stages.append(
            StagePlan(
                layer_start=start,
                layer_end=start + n,
                device_ids=ids[j],
                tp=tps[j],
                dp=shape.dp,
                recompute="full" if j < choice.recompute_prefix else "none",
                sharding=choice.sharding,  # type: ignore[arg-type]
                recompute_every=choice.recompute_every if j < choice.recompute_prefix else 1,
                sequence_parallel=choice.sequence_parallel and tps[j] > 1,
                cp=cp,
            )
        )
        start += n
    shares = tuple(k * choice.mbs for k in choice.microbatches)
    return Plan(
        model=model,
        cluster=cluster,
        global_batch_size=sum(shares),
        seq_len=seq,
        micro_batch_size=choice.mbs,
        schedule=choice.schedule,
        virtual_stages=choice.virtual_stages,
        dtype=dtype,
        fp8=choice.fp8,
        stages=tuple(stages),  # type: ignore[arg-type]
        batch_shares=shares,
        provenance=provenance,
    )


def balanced_microbatches(total: int, dp: int) -> tuple[int, ...]:
    base, extra = divmod(total, dp)
    return tuple(base + (1 if r < extra else 0) for r in range(dp))
