"""Per-stage cost coefficients: everything a stage costs, as linear functions of its block count n.

A stage with n blocks costs, per micro-batch, τ(n) = a·n + b (compute from profiles, TP collectives
unless a block's profile already holds them, ZeRO-3 gathers not hidden by compute, p2p sends to the
next stage); after the pipeline drains its tail is max(0, e0 + e1·n) + g0 + g1·n + o0 + o1·n
(gradient sync not hidden by the last backward; ZeRO-1/2 parameter all-gather or, unsharded, the
gradient bucket copies; Adam step); its allocation is mem_a·n + mem_b bytes. `estimate` evaluates
these at the plan's n, and the search evaluates them for every n at once, so the two agree by
construction.

`StageContext.calib` (planner.measure.calibrate, passed by `estimate(..., calibration=...)`; the search
passes none) swaps datasheet assumptions for measured ones: profiled times × the rank contention
slowdown, gloo's fitted all_reduce / all_gather / reduce_scatter instead of ring formulas on the
send/recv link, the measured overlap of gradient sync, and the optimizer's bytes per parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import formulas as F
from planner.cost import memory as M
from planner.cost import overlap as OV
from planner.cost.compute import Device, attention_train_s, stack_time_delta_s
from planner.cost.devices import Link
from planner.measure.calibrate import Calibration
from planner.measure.ops import BenchOp
from planner.measure.profiles import LayerProfile, ProfileKey, ProfileTable
from planner.specs import flops
from planner.specs.flops import DTYPE_BYTES, LayerKind
from planner.specs.model import ModelSpec


@dataclass(frozen=True, slots=True)
class StageContext:
    """What a stage's cost depends on besides its block count (hashable, so coefficients memoise)."""

    kind: str
    dtype: str
    mbs: int
    seq: int
    tp: int
    recompute: bool
    first: bool
    last: bool
    pp: int
    sharding: str
    dp: int
    inflight: float
    memory_bandwidth_bytes_per_s: float
    tp_link: Link
    dp_link: Link
    next_link: Link | None
    next_tp: int
    calib: Calibration | None = None  # measured corrections (planner.measure.calibrate); None = datasheet model
    stack: M.Stack = M.RUNTIME  # attention / loss kernels, dropout, sequence parallel, selective or k-th recompute
    device: Device | None = None  # a GPU's roofline figures: prices the stack's kernels unlike the profile's
    # samples per micro-batch on the next stage's replicas when stages differ in dp (0: same as mbs,
    # which is then one replica's slice: planner.runtime.slice_size)
    next_mbs: int = 0
    runtime: OV.Runtime = OV.MESHPLAN  # what overlaps which compute (planner.cost.overlap)


@dataclass(frozen=True, slots=True)
class StageCoeffs:
    compute_a: float
    compute_b: float
    tp_a: float
    tp_b: float
    zero3_a: float
    zero3_b: float
    p2p_b: float
    bwd_a: float
    bwd_b: float
    e0: float
    e1: float
    g0: float
    g1: float
    o0: float
    o1: float
    params_a: float
    params_b: float
    state_a: float
    state_b: float
    act_a: float
    act_b: float
    mem_a: float
    mem_b: float
    workspace_bytes: float

    @property
    def a(self) -> float:
        return self.compute_a + self.tp_a + self.zero3_a

    @property
    def b(self) -> float:
        return self.compute_b + self.tp_b + self.zero3_b + self.p2p_b

    def time_s(self, n: int) -> float:
        return self.a * n + self.b

    def tail_s(self, n: int) -> float:
        return max(0.0, self.e0 + self.e1 * n) + self.g0 + self.g1 * n + self.o0 + self.o1 * n


def _row(profiles: ProfileTable, ctx: StageContext, layer: str, recompute: bool):
    return profiles.lookup(ProfileKey(ctx.kind, layer, ctx.mbs, ctx.seq, ctx.tp, recompute, ctx.dtype))  # type: ignore[arg-type]


