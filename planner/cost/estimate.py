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

from planner.cost import formulas as F
from planner.cost.completion import ProfileNeed, complete_profiles
from planner.cost.compute import Device, KernelEfficiency
from planner.cost.devices import DeviceIndex, intra_link
from planner.cost.fitted import DEFAULT_KERNELS
from planner.cost.memory import Stack
from planner.cost.overlap import MESHPLAN, Runtime
from planner.cost.stage import StageCoeffs, StageContext, stage_coeffs
from planner.errors import MeshplanError
from planner.measure.calibrate import Calibration
from planner.measure.profiles import ProfileTable
from planner.runtime import num_slices, pipeline_replicas, problem_notes, slice_size
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
        spec.peak_flop_per_s(dtype),
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


def estimate(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    profiles: ProfileTable | None = None,
    index: DeviceIndex | None = None,
    calibration: Calibration | None = None,
    kernels: KernelEfficiency | None = None,
    runtime: Runtime = MESHPLAN,
) -> CostBreakdown:
    """The predicted cost of one optimizer step of `plan` (see the module docstring); `calibration`
    applies measured corrections (planner.measure.calibrate), e.g. for CPU ranks under gloo;
    `kernels` the GEMM / attention efficiencies of estimated GPU rows (planner.cost.fitted);
    `runtime` what the training runtime overlaps (planner.cost.overlap; default meshplan's own)."""
    check_plan_fits_model(plan, model, cluster)
    idx = index or DeviceIndex(cluster)
    table = complete_profiles(
        model,
        cluster,
        profiles,
        plan_profile_needs(plan),
        kinds={g.spec.device_kind for g in idx.groups},
        kernels=kernels,
    )
    stages, pp, v, dp = plan.stages, plan.pp, plan.virtual_stages, plan.dp
    nst = len(stages)
    memo: dict[StageContext, StageCoeffs] = {}
    # every replica of a stage joins its gradient sync; with stages of different dp, pipeline
    # replica r's row below prices stage s on the slowest of its q_s replicas, each on a slice of
    # the micro-batch (planner.runtime.slice_size)
    dp_links = [idx.ring_link([s.replica_devices(r)[0] for r in range(s.dp)]) for s in stages]
    qs = [num_slices(plan, i % pp) for i in range(nst)]
    slices = [slice_size(plan, i % pp) for i in range(nst)]
    notes: list[str] = problem_notes(plan, model)  # what the torch runtime would refuse, and why
    rt = runtime.for_schedule(plan.schedule)
    if runtime != MESHPLAN:
        notes.append(f"runtime: {runtime.name} ({runtime.source})")
    if calibration is not None:
        notes.append(f"calibrated: {calibration.source}; compute slowdown {calibration.slowdown():.2f}")
    if plan.schedule == "interleaved-1f1b" and plan.num_microbatches() % pp:
        notes.append(f"interleaved 1F1B in Megatron needs micro-batches divisible by pp={pp}")

    coeffs: list[list[StageCoeffs]] = []
    specs_rs = []
    # replicas on the same groups with the same node relations price identically: key them cheaply
    light: dict[tuple, tuple[StageCoeffs, object, int]] = {}
    for r in range(dp):
        m = plan.num_microbatches(r)
        row, srow = [], []
        for i, s in enumerate(stages):
            subs = [s.replica_devices(j) for j in pipeline_replicas(plan, i % pp, r)]
            devs = subs[0]
            ginfo = [idx.group(d) for sub in subs for d in sub]
            same_node = s.tp == 1 or len({idx.node(d) for d in devs}) == 1
            nxt = stages[i + 1] if i + 1 < nst else None
            nkey, b0 = None, devs[0]
            if nxt is not None:
                b0 = nxt.replica_devices(pipeline_replicas(plan, (i + 1) % pp, r)[0])[0]
                nkey = (idx.node(devs[0]) == idx.node(b0), ginfo[0].index, idx.group(b0).index)
            key = (i, tuple(sorted({g.index for g in ginfo})), same_node, nkey, m)
            hit = light.get(key)
            if hit is None:
                groups = {g.index: g.spec for g in ginfo}
                spec = min(groups.values(), key=lambda g: g.peak_flop_per_s(plan.dtype))
                ctx = StageContext(
                    kind=spec.device_kind,
                    dtype=plan.dtype,
                    mbs=slices[i],
                    seq=plan.seq_len,
                    tp=s.tp,
                    recompute=s.recompute == "full",
                    first=i == 0,
                    last=i == nst - 1,
                    pp=pp,
                    sharding=s.sharding,
                    dp=s.dp,
                    inflight=F.inflight_microbatches(plan.schedule, i % pp, pp, m, v),
                    memory_bandwidth_bytes_per_s=spec.memory_bandwidth_bytes_per_s,
                    tp_link=idx.ring_link(devs) if s.tp > 1 else intra_link(spec),
                    dp_link=dp_links[i],
                    next_link=None if nxt is None else idx.link(devs[0], b0),
                    next_tp=nxt.tp if nxt is not None else s.tp,
                    calib=calibration,
                    stack=stage_stack(plan, s),
                    device=gpu_device(spec, plan.dtype, kernels),
                    next_mbs=0 if nxt is None or slices[i + 1] == slices[i] else slices[i + 1],
                    runtime=rt,
                )
                co = memo.get(ctx)
                if co is None:
                    co = memo[ctx] = stage_coeffs(ctx, model, table)
                hit = light[key] = (co, spec, min(g.memory_bytes for g in groups.values()))
            row.append(hit[0])
            srow.append((hit[1], hit[2]))
        coeffs.append(row)
        specs_rs.append(srow)

    ns = [s.num_layers for s in stages]
    rank_tau = [[0.0] * pp for _ in range(dp)]
    for r in range(dp):
        for i in range(nst):
            rank_tau[r][i % pp] += coeffs[r][i].time_s(ns[i])
    cores = calibration.num_cores if calibration is not None else None
    shared = cores is not None and 0 < cores < plan.num_devices
    # CPU work of one micro-batch per replica and stage (its tp ranks each compute their shard).
    # Processor sharing in a pipeline's steady state: all ranks of every replica compute at once,
    # so a slot of the slowest stage lasts at least one micro-batch's work on all of them over
    # the cores (planner.measure.calibrate); fill and drain keep the critical path.
    mb_work = [
        sum(
            qs[i] * stages[i].tp * (coeffs[r][i].compute_s_per_block * ns[i] + coeffs[r][i].compute_s_fixed)
            for i in range(nst)
        )
        for r in range(dp)
    ]
    slot_work = sum(mb_work) / cores if shared else 0.0

    def pipe_time(r: int, min_slot_s: float) -> float:
        if plan.schedule == "interleaved-1f1b":
            return F.interleaved_time_s(rank_tau[r], plan.num_microbatches(r), v, min_slot_s)
        return F.pipeline_time_s(rank_tau[r], plan.num_microbatches(r), min_slot_s)

    times = [pipe_time(r, slot_work) for r in range(dp)]
    rc = max(range(dp), key=lambda r: times[r])
    stretch = times[rc] - pipe_time(rc, 0.0)  # of the steady slots, by shared cores
    tails, parts = [], []
    for j in range(pp):
        own = [i for i in range(nst) if i % pp == j]
        e = max(0.0, sum(coeffs[rc][i].grad_sync_s_fixed + coeffs[rc][i].grad_sync_s_per_block * ns[i] for i in own))
        g = sum(coeffs[rc][i].drain_s_fixed + coeffs[rc][i].drain_s_per_block * ns[i] for i in own)
        o = max(
            sum(coeffs[r][i].optimizer_s_fixed + coeffs[r][i].optimizer_s_per_block * ns[i] for i in own)
            for r in range(dp)
        )
        tails.append(e + g + o)
        parts.append((e + g, o))
    jt = max(range(pp), key=lambda j: tails[j])
    # Processor sharing on CPU ranks (planner.measure.calibrate): more ranks than cores stretch a phase to its
    # CPU work over the cores when that exceeds its critical path. Work = every rank's compute in the
    # pipelined part (tp ranks of a stage each compute their shard), and every rank's optimizer step.
    share_pipe = share_opt = 0.0
    if shared:
        work_pipe = sum(plan.num_microbatches(r) * mb_work[r] for r in range(dp))
        work_opt = sum(
            qs[i] * stages[i].tp * (coeffs[r][i].optimizer_s_fixed + coeffs[r][i].optimizer_s_per_block * ns[i])
            for r in range(dp)
            for i in range(nst)
        )
        share_pipe = max(0.0, work_pipe / cores - times[rc])
        share_opt = max(0.0, work_opt / cores - parts[jt][1])
        extra_ms = (stretch + share_pipe + share_opt) * 1e3
        notes.append(f"{plan.num_devices} ranks share {cores} cores: +{extra_ms:.1f} ms")
    step = times[rc] + share_pipe + tails[jt] + share_opt

    m = plan.num_microbatches(rc)
    jb = max(range(pp), key=lambda j: rank_tau[rc][j])
    own_b = [i for i in range(nst) if i % pp == jb]

    def total(attr_a: str, attr_b: str) -> float:
        return m * sum(getattr(coeffs[rc][i], attr_a) * ns[i] + getattr(coeffs[rc][i], attr_b) for i in own_b)

    compute = total("compute_s_per_block", "compute_s_fixed") + stretch + share_pipe  # shared cores stretch the compute
    tp_comm = total("tp_comm_s_per_block", "tp_comm_s_fixed")
    zero3 = total("dp_comm_s_per_block", "dp_comm_s_fixed")
    p2p = m * sum(coeffs[rc][i].p2p_s_fixed for i in own_b)
    bubble = max(0.0, times[rc] - stretch - m * rank_tau[rc][jb])

    peak_mem, cap_mem = [], []
    for j in range(pp):
        own = [i for i in range(nst) if i % pp == j]
        worst_peak, worst_cap = 0, None
        for r in range(dp):
            alloc = sum(coeffs[r][i].memory_bytes_per_block * ns[i] + coeffs[r][i].memory_bytes_fixed for i in own)
            alloc += max(coeffs[r][i].workspace_bytes for i in own)
            spec, cap = specs_rs[r][j]
            worst_peak = max(worst_peak, int(F.peak_memory_bytes(alloc, spec.device_kind)))
            worst_cap = cap if worst_cap is None else min(worst_cap, cap)
        peak_mem.append(worst_peak)
        cap_mem.append(int(worst_cap or 0))
    over = [j for j in range(pp) if peak_mem[j] > cap_mem[j]]

    group_peak = [g.spec.peak_flop_per_s(plan.dtype) for g in idx.groups]
    peak_flops = sum(group_peak[idx.group(d).index] for s in stages[:pp] for d in s.device_ids)
    model_flops = flops.model_flops_per_step(model, plan.global_batch_size, plan.seq_len)
    terms = {
        "compute": compute,
        "pipeline bubble": bubble,
        "pipeline p2p": p2p,
        "tensor-parallel comm": tp_comm,
        "data-parallel comm": parts[jt][0] + zero3,
        "optimizer step": parts[jt][1] + share_opt,
    }
    top = max(terms, key=lambda k: terms[k])
    where = jt if top in ("data-parallel comm", "optimizer step") else jb
    bottleneck = f"{top} (stage {where}, {specs_rs[rc][where][0].device_kind})"
    if over:
        j = max(over, key=lambda j: peak_mem[j] - cap_mem[j])
        bottleneck = f"memory (stage {j}: {peak_mem[j] / GIB:.1f} GiB > {cap_mem[j] / GIB:.1f} GiB)"
    # of the rows this plan prices with (a search hands over its whole table, estimates included)
    needs = plan_profile_needs(plan)
    kinds_used = {spec.device_kind for row in specs_rs for spec, _ in row}
    estimated = sum(
        1
        for r in table
        if r.estimated
        and r.key.device_kind in kinds_used
        and ProfileNeed(r.key.micro_batch_size, r.key.seq_len, r.key.tp, r.key.recompute, r.key.dtype) in needs
    )
    if estimated:
        notes.append(f"{estimated} profile rows estimated from datasheet peaks")
    return CostBreakdown(
        step_time_s=step,
        compute_s=compute,
        bubble_s=bubble,
        pp_comm_s=p2p,
        dp_comm_s=parts[jt][0] + zero3,
        tp_comm_s=tp_comm,
        optimizer_s=parts[jt][1] + share_opt,
        tokens_per_s=plan.global_batch_size * plan.seq_len / step,
        mfu=model_flops / (step * peak_flops),
        peak_memory_bytes=tuple(peak_mem),
        memory_capacity_bytes=tuple(cap_mem),
        bottleneck=bottleneck,
        feasible=not over,
        notes=tuple(notes),
    )
