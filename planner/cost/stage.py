"""Per-stage cost coefficients: everything a stage costs, as linear functions of its block count n.

A stage with n blocks costs, per micro-batch, time_s(n) = time_s_per_block·n + time_s_fixed
(compute from profiles, TP collectives unless a block's profile already holds them, data-parallel
traffic paid in every micro-batch such as ZeRO-3 gathers, p2p sends to the next stage); after the
pipeline drains its tail is
    max(0, grad_sync_s_fixed + grad_sync_s_per_block·n)     gradient sync not hidden by the last backward
    + drain_s_fixed + drain_s_per_block·n                    ZeRO-1/2 parameter all-gather or, unsharded,
                                                              the gradient bucket copies; last reduce-scatter
    + optimizer_s_fixed + optimizer_s_per_block·n            Adam step
and its allocation is memory_bytes_per_block·n + memory_bytes_fixed (+ the workspace). `estimate`
evaluates these at the plan's n, and the search evaluates them for every n at once, so the two agree
by construction. Everything "_fixed" is the stage's embedding / head / boundary share, everything
"_per_block" one transformer block's.

`StageContext.calib` (planner.measure.calibrate, passed by `estimate(..., calibration=...)`; the search
passes none) swaps datasheet assumptions for measured ones: profiled times × the rank contention
slowdown, gloo's fitted all_reduce / all_gather / reduce_scatter instead of ring formulas on the
send/recv link, the measured overlap of gradient sync, and the optimizer's bytes per parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from planner.cost import formulas as F
from planner.cost import memory as M
from planner.cost import nccl as N
from planner.cost import overlap as OV
from planner.cost.compute import (
    Device,
    attention_train_s,
    cp_shape_delta_s,
    loss_time_delta_s,
    stack_time_delta_s,
)
from planner.cost.devices import Link
from planner.measure.calibrate import Calibration
from planner.measure.ops import BenchOp
from planner.measure.profiles import LayerProfile, ProfileKey, ProfileTable
from planner.specs import flops
from planner.specs.flops import DTYPE_BYTES, LayerKind
from planner.specs.model import ModelSpec


class Overheads(NamedTuple):
    """A runtime's fixed costs as terms of every stage (planner.cost.runtimes.Pricing), so that the
    search, which prices stages, and `estimate` price them alike: on a GPU a block's forward and
    backward take at least the host's time to issue their kernels (3 × `issue_s`: the backward issues
    twice the forward's kernels; a recomputed block 4 ×), and every micro-batch of a pipeline rank pays
    `microbatch_s` (schedule bookkeeping, syncs, blocking handshakes; under interleaved 1F1B a rank's
    v chunks pay 1/v of it each: estimate and search/interleave.py). Zero: meshplan's plain prices."""

    issue_s: float = 0.0  # host time to issue one block's forward kernels (launch_s × kernels_per_block)
    microbatch_s: float = 0.0  # fixed serialised cost of one micro-batch on one stage


NO_OVERHEADS = Overheads()


class StageContext(NamedTuple):
    """What a stage's cost depends on besides its block count (hashable, so coefficients memoise; a
    named tuple: a search builds ~10,000 and hashes them, which a frozen dataclass makes slow)."""

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
    cp_link: Link | None = None  # the ring of the stage's cp group (stack.cp > 1)
    overheads: Overheads = NO_OVERHEADS  # the runtime's fixed costs (Overheads)
    # the first or last stage of a pipeline whose runtime syncs a tied embedding (tied_embedding_sync_s):
    # the path between the two stages' ranks; None elsewhere (the search prices no runtime that has it)
    tied_link: Link | None = None
    # the last stage's earlier outputs its runtime still holds at a forward (formulas.stale_output_copies
    # under Runtime.last_stage_keeps_outputs; 0 elsewhere, and in the search)
    stale_outputs: int = 0