def boundary_p2p_s(hidden_bytes: float, tp: int, next_tp: int, link: Link, calib: Calibration | None) -> float:
    """One micro-batch at a stage boundary: the activation forward and its gradient backward, where
    with equal tp each rank sends 1/tp (Megatron's scatter/gather optimisation, Narayanan et al.
    SC'21 §4.1), plus the schedule's own measured cost (planner.measure.calibrate.pipeline_overhead_s).
    stage_coeffs and the search's arrays price every boundary with this one function."""
    p2p = 2 * F.p2p_s(hidden_bytes / min(tp, next_tp), link.bandwidth_bytes_per_s, link.latency_s)
    return p2p + (calib.pipeline_overhead_s if calib is not None else 0.0)


@dataclass(frozen=True, slots=True)
class LocalTerms:
    """The part of a stage's coefficients that its data parallelism, sharding and neighbours leave
    alone: profile rows, compute, TP all-reduces, the embedding / head, activations and workspace.
    A function of the context's kind, dtype, mbs, seq, tp, recompute, first, last, pp (last stage
    only: `stage_coeffs` reads pp > 1 there), stack, device, calib and tp_link, so a search that
    prices many contexts sharing those computes it once (planner.search.arrays.Pricer)."""

    blk: LayerProfile
    plain: LayerProfile
    f_rec: float
    hidden_bytes: float
    slow: float
    slow_blk: float
    tp_a: float
    fwd_block: float
    bwd_block: float
    compute_a: float
    bwd_a: float
    compute_b: float
    tp_b: float
    bwd_b: float
    params_a: float
    params_b: float
    packed_b: float
    act_a: float
    act_b: float
    workspace: float
    rows_const: tuple[LayerProfile, ...]


