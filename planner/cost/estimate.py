"""Price a Plan: predicted step time, its breakdown, throughput, MFU and memory per stage.

step = max over replicas r of the pipeline time T_r (formulas.pipeline_time_s, or
interleaved_time_s) + the slowest stage's tail (exposed gradient sync, ZeRO all-gather, Adam step).
Per-stage terms come from `stage.stage_coeffs`, evaluated at the stage's block count; the breakdown
is taken on the critical replica so that compute + bubble + p2p + TP + ZeRO-3 gathers add up to T_r
and dp_comm + optimizer add up to the tail. Calibrated CPU ranks outnumbering their cores stretch
each steady-state pipeline slot to one micro-batch's CPU work on all ranks over the cores, and the
pipelined part and the optimizer step to their CPU work over the cores (processor sharing,
planner.measure.calibrate); the stretch is booked as compute and optimizer time.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from planner.cost import formulas as F
from planner.cost.completion import ProfileNeed, complete_profiles
from planner.cost.compute import Device, KernelEfficiency, compute_peak_flop_per_s
from planner.cost.devices import DeviceIndex, Link, intra_link
from planner.cost.fitted import DEFAULT_KERNELS
from planner.cost.memory import Stack
from planner.cost.overlap import MESHPLAN, Runtime
from planner.cost.stage import NO_OVERHEADS, Overheads, StageCoeffs, StageContext, stage_coeffs
from planner.errors import MeshplanError
from planner.measure.calibrate import Calibration
from planner.measure.profiles import ProfileTable
from planner.runtime import num_slices, problem_notes, slice_size
from planner.specs import flops
from planner.specs.cluster import ClusterSpec, NodeSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import CostBreakdown, Plan, StagePlan, check_plan_against

COST_MODEL_VERSION = "meshplan-cost-1"
GIB = 2**30


def plan_profile_needs(plan: Plan) -> set[ProfileNeed]:
    """Profile keys the plan prices with: each stage's block at its replicas' micro-batch (a slice of it
    where stages differ in dp); a stage recomputing every k-th block (k > 1) needs both rows."""
    out = set()
    for i, s in enumerate(plan.stages):
        full, mbs = s.recompute == "full", slice_size(plan, i % plan.pp)
        out.add(ProfileNeed(mbs, plan.seq_len, s.tp, full, plan.dtype))
        if full and s.recompute_every > 1:
            out.add(ProfileNeed(mbs, plan.seq_len, s.tp, False, plan.dtype))
    return out


def gpu_device(spec: NodeSpec, dtype: str, kernels: KernelEfficiency | None) -> Device | None:
    """A GPU node group's roofline figures (None for CPU ranks, whose profiles are measured)."""
    if spec.device == "cpu":
        return None
    gpu = spec.gpu
    arch = gpu.architecture if gpu else None
    sms = gpu.num_sms if gpu else None
    return Device(
        compute_peak_flop_per_s(spec.peak_flop_per_s(dtype), gpu.sustained_gemm_flop_per_s if gpu else None, dtype),
        spec.memory_bandwidth_bytes_per_s,
        sms,
        arch,
        kernels or DEFAULT_KERNELS,
        spec.peak_fp8_flop_per_s,
    )


def stage_stack(plan: Plan, stage: StagePlan) -> Stack:
    """The stack options of one stage (planner.cost.memory.Stack)."""
    return Stack(
        attention=plan.attention,
        loss=plan.loss,
        dropout=plan.dropout,
        sequence_parallel=stage.sequence_parallel,
        selective=stage.recompute == "selective",
        recompute_every=stage.recompute_every,
        fp8=plan.fp8,
        cp=stage.cp,
    )