class StageCoeffs(NamedTuple):
    """One stage's cost terms (module docstring): seconds per micro-batch unless a name says per step
    (the tail terms), bytes on one device, parameters one tp rank holds. `_per_block` multiplies the
    stage's block count n, `_fixed` is its embedding / head / boundary share. Immutable; a named
    tuple, not a frozen dataclass, because a search builds ~10,000 of them and a frozen dataclass
    sets each of its 24 fields through object.__setattr__."""

    compute_s_per_block: float  # forward + backward of one block (profiled, × contention slowdown)
    compute_s_fixed: float  # forward + backward of the embedding and / or head
    tp_comm_s_per_block: float  # a block's TP all-reduces, what the runtime leaves exposed
    tp_comm_s_fixed: float  # the vocab-parallel embedding's / head's all-reduce
    dp_comm_s_per_block: float  # dp traffic in every micro-batch: ZeRO-3 gathers, per-micro-batch reduce-scatters
    dp_comm_s_fixed: float
    p2p_s_fixed: float  # boundary send of the activation and receive of its gradient (next stage)
    backward_s_per_block: float  # the backward part of compute_s_per_block (what hides gradient sync)
    backward_s_fixed: float
    grad_sync_s_fixed: float  # per step, after the last backward: max(0, fixed + per_block·n)
    grad_sync_s_per_block: float
    drain_s_fixed: float  # per step, after the pipeline drains: ZeRO-1/2 gathers, last reduce-scatter, bucket copies
    drain_s_per_block: float
    optimizer_s_fixed: float  # per step: Adam over the stage's (sharded) parameters
    optimizer_s_per_block: float
    num_params_per_block: float  # parameters one tp rank holds
    num_params_fixed: float
    state_bytes_per_block: float  # weights, gradients, optimizer states (sharded by ZeRO)
    state_bytes_fixed: float  # + ZeRO-3's working buffers
    activation_bytes_per_block: float  # kept for backward, per micro-batch in flight
    activation_bytes_fixed: float
    memory_bytes_per_block: float  # state + in-flight micro-batches × activations
    memory_bytes_fixed: float
    workspace_bytes: float  # the largest transient buffer of one layer's forward / backward
    cp_comm_s_per_block: float = 0.0  # of tp_comm_s_per_block: context parallelism's exposed K/V exchange

    @property
    def time_s_per_block(self) -> float:
        return self.compute_s_per_block + self.tp_comm_s_per_block + self.dp_comm_s_per_block

    @property
    def time_s_fixed(self) -> float:
        return self.compute_s_fixed + self.tp_comm_s_fixed + self.dp_comm_s_fixed + self.p2p_s_fixed

    def time_s(self, n: int) -> float:
        return self.time_s_per_block * n + self.time_s_fixed

    def tail_s(self, n: int) -> float:
        return (
            max(0.0, self.grad_sync_s_fixed + self.grad_sync_s_per_block * n)
            + self.drain_s_fixed
            + self.drain_s_per_block * n
            + self.optimizer_s_fixed
            + self.optimizer_s_per_block * n
        )


def _row(profiles: ProfileTable, ctx: StageContext, layer: str, recompute: bool):
    return profiles.lookup(ProfileKey(ctx.kind, layer, ctx.mbs, ctx.seq, ctx.tp, recompute, ctx.dtype))  # type: ignore[arg-type]


def p2p_boundary_bytes(hidden_bytes: float, tp: int, next_tp: int, seq: int, rt: OV.Runtime) -> tuple[float, float]:
    """(forward, backward) bytes one rank sends across a stage boundary per micro-batch. With equal tp
    each rank sends 1/tp of the activation and of its gradient (Megatron's scatter/gather optimisation,
    Narayanan et al. SC'21 §4.1). A runtime may send more (planner.cost.overlap.Runtime):
    `p2p_sends_attention_mask`: the [1, 1, s, s] causal mask travels with every activation, cast to
    fp16 (2·s² bytes: DeepSpeed's PipelineEngine casts it with .half() because NCCL sends no bool
    tensors, Megatron-LM v1.1.5's GPT2ModelPipe passes it between stages), whole on every tp rank;
    `p2p_grad_whole`: the gradient goes back whole on every tp rank (DeepSpeed's is_grad_partitioned
    = False: only the forward activation is a PartitionedTensor)."""
    part = hidden_bytes / min(tp, next_tp)
    fwd = part + (DTYPE_BYTES["fp16"] * seq * seq if rt.p2p_sends_attention_mask else 0.0)
    bwd = hidden_bytes if rt.p2p_grad_whole else part
    return fwd, bwd


def boundary_p2p_s(
    hidden_bytes: float,
    tp: int,
    next_tp: int,
    link: Link,
    calib: Calibration | None,
    rt: OV.Runtime = OV.MESHPLAN,
    seq: int = 0,
) -> float:
    """One micro-batch at a stage boundary: the activation forward and its gradient backward, each
    one α–β message of `p2p_boundary_bytes` (what the runtime `rt` sends; `seq` its mask's size),
    plus the schedule's own measured cost (planner.measure.calibrate.pipeline_overhead_s).
    stage_coeffs and the search's arrays price every boundary with this one function."""
    fwd, bwd = p2p_boundary_bytes(hidden_bytes, tp, next_tp, seq, rt)
    bw, lat = link.bandwidth_bytes_per_s, link.latency_s
    p2p = F.p2p_s(fwd, bw, lat) + F.p2p_s(bwd, bw, lat)
    return p2p + (calib.pipeline_overhead_s if calib is not None else 0.0)