def local_terms(ctx: StageContext, model: ModelSpec, profiles: ProfileTable) -> LocalTerms:
    """`LocalTerms` of a stage: the first half of `stage_coeffs`, whose terms cite their formulas here."""
    e = DTYPE_BYTES[ctx.dtype]
    st = ctx.stack
    blk = _row(profiles, ctx, "block", ctx.recompute)
    # every k-th block recomputed: the stage mixes recomputed blocks (fraction f) with plain ones
    f_rec = 1.0 / st.recompute_every if ctx.recompute else 0.0
    plain = _row(profiles, ctx, "block", False) if f_rec < 1.0 else blk
    hidden_bytes = flops.block_input_bytes(model, ctx.mbs, ctx.seq, ctx.dtype)
    tl = ctx.tp_link
    cal = ctx.calib
    # profiles time one process alone; ranks sharing a node's cores, and meeting after every
    # micro-batch, run slower by these measured factors (a block timed on a real tp group ran in
    # lockstep already)
    slow = cal.slowdown() if cal is not None else 1.0
    slow_blk = cal.slowdown(real_group=blk.tp_comm_included) if cal is not None else 1.0
    ar_fit = cal.fit(BenchOp.ALL_REDUCE) if cal is not None else None
    if ar_fit is not None:
        tp_ar = ar_fit.time_s(hidden_bytes, ctx.tp)
    else:
        tp_ar = F.allreduce_s(hidden_bytes, ctx.tp, tl.bandwidth_bytes_per_s, tl.latency_s, tl.num_nodes)

    # a block profiled on a real tp group already holds its all-reduces (and their waits)
    per_block_ar = f_rec * F.tp_allreduces_per_block(True) + (1 - f_rec) * F.tp_allreduces_per_block(False)
    tp_a = 0.0 if blk.tp_comm_included else per_block_ar * tp_ar
    bwd_block = f_rec * blk.backward_s + (1 - f_rec) * plain.backward_s
    shape = (model, ctx.mbs, ctx.seq, ctx.tp, ctx.dtype)
    if st.selective and not ctx.recompute:
        # selective recompute runs the attention core (QKᵀ, softmax, A·V) forward again in backward:
        # on a GPU that kernel's own time (planner.cost.compute), else its share of the block's
        # forward FLOPs (flops.attention_core_forward_flops)
        if ctx.device is not None:
            bwd_block += attention_train_s(*shape, ctx.device, st.attention, st.dropout)[0]
        else:
            core = flops.attention_core_forward_flops(model, ctx.mbs, ctx.seq, ctx.tp)
            bwd_block += plain.forward_s * core / flops.block_forward_flops(model, ctx.mbs, ctx.seq, ctx.tp)
    fwd_block = f_rec * blk.forward_s + (1 - f_rec) * plain.forward_s
    if ctx.device is not None:
        # the stack's attention / dropout / layout kernels vs the profiled runtime block's; recomputed
        # blocks run the forward's part again
        dfwd, dbwd = stack_time_delta_s(*shape, ctx.device, st)
        fwd_block, bwd_block = fwd_block + dfwd, bwd_block + dbwd + f_rec * dfwd
    compute_a = slow_blk * (fwd_block + bwd_block)
    bwd_a = slow_blk * bwd_block
    compute_b = tp_b = bwd_b = 0.0
    params_a = float(flops.layer_params("block", model, ctx.tp))
    params_b = 0.0

    def packed(kind: LayerKind, params: float) -> float:
        """Gradient bytes GradSumSync copies through its bucket buffer (F.GRAD_BUCKET_BYTES)."""
        small = flops.largest_tensor_params(kind, model, ctx.tp) * e < F.GRAD_BUCKET_BYTES
        return params * e if small else 0.0

    packed_b = 0.0
    act_b = 0.0
    mem_args = (model, ctx.mbs, ctx.seq, ctx.tp, ctx.dtype, st)
    workspace = M.block_workspace_bytes(*mem_args, float(blk.workspace_bytes), ctx.recompute)
    rows_const: list[LayerProfile] = []
    if ctx.first:
        emb = _row(profiles, ctx, "embedding", False)
        rows_const.append(emb)
        compute_b += slow * emb.train_s
        bwd_b += slow * emb.backward_s
        tp_b += tp_ar  # vocab-parallel embedding: one all-reduce of its output (Megatron-LM)
        emb_params = flops.layer_params("embedding", model, ctx.tp)
        params_b += emb_params
        packed_b += packed("embedding", emb_params)
        act_b += emb.activation_bytes
        workspace = max(workspace, emb.workspace_bytes)
    if ctx.last:
        head = _row(profiles, ctx, "head", False)
        rows_const.append(head)
        compute_b += slow * head.train_s
        bwd_b += slow * head.backward_s
        tp_b += tp_ar  # vocab-parallel head: one all-reduce of the input gradient
        head_params = flops.layer_params("head", model, ctx.tp)
        if model.tied and ctx.pp > 1:
            # the last stage keeps its own copy of a tied embedding for the LM head (Megatron-LM)
            head_params += -(-model.padded_vocab * model.hidden // ctx.tp)
        params_b += head_params
        packed_b += packed("head", head_params)
        head_kept, head_work = M.head_bytes(*mem_args, head.activation_bytes, head.workspace_bytes)
        act_b += head_kept
        workspace = max(workspace, head_work)

    kept_plain = M.block_kept_bytes(*mem_args, float(plain.activation_bytes))
    kept_rec = float(blk.activation_bytes) / (ctx.tp if st.sequence_parallel and ctx.tp > 1 else 1)
    act_a = M.block_mixed_kept_bytes(kept_plain, kept_rec, st.recompute_every) if ctx.recompute else kept_plain
    return LocalTerms(
        blk, plain, f_rec, hidden_bytes, slow, slow_blk, tp_a, fwd_block, bwd_block, compute_a, bwd_a, compute_b,
        tp_b, bwd_b, params_a, params_b, packed_b, act_a, act_b, workspace, tuple(rows_const),
    )  # fmt: skip


def stage_coeffs(
    ctx: StageContext, model: ModelSpec, profiles: ProfileTable, local: LocalTerms | None = None
) -> StageCoeffs:
    """Coefficients of one stage (see the module docstring); every term cites its formula in `formulas`.
    `local`: `local_terms(ctx, …)` when the caller has it already (equal for contexts that share its key)."""
    lt = local if local is not None else local_terms(ctx, model, profiles)
    e = DTYPE_BYTES[ctx.dtype]
    hidden_bytes = lt.hidden_bytes
    dl = ctx.dp_link
    cal = ctx.calib
    slow, slow_blk = lt.slow, lt.slow_blk
    tp_a, fwd_block, compute_a, bwd_a = lt.tp_a, lt.fwd_block, lt.compute_a, lt.bwd_a
    compute_b, tp_b, bwd_b = lt.compute_b, lt.tp_b, lt.bwd_b
    params_a, params_b, packed_b, act_b, workspace = lt.params_a, lt.params_b, lt.packed_b, lt.act_b, lt.workspace
    rows_const = lt.rows_const

    def packed(kind: LayerKind, params: float) -> float:
        """Gradient bytes GradSumSync copies through its bucket buffer (F.GRAD_BUCKET_BYTES)."""
        small = flops.largest_tensor_params(kind, model, ctx.tp) * e < F.GRAD_BUCKET_BYTES
        return params * e if small else 0.0

    p2p_b = 0.0
    if ctx.next_link is not None:
        # stages of different dp: a leader sends its slice and the next one receives its own, in
        # pieces (planner.runtime.boundary_pieces); the larger of the two bounds the boundary
        wide = (
            hidden_bytes
            if ctx.next_mbs <= ctx.mbs
            else flops.block_input_bytes(model, ctx.next_mbs, ctx.seq, ctx.dtype)
        )
        p2p_b = boundary_p2p_s(wide, ctx.tp, ctx.next_tp, ctx.next_link, cal)

    # the runtime's overlap of each term (planner.cost.overlap): TP all-reduces and boundary p2p
    # keep what it does not hide; CPU ranks hide nothing (no side streams)
    rt = ctx.runtime.on_cpu() if ctx.kind == "cpu" else ctx.runtime
    if rt.tp_overlap:
        tp_a, tp_b = (1 - rt.tp_overlap) * tp_a, (1 - rt.tp_overlap) * tp_b
    if rt.p2p_overlap:
        p2p_b *= 1 - rt.p2p_overlap
    zero3_a = zero3_b = 0.0
    e0 = e1 = g0 = g1 = 0.0
    d = ctx.dp
    if d > 1:
        bw, lat = dl.bandwidth_bytes_per_s, dl.latency_s
        # (latency s, s per byte of the whole buffer) of each collective over the d replicas: ring
        # formulas on the ring's bus bandwidth (devices.cross_node_link: k NIC shares per node), the
        # all-reduce at NCCL's lower ring/tree latency, or the op's own measured fit when calibrated
        ag_lat, ag_per_byte = (d - 1) * lat, (d - 1) / d / bw
        rs_lat, rs_per_byte = ag_lat, ag_per_byte
        ar_lat, ar_per_byte = F.allreduce_latency_s(d, lat, dl.num_nodes), 2 * (d - 1) / d / bw
        if cal is not None:
            for op in (BenchOp.ALL_GATHER, BenchOp.REDUCE_SCATTER, BenchOp.ALL_REDUCE):
                f = cal.fit(op)
                if f is not None:
                    pair = f.coeffs(d)
                    if op == BenchOp.ALL_GATHER:
                        ag_lat, ag_per_byte = pair
                    elif op == BenchOp.REDUCE_SCATTER:
                        rs_lat, rs_per_byte = pair
                    else:
                        ar_lat, ar_per_byte = pair
        # FSDP2's own cost per module on each all-gather and reduce-scatter (calibrated CPU ranks;
        # planner.measure.calibrate.FsdpOverhead): the block, and the stage's embedding / head
        fs = cal.fsdp if cal is not None else None
        fs_a = fs.op_s(flops.layer_tensors("block", model), params_a * e) if fs is not None else 0.0
        fs_b = 0.0
        if fs is not None:
            fs_b = sum(
                fs.op_s(
                    flops.layer_tensors(r.key.layer_kind, model),
                    flops.layer_params(r.key.layer_kind, model, ctx.tp) * e,
                )
                for r in rows_const
            )
        # what the runtime hides of each dp term, behind which compute (planner.cost.overlap); a
        # calibrated runtime's measured overlap replaces its fractions
        dpt = OV.dp_terms(
            rt,
            ctx.sharding,
            OV.Collective(ag_lat, ag_per_byte),
            OV.Collective(rs_lat, rs_per_byte),
            OV.Collective(ar_lat, ar_per_byte),
            (params_a * e, slow_blk * fwd_block, bwd_a),
            [
                (flops.layer_params(r.key.layer_kind, model, ctx.tp) * e, slow * r.forward_s, slow * r.backward_s)
                for r in rows_const
            ],
            (fs_a, fs_b),
            cal.grad_sync_overlap if cal is not None else None,
            OV.megatron_bucket_params(d) * e,
        )
        zero3_a, zero3_b, e0, e1, g0, g1 = dpt.zero3_a, dpt.zero3_b, dpt.e0, dpt.e1, dpt.g0, dpt.g1
        if ctx.sharding == "none" and rt.grad_buckets_packed:
            # GradSumSync's bucket copies run after the backward, in line with the all-reduces
            g1 += F.grad_pack_s(packed("block", params_a), ctx.memory_bandwidth_bytes_per_s)
            g0 += F.grad_pack_s(packed_b, ctx.memory_bandwidth_bytes_per_s)
    shard = d if ctx.sharding != "none" else 1
    # parameters are DTensors under TP and under FSDP2's ZeRO (worker.parallel), plain otherwise
    adam_s = None
    if cal is not None:
        if ctx.sharding != "none" and d > 1:
            adam_s = cal.adam_fsdp_s_per_param or cal.adam_dtensor_s_per_param
        elif ctx.tp > 1:
            adam_s = cal.adam_dtensor_s_per_param
        adam_s = adam_s or cal.adam_s_per_param
    if adam_s:
        # the measured optimizer step per parameter; ranks that stepped at once when it was measured
        # held their lockstep already (planner.measure.calibrate)
        adam_slow = cal.slowdown(real_group=cal.adam_num_ranks > 1)  # type: ignore[union-attr]
        o1, o0 = (adam_slow * adam_s * n / shard for n in (params_a, params_b))
    else:
        adam_b = (
            cal.adam_bytes_per_param if cal is not None and cal.adam_bytes_per_param else F.ADAM_BYTES_MOVED_PER_PARAM
        )
        o1 = F.adam_step_s(params_a / shard, ctx.memory_bandwidth_bytes_per_s, adam_b)
        o0 = F.adam_step_s(params_b / shard, ctx.memory_bandwidth_bytes_per_s, adam_b)

    bpp = F.state_bytes_per_param(ctx.dtype, ctx.sharding, d)
    state_a = params_a * bpp
    state_b = params_b * bpp
    if ctx.sharding == "zero3" and d > 1:
        largest = max([params_a] + [float(flops.layer_params(r.key.layer_kind, model, ctx.tp)) for r in rows_const])
        state_b += M.zero3_working_bytes(largest, params_a, ctx.dtype)
    act_a = lt.act_a
    mem_a = state_a + ctx.inflight * act_a
    mem_b = state_b + ctx.inflight * act_b
    return StageCoeffs(
        compute_a=compute_a,
        compute_b=compute_b,
        tp_a=tp_a,
        tp_b=tp_b,
        zero3_a=zero3_a,
        zero3_b=zero3_b,
        p2p_b=p2p_b,
        bwd_a=bwd_a,
        bwd_b=bwd_b,
        e0=e0,
        e1=e1,
        g0=g0,
        g1=g1,
        o0=o0,
        o1=o1,
        params_a=params_a,
        params_b=params_b,
        state_a=state_a,
        state_b=state_b,
        act_a=act_a,
        act_b=act_b,
        mem_a=mem_a,
        mem_b=mem_b,
        workspace_bytes=workspace,
    )