def check_plan_fits_model(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> None:
    """Model/cluster checks a Plan cannot make alone; each failure names the field."""
    check_plan_against(plan, model.num_layers, cluster.num_devices)
    if plan.fp8:
        used = {d for s in plan.stages for d in s.device_ids}
        groups = {dev.group for dev in cluster.devices() if dev.id in used}
        no_fp8 = sorted({cluster.nodes[g].device_kind for g in groups if cluster.nodes[g].peak_fp8_flop_per_s is None})
        if no_fp8:
            raise MeshplanError(
                "fp8",
                True,
                f"{', '.join(no_fp8)} has no fp8 tensor cores (catalog, or device_peak_fp8_flop_per_s in the "
                "cluster file); set fp8=false or plan on Hopper / Ada / MI300 devices",
            )
    for i, s in enumerate(plan.stages):
        if model.num_heads % s.tp:
            raise MeshplanError(f"stages[{i}].tp", s.tp, f"must divide model.num_heads={model.num_heads}")
        if s.tp > model.kv_heads and s.tp % model.kv_heads:
            raise MeshplanError(
                f"stages[{i}].tp", s.tp, f"must divide or be a multiple of num_kv_heads={model.kv_heads}"
            )


class _Place(NamedTuple):
    """Where stage i of pipeline replica r runs: its first replica's devices, the groups of all its
    replicas' devices, the next stage and its first device, and the cheap key of replicas that price alike."""

    devs: tuple[int, ...]
    groups: list
    nxt: StagePlan | None
    b0: int
    key: tuple


def _place(plan: Plan, idx: DeviceIndex, i: int, r: int, fast: _Fast | None = None) -> _Place:
    """Replicas on the same groups with the same node relations price identically: this keys them.
    `fast`: the plan's pp, slices per stage and device → group table (`_fast`), for a caller that
    places every stage of every replica (price_stages: a 16,384-GPU plan's 100,000 placements)."""
    f = fast or _fast(plan, idx)
    stages, pp, s, gof, gidx = plan.stages, f.pp, plan.stages[i], f.group_of, f.group_index
    q = f.slices[i % pp]  # runtime.pipeline_replicas: replicas r·q … (r + 1)·q − 1 of the stage
    # replicas r·q … (r + 1)·q − 1 (StagePlan.replica_devices) are one run of the stage's device ids
    w, ids = s.tp * s.cp, s.device_ids
    flat = ids[r * q * w : (r + 1) * q * w]
    devs = flat[:w]
    # the groups of every device, each once, in the order their first devices come
    seen: dict[int, object] = {}
    for d in flat:
        g = gidx[d]
        if g not in seen:
            seen[g] = gof[d]
    ginfo = list(seen.values())

    def node(d: int) -> int:  # DeviceIndex.node
        g = gof[d]
        return g.first_node + (d - g.first_id) // g.spec.num_devices

    same_node = (w == 1) or len({node(d) for d in devs}) == 1
    nxt = stages[i + 1] if i + 1 < len(stages) else None
    nkey, b0 = None, devs[0]
    if nxt is not None:
        b0 = nxt.replica_devices(r * f.slices[(i + 1) % pp])[0]
        nkey = (node(devs[0]) == node(b0), gidx[devs[0]], gidx[b0])
    key = (i, tuple(sorted(seen)), same_node, nkey, plan.num_microbatches(r))
    return _Place(devs, ginfo, nxt, b0, key)


class _Fast(NamedTuple):
    pp: int
    slices: list[int]  # runtime.num_slices of each pipeline rank
    group_of: list  # DeviceIndex.group of every device id
    group_index: list[int]  # its index


def _fast(plan: Plan, idx: DeviceIndex) -> _Fast:
    pp = plan.pp
    group_of = [g for g in idx.groups for _ in range(g.spec.count * g.spec.num_devices)]
    return _Fast(pp, [num_slices(plan, k) for k in range(pp)], group_of, [g.index for g in group_of])


def _stage_context(
    plan: Plan,
    idx: DeviceIndex,
    i: int,
    r: int,
    place: _Place,
    spec: NodeSpec,
    calibration: Calibration | None,
    kernels: KernelEfficiency | None,
    rt: Runtime,
    overheads: Overheads = NO_OVERHEADS,
) -> StageContext:
    """Everything stage i of replica r is priced from (planner.cost.stage.StageContext), on its slowest group
    `spec`; with stages of different dp, each prices on a slice of the micro-batch (planner.runtime.slice_size)
    and its gradient sync spans every replica of the stage."""
    s, pp, nst, nxt = plan.stages[i], plan.pp, len(plan.stages), place.nxt
    mbs, next_mbs = slice_size(plan, i % pp), 0 if nxt is None else slice_size(plan, (i + 1) % pp)
    return StageContext(
        kind=spec.device_kind,
        dtype=plan.dtype,
        mbs=mbs,
        seq=plan.seq_len,
        tp=s.tp,
        recompute=s.recompute == "full",
        first=i == 0,
        last=i == nst - 1,
        pp=pp,
        sharding=s.sharding,
        dp=s.dp,
        inflight=F.inflight_microbatches(plan.schedule, i % pp, pp, plan.num_microbatches(r), plan.virtual_stages),
        memory_bandwidth_bytes_per_s=spec.memory_bandwidth_bytes_per_s,
        tp_link=idx.ring_link(place.devs[: s.tp]) if s.tp > 1 else intra_link(spec),
        # gradients sum over every replica's every cp rank (tp leaders), cp ranks of one replica adjacent
        dp_link=idx.ring_link([s.tp_devices(q, c)[0] for q in range(s.dp) for c in range(s.cp)]),
        next_link=None if nxt is None else idx.link(place.devs[0], place.b0),
        next_tp=nxt.tp if nxt is not None else s.tp,
        calib=calibration,
        stack=replace(
            stage_stack(plan, s),
            fp8_weight_cached=plan.fp8 and rt.fp8_weight_cached,
            selective_op=s.recompute == "selective" and rt.selective_per_op,
            fused_block=rt.fused_block,
        ),
        device=gpu_device(spec, plan.dtype, kernels),
        next_mbs=0 if nxt is None or next_mbs == mbs else next_mbs,
        runtime=rt,
        cp_link=idx.ring_link([place.devs[c * s.tp] for c in range(s.cp)]) if s.cp > 1 else None,
        overheads=overheads,
        tied_link=_tied_link(plan, idx, i, r, rt),
        stale_outputs=F.stale_output_copies(plan.num_microbatches(r)) if rt.last_stage_keeps_outputs else 0,
    )


def _tied_link(plan: Plan, idx: DeviceIndex, i: int, r: int, rt: Runtime) -> Link | None:
    """The path between replica r's first- and last-stage leaders, for the first and the last stage of a
    pipeline under a runtime that all-reduces a tied embedding between them (stage.tied_embedding_sync_s)."""
    last = len(plan.stages) - 1
    if not rt.tied_embedding_allreduce or plan.pp <= 1 or i not in (0, last):
        return None
    a, b = plan.stages[0].replica_devices(r)[0], plan.stages[last].replica_devices(r)[0]
    return idx.link(a, b)


class _Priced(NamedTuple):
    """Per pipeline replica r and stage i: the stage's coefficients and the (node spec, memory) it runs on."""

    coeffs: list[list[StageCoeffs]]
    specs: list[list[tuple[NodeSpec, int]]]


def price_stages(
    plan: Plan,
    model: ModelSpec,
    idx: DeviceIndex,
    table: ProfileTable,
    calibration: Calibration | None,
    kernels: KernelEfficiency | None,
    rt: Runtime,
    overheads: Overheads = NO_OVERHEADS,
) -> _Priced:
    """Each stage of each pipeline replica priced by planner.cost.stage on the slowest group its replicas
    use (the smallest memory of them for capacity); alike replicas (_place's key) and alike contexts once."""
    memo: dict[StageContext, StageCoeffs] = {}
    light: dict[tuple, tuple[StageCoeffs, NodeSpec, int]] = {}
    out = _Priced([], [])
    fast = _fast(plan, idx)
    for r in range(plan.dp):
        row, srow = [], []
        for i in range(len(plan.stages)):
            place = _place(plan, idx, i, r, fast)
            hit = light.get(place.key)
            if hit is None:
                groups = {g.index: g.spec for g in place.groups}
                spec = min(groups.values(), key=lambda g: g.peak_flop_per_s(plan.dtype))
                ctx = _stage_context(plan, idx, i, r, place, spec, calibration, kernels, rt, overheads)
                co = memo.get(ctx)
                if co is None:
                    co = memo[ctx] = stage_coeffs(ctx, model, table)
                hit = light[place.key] = (co, spec, min(g.memory_bytes for g in groups.values()))
            row.append(hit[0])
            srow.append((hit[1], hit[2]))
        out.coeffs.append(row)
        out.specs.append(srow)
    return out


def receiver_pays_p2p(plan: Plan, priced: _Priced, runtime: Runtime) -> _Priced:
    """Under a runtime whose p2p blocks both ends (Runtime.p2p_blocks_receiver: DeepSpeed's broadcasts in a
    two-rank group), each stage but the first also spends its incoming boundary's exposed transfer (the
    activation it receives, the gradient it sends back: the previous stage's p2p_s_fixed), so a boundary
    costs both of its stages; 1F1B / GPipe only (interleaved chunks of one rank are not neighbours)."""
    if not runtime.p2p_blocks_receiver or len(plan.stages) < 2 or plan.schedule == "interleaved-1f1b":
        return priced
    coeffs = [
        [c if i == 0 else c._replace(p2p_s_fixed=c.p2p_s_fixed + row[i - 1].p2p_s_fixed) for i, c in enumerate(row)]
        for row in priced.coeffs
    ]
    return _Priced(coeffs, priced.specs)


class _Pipe(NamedTuple):
    """The pipelined part: per replica and pipeline rank the time of one micro-batch (rank_tau), the CPU work
    of one micro-batch (mb_work), each replica's pipeline time, the critical replica rc and the stretch of
    its steady slots by shared cores; `cores` is set where calibrated CPU ranks outnumber their cores."""

    rank_tau: list[list[float]]
    mb_work: list[float]
    times: list[float]
    rc: int
    stretch: float
    cores: int | None


def pipeline_times(plan: Plan, coeffs: list[list[StageCoeffs]], calibration: Calibration | None) -> _Pipe:
    """T_r = formulas.pipeline_time_s (or interleaved_time_s) over rank times tau summed over a rank's stages.
    Processor sharing in a pipeline's steady state: all ranks of every replica compute at once, so a slot of
    the slowest stage lasts at least one micro-batch's CPU work on all of them (its tp ranks each computing
    their shard) over the cores (planner.measure.calibrate); fill and drain keep the critical path."""
    stages, pp, dp, nst = plan.stages, plan.pp, plan.dp, len(plan.stages)
    ns = [s.num_layers for s in stages]
    rank_tau = [[0.0] * pp for _ in range(dp)]
    for r in range(dp):
        for i in range(nst):
            rank_tau[r][i % pp] += coeffs[r][i].time_s(ns[i])
    cores = calibration.num_cores if calibration is not None else None
    shared = cores is not None and 0 < cores < plan.num_devices
    qs = [num_slices(plan, i % pp) for i in range(nst)]
    mb_work = [
        sum(
            qs[i]
            * stages[i].tp
            * stages[i].cp
            * (coeffs[r][i].compute_s_per_block * ns[i] + coeffs[r][i].compute_s_fixed)
            for i in range(nst)
        )
        for r in range(dp)
    ]
    slot_work = sum(mb_work) / cores if shared else 0.0

    def pipe_time(r: int, min_slot_s: float) -> float:
        if plan.schedule == "interleaved-1f1b":
            return F.interleaved_time_s(rank_tau[r], plan.num_microbatches(r), plan.virtual_stages, min_slot_s)
        return F.pipeline_time_s(rank_tau[r], plan.num_microbatches(r), min_slot_s)

    times = [pipe_time(r, slot_work) for r in range(dp)]
    rc = max(range(dp), key=lambda r: times[r])
    stretch = times[rc] - pipe_time(rc, 0.0)  # of the steady slots, by shared cores
    return _Pipe(rank_tau, mb_work, times, rc, stretch, cores if shared else None)


def _own(plan: Plan, j: int) -> list[int]:
    """The stages pipeline rank j holds (more than one under the interleaved schedule)."""
    return [i for i in range(len(plan.stages)) if i % plan.pp == j]


def stage_tails(plan: Plan, coeffs: list[list[StageCoeffs]], rc: int) -> tuple[list[tuple[float, float]], int]:
    """Per pipeline rank j, the tail after the pipeline: (exposed gradient sync + ZeRO drain on the critical
    replica, the slowest replica's optimizer step); and the rank jt whose tail is longest."""
    ns = [s.num_layers for s in plan.stages]
    tails, parts = [], []
    for j in range(plan.pp):
        own = _own(plan, j)
        e = max(0.0, sum(coeffs[rc][i].grad_sync_s_fixed + coeffs[rc][i].grad_sync_s_per_block * ns[i] for i in own))
        g = sum(coeffs[rc][i].drain_s_fixed + coeffs[rc][i].drain_s_per_block * ns[i] for i in own)
        o = max(
            sum(coeffs[r][i].optimizer_s_fixed + coeffs[r][i].optimizer_s_per_block * ns[i] for i in own)
            for r in range(plan.dp)
        )
        tails.append(e + g + o)
        parts.append((e + g, o))
    return parts, max(range(plan.pp), key=lambda j: tails[j])


def cpu_share(plan: Plan, coeffs: list[list[StageCoeffs]], pipe: _Pipe, opt_s: float) -> tuple[float, float]:
    """Processor sharing on CPU ranks (planner.measure.calibrate): more ranks than cores stretch a phase to its
    CPU work over the cores when that exceeds its critical path. Work = every rank's compute in the pipelined
    part (tp ranks of a stage each compute their shard), and every rank's optimizer step (critical: opt_s)."""
    if pipe.cores is None:
        return 0.0, 0.0
    stages, nst, pp = plan.stages, len(plan.stages), plan.pp
    ns = [s.num_layers for s in stages]
    qs = [num_slices(plan, i % pp) for i in range(nst)]
    work_pipe = sum(plan.num_microbatches(r) * pipe.mb_work[r] for r in range(plan.dp))
    work_opt = sum(
        qs[i]
        * stages[i].tp
        * stages[i].cp
        * (coeffs[r][i].optimizer_s_fixed + coeffs[r][i].optimizer_s_per_block * ns[i])
        for r in range(plan.dp)
        for i in range(nst)
    )
    share_pipe = max(0.0, work_pipe / pipe.cores - pipe.times[pipe.rc])
    share_opt = max(0.0, work_opt / pipe.cores - opt_s)
    return share_pipe, share_opt


class _Critical(NamedTuple):
    """The critical replica's slowest pipeline rank jb over all m micro-batches, term by term (compute before
    any shared-core stretch), and the bubble: the rest of the pipeline time."""

    jb: int
    compute: float
    tp_comm: float  # incl. cp_comm
    cp_comm: float
    zero3: float
    p2p: float
    bubble: float


def critical_terms(plan: Plan, coeffs: list[list[StageCoeffs]], pipe: _Pipe) -> _Critical:
    """m × (per-block term × blocks + fixed term) summed over the stages of rank jb on replica rc; bubble =
    T_rc − stretch − m × tau_jb, so that compute + bubble + p2p + TP + ZeRO-3 gathers add up to T_rc."""
    rc, ns = pipe.rc, [s.num_layers for s in plan.stages]
    m = plan.num_microbatches(rc)
    jb = max(range(plan.pp), key=lambda j: pipe.rank_tau[rc][j])
    own_b = _own(plan, jb)

    def total(attr_a: str, attr_b: str) -> float:
        return m * sum(getattr(coeffs[rc][i], attr_a) * ns[i] + getattr(coeffs[rc][i], attr_b) for i in own_b)

    return _Critical(
        jb=jb,
        compute=total("compute_s_per_block", "compute_s_fixed"),
        tp_comm=total("tp_comm_s_per_block", "tp_comm_s_fixed"),
        cp_comm=m * sum(coeffs[rc][i].cp_comm_s_per_block * ns[i] for i in own_b),
        zero3=total("dp_comm_s_per_block", "dp_comm_s_fixed"),
        p2p=m * sum(coeffs[rc][i].p2p_s_fixed for i in own_b),
        bubble=max(0.0, pipe.times[rc] - pipe.stretch - m * pipe.rank_tau[rc][jb]),
    )


def memory_per_stage(
    plan: Plan,
    priced: _Priced,
    fragmentation: float = F.FRAGMENTATION_FRACTION,
    reserve_bytes: int | None = None,
    eager_context: bool = False,
) -> tuple[list[int], list[int]]:
    """Per pipeline rank: the peak memory (formulas.peak_memory_bytes of the allocated bytes: blocks, fixed
    terms and the largest workspace; `reserve_bytes` a measured runtime reserve; +
    formulas.EAGER_MODULE_LOADING_BYTES on GPUs under a runtime that loads CUDA modules eagerly) on its
    worst replica, and the smallest device memory it runs on."""
    ns = [s.num_layers for s in plan.stages]
    peak_mem, cap_mem = [], []
    for j in range(plan.pp):
        own = _own(plan, j)
        worst_peak, worst_cap = 0, None
        seen: set[tuple] = set()  # alike replicas share their coefficient and spec objects (price_stages)
        for r in range(plan.dp):
            co = priced.coeffs[r]
            spec, cap = priced.specs[r][j]
            key = (id(spec), *(id(co[i]) for i in own))
            if key not in seen:
                seen.add(key)
                alloc = sum(co[i].memory_bytes_per_block * ns[i] + co[i].memory_bytes_fixed for i in own)
                alloc += max(co[i].workspace_bytes for i in own)
                peak = F.peak_memory_bytes(alloc, spec.device_kind, fragmentation, reserve_bytes)
                if eager_context and spec.device_kind != "cpu":
                    peak += F.EAGER_MODULE_LOADING_BYTES
                worst_peak = max(worst_peak, int(peak))
            worst_cap = cap if worst_cap is None else min(worst_cap, cap)
        peak_mem.append(worst_peak)
        cap_mem.append(int(worst_cap or 0))
    return peak_mem, cap_mem


def bottleneck(
    terms: dict[str, float], jt: int, jb: int, kinds: list[str], peak_mem: list[int], cap_mem: list[int]
) -> str:
    """The largest term and the stage it comes from (the tail's rank jt for dp comm and optimizer, else the
    pipeline's slowest rank jb) on its device kind; a stage over its memory wins, the one most over first."""
    over = [j for j in range(len(peak_mem)) if peak_mem[j] > cap_mem[j]]
    if over:
        j = max(over, key=lambda j: peak_mem[j] - cap_mem[j])
        return f"memory (stage {j}: {peak_mem[j] / GIB:.1f} GiB > {cap_mem[j] / GIB:.1f} GiB)"
    top = max(terms, key=lambda k: terms[k])
    where = jt if top in ("data-parallel comm", "optimizer step") else jb
    return f"{top} (stage {where}, {kinds[where]})"


def head_notes(plan: Plan, model: ModelSpec, runtime: Runtime, calibration: Calibration | None) -> list[str]:
    """What the torch runtime would refuse and why, then what the prices rest on."""
    notes: list[str] = problem_notes(plan, model)
    if runtime != MESHPLAN:
        notes.append(f"runtime: {runtime.name} ({runtime.source})")
    if calibration is not None:
        notes.append(f"calibrated: {calibration.source}; compute slowdown {calibration.slowdown():.2f}")
    if plan.schedule == "interleaved-1f1b" and plan.num_microbatches() % plan.pp:
        notes.append(f"interleaved 1F1B in Megatron needs micro-batches divisible by pp={plan.pp}")
    return notes


def estimated_rows(plan: Plan, table: ProfileTable, priced: _Priced) -> int:
    """Of the rows this plan prices with, those estimated from datasheet peaks (a search hands over its whole
    table, estimates included)."""
    needs = plan_profile_needs(plan)
    specs = {id(spec): spec for row in priced.specs for spec, _ in row}  # alike replicas share a spec object
    kinds_used = {spec.device_kind for spec in specs.values()}
    return sum(
        1
        for r in table
        if r.estimated
        and r.key.device_kind in kinds_used
        and ProfileNeed(r.key.micro_batch_size, r.key.seq_len, r.key.tp, r.key.recompute, r.key.dtype) in needs
    )


def breakdown(
    plan: Plan,
    model: ModelSpec,
    idx: DeviceIndex,
    step: float,
    terms: dict[str, float],
    neck: str,
    peak_mem: list[int],
    cap_mem: list[int],
    notes: list[str],
) -> CostBreakdown:
    """The CostBreakdown of a priced step; MFU = model FLOPs per step (planner.specs.flops) over step time ×
    the peak of the devices of one pipeline (the first pp stages)."""
    group_peak = [g.spec.peak_flop_per_s(plan.dtype) for g in idx.groups]
    peak_flops = sum(group_peak[idx.group(d).index] for s in plan.stages[: plan.pp] for d in s.device_ids)
    model_flops = flops.model_flops_per_step(model, plan.global_batch_size, plan.seq_len)
    return CostBreakdown(
        step_time_s=step,
        compute_s=terms["compute"],
        bubble_s=terms["pipeline bubble"],
        pp_comm_s=terms["pipeline p2p"],
        dp_comm_s=terms["data-parallel comm"],
        tp_comm_s=terms["tensor-parallel comm"],
        cp_comm_s=terms["context-parallel comm"],
        optimizer_s=terms["optimizer step"],
        tokens_per_s=plan.global_batch_size * plan.seq_len / step,
        mfu=model_flops / (step * peak_flops),
        peak_memory_bytes=tuple(peak_mem),
        memory_capacity_bytes=tuple(cap_mem),
        bottleneck=neck,
        feasible=all(p <= c for p, c in zip(peak_mem, cap_mem, strict=True)),
        notes=tuple(notes),
    )


def estimate(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    profiles: ProfileTable | None = None,
    index: DeviceIndex | None = None,
    calibration: Calibration | None = None,
    kernels: KernelEfficiency | None = None,
    runtime: Runtime = MESHPLAN,
    overheads: Overheads = NO_OVERHEADS,
    step_s: float = 0.0,
) -> CostBreakdown:
    """The predicted cost of one optimizer step of `plan` (see the module docstring); `calibration`
    applies measured corrections (planner.measure.calibrate), e.g. for CPU ranks under gloo;
    `kernels` the GEMM / attention efficiencies of estimated GPU rows (planner.cost.fitted);
    `runtime` what the training runtime overlaps (planner.cost.overlap; default meshplan's own);
    `overheads` and `step_s` its fixed costs per block and micro-batch (planner.cost.stage.Overheads)
    and once a step (booked with the optimizer step): planner.cost.runtimes.Pricing gives all four."""
    check_plan_fits_model(plan, model, cluster)
    idx = index or DeviceIndex(cluster)
    kinds = {g.spec.device_kind for g in idx.groups}
    table = complete_profiles(model, cluster, profiles, plan_profile_needs(plan), kinds=kinds, kernels=kernels)
    notes = head_notes(plan, model, runtime, calibration)
    if overheads.microbatch_s and plan.schedule == "interleaved-1f1b":
        # a rank pays the per-micro-batch cost once, not once a chunk (planner.cost.stage.Overheads)
        overheads = overheads._replace(microbatch_s=overheads.microbatch_s / plan.virtual_stages)
    priced = price_stages(plan, model, idx, table, calibration, kernels, runtime.for_schedule(plan.schedule), overheads)
    priced = receiver_pays_p2p(plan, priced, runtime)
    pipe = pipeline_times(plan, priced.coeffs, calibration)
    parts, jt = stage_tails(plan, priced.coeffs, pipe.rc)
    share_pipe, share_opt = cpu_share(plan, priced.coeffs, pipe, parts[jt][1])
    if pipe.cores is not None:
        extra_ms = (pipe.stretch + share_pipe + share_opt) * 1e3
        notes.append(f"{plan.num_devices} ranks share {pipe.cores} cores: +{extra_ms:.1f} ms")
    tail_s = parts[jt][0] + parts[jt][1]  # the tail summed first: the same floats as before the split
    step = pipe.times[pipe.rc] + share_pipe + tail_s + share_opt
    if step_s:
        step += step_s
    crit = critical_terms(plan, priced.coeffs, pipe)
    frag = F.FRAGMENTATION_FRACTION_EXPANDABLE if runtime.expandable_segments else F.FRAGMENTATION_FRACTION
    reserve = calibration.runtime_reserve_bytes if calibration is not None else None
    peak_mem, cap_mem = memory_per_stage(plan, priced, frag, reserve, runtime.eager_module_loading)
    terms = {
        "compute": crit.compute + pipe.stretch + share_pipe,  # shared cores stretch the compute
        "pipeline bubble": crit.bubble,
        "pipeline p2p": crit.p2p,
        "tensor-parallel comm": crit.tp_comm - crit.cp_comm,
        "context-parallel comm": crit.cp_comm,
        "data-parallel comm": parts[jt][0] + crit.zero3,
        "optimizer step": parts[jt][1] + share_opt + step_s,
    }
    kinds_rc = [spec.device_kind for spec, _ in priced.specs[pipe.rc]]
    if estimated := estimated_rows(plan, table, priced):
        notes.append(f"{estimated} profile rows estimated from datasheet peaks")
    return breakdown(
        plan,
        model,
        idx,
        step,
        terms,
        bottleneck(terms, jt, crit.jb, kinds_rc, peak_mem, cap_mem),
        peak_mem,
        cap_mem,
        notes,
    )