@dataclass(frozen=True, slots=True)
class LocalTerms:
    """The part of a stage's coefficients that its data parallelism, sharding and neighbours leave
    alone: profile rows, compute, TP all-reduces, the embedding / head, activations and workspace.
    A function of the context's kind, dtype, mbs, seq, tp, recompute, first, last, pp (last stage
    only: `stage_coeffs` reads pp > 1 there), stack, device, calib and tp_link, so a search that
    prices many contexts sharing those computes it once (planner.search.arrays.Pricer). Model
    figures the dp terms read per context (parameters and tensors of each layer) are kept here too."""

    blk: LayerProfile
    plain: LayerProfile
    hidden_bytes: float
    slow: float  # contention slowdown of a layer timed alone
    slow_blk: float  # of the block row (1 if it ran in lockstep on a real tp group)
    tp_comm_s_per_block: float
    fwd_block_s: float
    compute_s_per_block: float
    backward_s_per_block: float
    compute_s_fixed: float
    tp_comm_s_fixed: float
    backward_s_fixed: float
    num_params_per_block: float
    num_params_fixed: float
    packed_bytes_fixed: float  # embedding / head gradient bytes the bucket copies (`_packed_bytes`)
    packed_bytes_per_block: float
    activation_bytes_per_block: float
    activation_bytes_fixed: float
    workspace_bytes: float
    rows_const: tuple[LayerProfile, ...]  # the embedding and / or head rows
    const_params: tuple[int, ...]  # parameters of each row of rows_const on one tp rank (no tied copy)
    block_tensors: int
    const_tensors: tuple[int, ...]
    cp_comm_s_per_block: float = 0.0  # context parallelism's K/V exchange, included in tp_comm_s_per_block


@dataclass(frozen=True, slots=True)
class _Ends:
    """The embedding / head share of a stage (`_end_terms`)."""

    compute_s: float = 0.0
    backward_s: float = 0.0
    tp_comm_s: float = 0.0
    num_params: float = 0.0
    packed_bytes: float = 0.0
    activation_bytes: float = 0.0
    workspace_bytes: float = 0.0
    rows: tuple[LayerProfile, ...] = ()


def _packed_bytes(kind: LayerKind, params: float, model: ModelSpec, tp: int, e: int) -> float:
    """Gradient bytes GradSumSync copies through its bucket buffer: layers whose largest tensor is
    smaller than F.GRAD_BUCKET_BYTES."""
    small = flops.largest_tensor_params(kind, model, tp) * e < F.GRAD_BUCKET_BYTES
    return params * e if small else 0.0


def _tp_allreduce_s(ctx: StageContext, hidden_bytes: float) -> float:
    """One all-reduce of a block's output over the tp group: the calibrated fit, else the ring
    (`hidden_bytes`: this rank's tokens, seq / cp of them under context parallelism)."""
    ar_fit = ctx.calib.fit(BenchOp.ALL_REDUCE) if ctx.calib is not None else None
    if ar_fit is not None:
        return ar_fit.time_s(hidden_bytes, ctx.tp)
    tl = ctx.tp_link
    if N.uses_nccl(tl):
        # GPU ranks: NCCL's algorithm and protocol for this size (planner.cost.nccl)
        return N.collective_s(BenchOp.ALL_REDUCE, hidden_bytes, ctx.tp, tl)
    return F.allreduce_s(hidden_bytes, ctx.tp, tl.bandwidth_bytes_per_s, tl.latency_s, tl.num_nodes)


def _block_times(
    ctx: StageContext, model: ModelSpec, blk: LayerProfile, plain: LayerProfile, f_rec: float
) -> tuple[float, float]:
    """(forward s, backward s) of one block under the stage's stack: a fraction f_rec of recomputed
    blocks, selective recompute's second attention forward, the stack's kernels on a GPU."""
    st = ctx.stack
    bwd_block = f_rec * blk.backward_s + (1 - f_rec) * plain.backward_s
    shape = (model, ctx.mbs, ctx.seq, ctx.tp, ctx.dtype)
    if st.selective and st.selective_op and not ctx.recompute:
        # torchtitan's per-op policy runs the mms it did not save again (memory.op_sac_recompute_flops),
        # at the block forward's rate
        redo = M.op_sac_recompute_flops(model, ctx.mbs, ctx.seq, ctx.tp)
        bwd_block += plain.forward_s * redo / flops.block_forward_flops(model, ctx.mbs, ctx.seq, ctx.tp)
    elif st.selective and not ctx.recompute:
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
    return fwd_block, bwd_block


def _end_terms(
    ctx: StageContext, model: ModelSpec, profiles: ProfileTable, slow: float, tp_ar: float, workspace: float
) -> _Ends:
    """The first stage's embedding and the last stage's head: compute, their one vocab-parallel
    all-reduce each (Megatron-LM), parameters, bucket copies, kept activations and workspace."""
    e = DTYPE_BYTES[ctx.dtype]
    mem_args = (model, ctx.mbs, ctx.seq, ctx.tp, ctx.dtype, ctx.stack)
    compute = bwd = tp = params = packed = act = 0.0
    rows: list[LayerProfile] = []
    if ctx.first:
        emb = _row(profiles, ctx, "embedding", False)
        rows.append(emb)
        compute += slow * emb.train_s
        bwd += slow * emb.backward_s
        tp += tp_ar  # vocab-parallel embedding: one all-reduce of its output
        emb_params = flops.layer_params("embedding", model, ctx.tp)
        params += emb_params
        packed += _packed_bytes("embedding", emb_params, model, ctx.tp, e)
        act += emb.activation_bytes
        workspace = max(workspace, emb.workspace_bytes)
    if ctx.last:
        head = _row(profiles, ctx, "head", False)
        rows.append(head)
        compute += slow * head.train_s
        bwd += slow * head.backward_s
        if ctx.device is not None and ctx.stack.loss != M.RUNTIME.loss:
            # the stack's loss kernel vs the runtime's, which the head row holds (compute.loss_time_delta_s)
            lf, lb = loss_time_delta_s(model, ctx.mbs, ctx.seq, ctx.tp, ctx.dtype, ctx.device, ctx.stack.loss)
            compute, bwd = compute + slow * (lf + lb), bwd + slow * lb
        tp += tp_ar  # vocab-parallel head: one all-reduce of the input gradient
        head_params = flops.layer_params("head", model, ctx.tp)
        if model.tied and ctx.pp > 1:
            # the last stage keeps its own copy of a tied embedding for the LM head (Megatron-LM)
            head_params += -(-model.padded_vocab * model.hidden // ctx.tp)
        params += head_params
        packed += _packed_bytes("head", head_params, model, ctx.tp, e)
        head_kept, head_work = M.head_bytes(*mem_args, head.activation_bytes, head.workspace_bytes)
        act += head_kept
        workspace = max(workspace, head_work)
    c = ctx.stack.cp  # each cp rank embeds / projects seq / cp tokens
    return _Ends(compute / c, bwd / c, tp, params, packed, act / c, workspace / c, tuple(rows))


def local_terms(ctx: StageContext, model: ModelSpec, profiles: ProfileTable) -> LocalTerms:
    """`LocalTerms` of a stage: the block's profile rows, times, TP all-reduces and kept bytes, then
    its ends (`_end_terms`)."""
    st = ctx.stack
    blk = _row(profiles, ctx, "block", ctx.recompute)
    # every k-th block recomputed: the stage mixes recomputed blocks (fraction f) with plain ones
    f_rec = 1.0 / st.recompute_every if ctx.recompute else 0.0
    plain = _row(profiles, ctx, "block", False) if f_rec < 1.0 else blk
    # this rank's tokens: seq / cp under context parallelism (the TP all-reduces and p2p carry them)
    c = st.cp
    hidden_bytes = flops.block_input_bytes(model, ctx.mbs, ctx.seq, ctx.dtype) / c
    cal = ctx.calib
    # profiles time one process alone; ranks sharing a node's cores, and meeting after every
    # micro-batch, run slower by these measured factors (a block timed on a real tp group ran in
    # lockstep already)
    slow = cal.slowdown() if cal is not None else 1.0
    slow_blk = cal.slowdown(real_group=blk.tp_comm_included) if cal is not None else 1.0
    tp_ar = _tp_allreduce_s(ctx, hidden_bytes)
    # a block profiled on a real tp group already holds its all-reduces (and their waits)
    per_block_ar = f_rec * F.tp_allreduces_per_block(True) + (1 - f_rec) * F.tp_allreduces_per_block(False)
    tp_a = 0.0 if blk.tp_comm_included else per_block_ar * tp_ar
    fwd_block, bwd_block = _block_times(ctx, model, blk, plain, f_rec)
    # context parallelism (load-balanced causal chunks): a rank's linears, norms and MLP run on 1/cp
    # of the tokens and its attention on 1/cp of the causal s×s work (chunk pair c, 2cp−1−c holds
    # (c + ½ + 2cp − 1 − c + ½)·(s/2cp)² = 2cp·(s/2cp)² of s²/2), so one block costs 1/cp of the
    # whole-sequence block (rows priced at seq, no new profile keys); the K/V exchange on top
    fwd_block, bwd_block = fwd_block / c, bwd_block / c
    if c > 1 and ctx.device is not None:
        # on a GPU, the linears' smaller GEMMs on seq / cp tokens (compute.cp_shape_delta_s);
        # recomputed blocks run the forward's part again
        dfwd, dbwd = cp_shape_delta_s(model, ctx.mbs, ctx.seq, ctx.tp, ctx.dtype, ctx.device, c)
        fwd_block, bwd_block = fwd_block + dfwd, bwd_block + dbwd + f_rec * dfwd
    cp_a = 0.0
    if c > 1:
        assert ctx.cp_link is not None, "a cp stage is priced with its cp group's link"
        kv = M.cp_gathered_kv_bytes(model, ctx.mbs, ctx.seq, ctx.tp, ctx.dtype)
        cl = ctx.cp_link
        cp_a = F.cp_kv_exchange_s(kv, c, cl.bandwidth_bytes_per_s, cl.latency_s, f_rec)
    params_a = float(flops.layer_params("block", model, ctx.tp))
    mem_args = (model, ctx.mbs, ctx.seq, ctx.tp, ctx.dtype, st)
    workspace = M.block_workspace_bytes(*mem_args, float(blk.workspace_bytes), ctx.recompute)
    ends = _end_terms(ctx, model, profiles, slow, tp_ar, workspace)
    # under cp a rank keeps 1/cp of the whole-sequence bytes, plus the other ranks' gathered K, V
    kept_plain = M.block_kept_bytes(*mem_args, float(plain.activation_bytes)) / c
    kept_plain += M.cp_kept_kv_bytes(*mem_args)
    kept_rec = float(blk.activation_bytes) / (ctx.tp if st.sequence_parallel and ctx.tp > 1 else 1) / c
    act_a = M.block_mixed_kept_bytes(kept_plain, kept_rec, st.recompute_every) if ctx.recompute else kept_plain
    e = DTYPE_BYTES[ctx.dtype]
    compute_a, compute_b = slow_blk * (fwd_block + bwd_block), ends.compute_s
    ov = ctx.overheads
    if ov.issue_s and ctx.device is not None:
        # a GPU block cannot run faster than its host issues its kernels (Overheads)
        compute_a = max(compute_a, (3.0 + f_rec) * ov.issue_s)
    if ov.microbatch_s:
        compute_b += ov.microbatch_s
    return LocalTerms(
        blk=blk,
        plain=plain,
        hidden_bytes=hidden_bytes,
        slow=slow,
        slow_blk=slow_blk,
        tp_comm_s_per_block=tp_a + cp_a,
        fwd_block_s=fwd_block,
        compute_s_per_block=compute_a,
        backward_s_per_block=slow_blk * bwd_block,
        compute_s_fixed=compute_b,
        tp_comm_s_fixed=ends.tp_comm_s,
        backward_s_fixed=ends.backward_s,
        num_params_per_block=params_a,
        num_params_fixed=ends.num_params,
        packed_bytes_fixed=ends.packed_bytes,
        packed_bytes_per_block=_packed_bytes("block", params_a, model, ctx.tp, e),
        activation_bytes_per_block=act_a,
        activation_bytes_fixed=ends.activation_bytes,
        workspace_bytes=ends.workspace_bytes,
        rows_const=ends.rows,
        const_params=tuple(flops.layer_params(r.key.layer_kind, model, ctx.tp) for r in ends.rows),
        block_tensors=flops.layer_tensors("block", model),
        const_tensors=tuple(flops.layer_tensors(r.key.layer_kind, model) for r in ends.rows),
        cp_comm_s_per_block=cp_a,
    )


def _p2p_s(ctx: StageContext, model: ModelSpec, hidden_bytes: float) -> float:
    """The boundary to the next stage (0 on the last): with stages of different dp a leader sends its
    slice and the next one receives its own, in pieces (planner.runtime.boundary_pieces); the larger
    of the two bounds the boundary."""
    if ctx.next_link is None:
        return 0.0
    wide = hidden_bytes if ctx.next_mbs <= ctx.mbs else flops.block_input_bytes(model, ctx.next_mbs, ctx.seq, ctx.dtype)
    return boundary_p2p_s(wide, ctx.tp, ctx.next_tp, ctx.next_link, ctx.calib, ctx.runtime, ctx.seq)


def tied_embedding_sync_s(ctx: StageContext, model: ModelSpec) -> float:
    """Once a step, on the first and the last stage of a pipeline under a runtime that keeps a tied
    embedding on both (planner.cost.overlap.Runtime.tied_embedding_allreduce): one all-reduce of the
    embedding's gradient (padded vocabulary × hidden / tp elements in the training dtype) between the two
    stages' ranks over `ctx.tied_link`, a two-rank ring: bytes / bw + 2α (formulas.ring_allreduce_s),
    or NCCL's choice for it on GPU links. 0 without pp, tying or the runtime's flag."""
    link = ctx.tied_link
    if link is None or ctx.pp <= 1 or not model.tied or not ctx.runtime.tied_embedding_allreduce:
        return 0.0
    if not (ctx.first or ctx.last):
        return 0.0
    nbytes = -(-model.padded_vocab * model.hidden // ctx.tp) * DTYPE_BYTES[ctx.dtype]
    if N.uses_nccl(link):
        return N.collective_s(BenchOp.ALL_REDUCE, nbytes, 2, link)
    return F.ring_allreduce_s(nbytes, 2, link.bandwidth_bytes_per_s, link.latency_s)


def _grad_ranks(ctx: StageContext) -> int:
    """Ranks a stage's gradients sum over (and ZeRO shards over): its dp replicas × its cp ranks, which
    hold the same parameters and each see 1/cp of every sample's tokens (torchtitan's dp_shard × cp)."""
    return ctx.dp * ctx.stack.cp


def _dp_collectives(
    ctx: StageContext, gather_bytes: float = 0.0, bucket_bytes: float = 0.0
) -> tuple[OV.Collective, OV.Collective, OV.Collective]:
    """(all-gather, reduce-scatter, all-reduce) over the stage's d replicas, each as (latency s, s per
    byte of the whole buffer). On GPU ranks NCCL's choice of algorithm and protocol (planner.cost.nccl)
    for the message each is priced at: a block's weights (`gather_bytes`: ZeRO's per-layer gathers and
    scatters) and a gradient bucket (`bucket_bytes`); on CPU ranks (gloo) ring formulas on the ring's
    bus bandwidth (devices.cross_node_link: k NIC shares per node), the all-reduce at the lower
    ring/tree latency; the op's own measured fit when calibrated. Under context parallelism gradients
    sum over dp × cp ranks (`_grad_ranks`)."""
    d, dl, cal = _grad_ranks(ctx), ctx.dp_link, ctx.calib
    bw, lat = dl.bandwidth_bytes_per_s, dl.latency_s
    if N.uses_nccl(dl) and d > 1:
        g = N.choose(BenchOp.ALL_GATHER, max(gather_bytes, 1.0), d, dl)
        r = N.choose(BenchOp.REDUCE_SCATTER, max(gather_bytes, 1.0), d, dl)
        a = N.choose(BenchOp.ALL_REDUCE, max(bucket_bytes, 1.0), d, dl)
        ag = OV.Collective(g.latency_s, 1.0 / g.algbw_bytes_per_s)
        rs = OV.Collective(r.latency_s, 1.0 / r.algbw_bytes_per_s)
        ar = OV.Collective(a.latency_s, 1.0 / a.algbw_bytes_per_s)
    else:
        ag = rs = OV.Collective((d - 1) * lat, (d - 1) / d / bw)
        ar = OV.Collective(F.allreduce_latency_s(d, lat, dl.num_nodes), 2 * (d - 1) / d / bw)
    if cal is None:
        return ag, rs, ar
    fits = [cal.fit(op) for op in (BenchOp.ALL_GATHER, BenchOp.REDUCE_SCATTER, BenchOp.ALL_REDUCE)]
    ring = (ag, rs, ar)
    return tuple(OV.Collective(*f.coeffs(d)) if f is not None else c for f, c in zip(fits, ring, strict=True))  # type: ignore[return-value]


def grad_wire_bytes(dtype: str, sharding: str, rt: OV.Runtime) -> int:
    """Bytes one gradient element takes in the data-parallel collectives: the training dtype's, or 4
    where the runtime all-reduces unsharded gradients as fp32 copies (DeepSpeed's fp32_allreduce:
    engine.allreduce_bucket casts the flattened bucket with .float() before dist.all_reduce)."""
    if rt.grad_allreduce_fp32 and sharding == "none":
        return DTYPE_BYTES["fp32"]
    return DTYPE_BYTES[dtype]


def _dp_terms(ctx: StageContext, lt: LocalTerms, rt: OV.Runtime) -> OV.DpTerms:
    """The stage's exposed data-parallel time (planner.cost.overlap.dp_terms: what the runtime hides
    of each term, behind which compute; a calibrated runtime's measured overlap replaces its
    fractions), plus, unsharded, GradSumSync's bucket copies after the backward. Gradients travel at
    `grad_wire_bytes` each (fp32 under a runtime that all-reduces fp32 copies)."""
    if _grad_ranks(ctx) <= 1:
        return OV.DpTerms()
    e, cal = grad_wire_bytes(ctx.dtype, ctx.sharding, rt), ctx.calib
    params_a = lt.num_params_per_block
    # FSDP2's own cost per module on each all-gather and reduce-scatter (calibrated CPU ranks;
    # planner.measure.calibrate.FsdpOverhead): the block, and the stage's embedding / head
    fs = cal.fsdp if cal is not None else None
    fs_a = fs.op_s(lt.block_tensors, params_a * e) if fs is not None else 0.0
    fs_b = 0.0
    if fs is not None:
        fs_b = sum(fs.op_s(t, p * e) for t, p in zip(lt.const_tensors, lt.const_params, strict=True))
    consts = [
        (p * e, lt.slow * r.forward_s, lt.slow * r.backward_s)
        for r, p in zip(lt.rows_const, lt.const_params, strict=True)
    ]
    bucket = OV.megatron_bucket_params(_grad_ranks(ctx)) * e if rt.bucketed_grad_sync else F.GRAD_BUCKET_BYTES
    dpt = OV.dp_terms(
        rt,
        ctx.sharding,
        *_dp_collectives(ctx, params_a * e, bucket),
        (params_a * e, lt.slow_blk * lt.fwd_block_s, lt.backward_s_per_block),
        consts,
        (fs_a, fs_b),
        cal.grad_sync_overlap if cal is not None else None,
        OV.megatron_bucket_params(_grad_ranks(ctx)) * e,
    )
    if ctx.sharding == "none" and rt.grad_buckets_packed:
        # GradSumSync's bucket copies run after the backward, in line with the all-reduces
        bw = ctx.memory_bandwidth_bytes_per_s
        g1 = dpt.g1 + F.grad_pack_s(lt.packed_bytes_per_block, bw)
        g0 = dpt.g0 + F.grad_pack_s(lt.packed_bytes_fixed, bw)
        dpt = OV.DpTerms(dpt.zero3_a, dpt.zero3_b, dpt.e0, dpt.e1, g0, g1)
    return dpt


def _optimizer_s(ctx: StageContext, lt: LocalTerms) -> tuple[float, float]:
    """(per block, fixed) seconds of the optimizer step over the stage's parameters, sharded by ZeRO:
    the measured step per parameter when calibrated (parameters are DTensors under TP and under
    FSDP2's ZeRO, worker.parallel, plain otherwise), else Adam's bytes over memory bandwidth."""
    cal, d = ctx.calib, _grad_ranks(ctx)
    shard = d if ctx.sharding != "none" else 1
    params = (lt.num_params_per_block, lt.num_params_fixed)
    adam_s = None
    if cal is not None:
        if ctx.sharding != "none" and d > 1:
            adam_s = cal.adam_fsdp_s_per_param or cal.adam_dtensor_s_per_param
        elif ctx.tp > 1:
            adam_s = cal.adam_dtensor_s_per_param
        adam_s = adam_s or cal.adam_s_per_param
    if adam_s:
        # ranks that stepped at once when it was measured held their lockstep already
        adam_slow = cal.slowdown(real_group=cal.adam_num_ranks > 1)  # type: ignore[union-attr]
        o1, o0 = (adam_slow * adam_s * n / shard for n in params)
        return o1, o0
    adam_b = cal.adam_bytes_per_param if cal is not None and cal.adam_bytes_per_param else F.ADAM_BYTES_MOVED_PER_PARAM
    bw = ctx.memory_bandwidth_bytes_per_s
    return F.adam_step_s(params[0] / shard, bw, adam_b), F.adam_step_s(params[1] / shard, bw, adam_b)


def _scalar_allreduce_s(ctx: StageContext, n: int, link: Link) -> float:
    """One all-reduce of a 4-byte scalar over n ranks: discovery's smallest all-reduce where calibrated
    (Calibration.scalar_allreduce_s), else the calibrated fit, else NCCL's or the ring's price."""
    if n <= 1:
        return 0.0
    small = ctx.calib.scalar_allreduce_s(n) if ctx.calib is not None else None
    if small is not None:
        return small
    fit = ctx.calib.fit(BenchOp.ALL_REDUCE) if ctx.calib is not None else None
    if fit is not None:
        return fit.time_s(4.0, n)
    if N.uses_nccl(link):
        return N.collective_s(BenchOp.ALL_REDUCE, 4.0, n, link)
    return F.allreduce_s(4.0, n, link.bandwidth_bytes_per_s, link.latency_s, link.num_nodes)


def _grad_norm_s(ctx: StageContext, lt: LocalTerms, model: ModelSpec) -> tuple[float, float]:
    """(per block, fixed) seconds of the collectives of meshplan's per-step gradient norm; 0 under
    other runtimes.

    worker.train takes the whole model's gradient norm every step, between the gradient sync and
    the optimizer step (worker/clip.py global_grad_norm: the divergence check, and clipping when
    asked). Its `torch.linalg.vector_norm` of each gradient reads the rank's gradient bytes once
    (~1 % of an optimizer step, which reads and writes them and three states: left out). What waits:
    - a gradient that is a sharded DTensor has a partial norm, made whole by `full_tensor`: one
      all-reduce of a scalar per such tensor over its mesh: the tp group for the block's tp-sharded
      linears (flops.tp_sharded_tensors), the dp group for every FSDP2-sharded tensor of the stage
      (flops.layer_tensors of its blocks, embedding and head);
    - one all-reduce of three scalars over the world (norm², the non-finite flag and the logged loss),
      booked on every stage (an interleaved rank holding several stages pays it once: ~α over).
    CPU ranks only: gloo's scalar all-reduce costs ~0.1–0.5 ms (discovery's smallest all-reduce), a
    sharded stage's dozens of them a visible share of its step. On GPUs each is an NCCL launch of
    ~10–20 µs that nothing here has measured; left out there, GPU prices and picks unchanged.
    """
    if ctx.runtime.name != OV.MESHPLAN.name or ctx.kind != "cpu":
        return 0.0, 0.0
    d = _grad_ranks(ctx)
    fsdp = ctx.sharding != "none" and d > 1
    ar_tp = _scalar_allreduce_s(ctx, ctx.tp, ctx.tp_link) if ctx.tp > 1 else 0.0
    ar_dp = _scalar_allreduce_s(ctx, d, ctx.dp_link) if fsdp else 0.0
    per_block = flops.tp_sharded_tensors(model) * ar_tp + lt.block_tensors * ar_dp
    fixed = sum(lt.const_tensors) * ar_dp
    world = ctx.pp * d * ctx.tp
    # priced on the stage's own group link (a scalar: latency only), the same for every stage of a pipeline
    fixed += _scalar_allreduce_s(ctx, world, ctx.dp_link if d > 1 else ctx.tp_link) if world > 1 else 0.0
    return per_block, fixed


def _state_bytes(ctx: StageContext, lt: LocalTerms, model: ModelSpec) -> tuple[float, float]:
    """(per block, fixed) bytes of weights, gradients and optimizer states under the stage's ZeRO
    sharding, plus ZeRO-3's working buffers (memory.zero3_working_bytes), plus the fp8 weight copy a
    weight-caching runtime holds once a step (memory.fp8_cached_weight_bytes), plus the gradient
    packing buffer of a runtime that packs small gradients for sharding none over dp > 1
    (memory.grad_pack_buffer_bytes)."""
    d = _grad_ranks(ctx)
    bpp = F.state_bytes_per_param(ctx.dtype, ctx.sharding, d)
    state_a = lt.num_params_per_block * bpp + M.fp8_cached_weight_bytes(model, ctx.tp, ctx.stack)
    state_b = lt.num_params_fixed * bpp
    if ctx.sharding == "zero3" and d > 1:
        largest = max([lt.num_params_per_block] + [float(p) for p in lt.const_params])
        state_b += M.zero3_working_bytes(largest, lt.num_params_per_block, ctx.dtype)
    if ctx.sharding == "none" and d > 1 and ctx.runtime.grad_buckets_packed:
        state_b += M.grad_pack_buffer_bytes(model, ctx.tp, ctx.dtype, F.GRAD_BUCKET_BYTES)
    return state_a, state_b


def stage_coeffs(
    ctx: StageContext, model: ModelSpec, profiles: ProfileTable, local: LocalTerms | None = None
) -> StageCoeffs:
    """Coefficients of one stage (see the module docstring); every term cites its formula in `formulas`.
    `local`: `local_terms(ctx, …)` when the caller has it already (equal for contexts that share its key).
    Steps: the local terms, the boundary p2p, what the runtime overlaps of TP and p2p, the dp terms,
    the optimizer step, the state bytes."""
    lt = local if local is not None else local_terms(ctx, model, profiles)
    p2p_b = _p2p_s(ctx, model, lt.hidden_bytes)
    # the runtime's overlap of each term (planner.cost.overlap): TP all-reduces and boundary p2p
    # keep what it does not hide; CPU ranks hide nothing (no side streams)
    rt = ctx.runtime.on_cpu() if ctx.kind == "cpu" else ctx.runtime
    cp_a = lt.cp_comm_s_per_block
    tp_a, tp_b = lt.tp_comm_s_per_block - cp_a, lt.tp_comm_s_fixed
    if rt.tp_overlap:
        tp_a, tp_b = (1 - rt.tp_overlap) * tp_a, (1 - rt.tp_overlap) * tp_b
    if rt.cp_overlap:
        cp_a *= 1 - rt.cp_overlap
    tp_a += cp_a
    if rt.p2p_overlap:
        p2p_b *= 1 - rt.p2p_overlap
    dpt = _dp_terms(ctx, lt, rt)
    o1, o0 = _optimizer_s(ctx, lt)
    # the gradient norm: after the gradient sync, before the optimizer step, booked with the drain
    n1, n0 = _grad_norm_s(ctx, lt, model)
    dpt = OV.DpTerms(dpt.zero3_a, dpt.zero3_b, dpt.e0, dpt.e1, dpt.g0 + n0, dpt.g1 + n1)
    state_a, state_b = _state_bytes(ctx, lt, model)
    act_a, act_b = lt.activation_bytes_per_block, lt.activation_bytes_fixed
    stale_b = 0.0
    if ctx.stale_outputs and ctx.last:
        stale_b = ctx.stale_outputs * M.kept_output_bytes(model, ctx.mbs, ctx.seq, ctx.tp, ctx.dtype, ctx.stack)
    return StageCoeffs(
        compute_s_per_block=lt.compute_s_per_block,
        compute_s_fixed=lt.compute_s_fixed,
        tp_comm_s_per_block=tp_a,
        tp_comm_s_fixed=tp_b,
        dp_comm_s_per_block=dpt.zero3_a,
        dp_comm_s_fixed=dpt.zero3_b,
        p2p_s_fixed=p2p_b,
        backward_s_per_block=lt.backward_s_per_block,
        backward_s_fixed=lt.backward_s_fixed,
        grad_sync_s_fixed=dpt.e0,
        grad_sync_s_per_block=dpt.e1,
        drain_s_fixed=dpt.g0 + tied_embedding_sync_s(ctx, model),
        drain_s_per_block=dpt.g1,
        optimizer_s_fixed=o0,
        optimizer_s_per_block=o1,
        num_params_per_block=lt.num_params_per_block,
        num_params_fixed=lt.num_params_fixed,
        state_bytes_per_block=state_a,
        state_bytes_fixed=state_b,
        activation_bytes_per_block=act_a,
        activation_bytes_fixed=act_b,
        memory_bytes_per_block=state_a + ctx.inflight * act_a,
        memory_bytes_fixed=state_b + ctx.inflight * act_b + stale_b,
        workspace_bytes=lt.workspace_bytes,
        cp_comm_s_per_block=cp_a,
    )
