"""From a Plan to this rank's parallel model: DeviceMesh, stages, TP, recompute, DP.

Where a rank sits (stage, replica, tp index, and which plan device it stands for) and what the
runtime can launch are planner/runtime.py's: ranks are numbered stage-major, replica, tp, so the
mesh below is always the canonical arange layout, whatever the plan's device ids.

The mesh has dims ("pp", "dp", "tp") with mesh[s, r, t] = the rank of stage s, replica r, tp index t,
when every stage has the same tp and dp; otherwise each stage has its own ("dp", "tp") mesh
(worker/stages.py). Either way a part is wrapped over mesh["tp"] and mesh["dp"]. Under context
parallelism (uniform plans) the mesh is ("pp", "dp", "cp", "tp"), cp attention runs over mesh["cp"]
(worker/cp.py) and gradients sum over the flattened dp × cp (`grad_mesh`).

Order of wrapping (torchtitan's): TP → activation checkpointing → DP (FSDP2 / gradient sum), per stage part.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils.checkpoint import checkpoint

from planner.errors import MeshplanError
from planner.runtime import rank_map, stage_ranks, stage_ranks_cp
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan, StagePlan
from worker.model import Decoder, init_weights


@dataclass(frozen=True)
class RankLayout:
    """Where one global rank sits in the plan."""

    rank: int
    stage: int  # pipeline rank (physical stage), 0..pp-1
    replica: int
    tp_index: int
    pp: int
    dp: int
    tp: int
    virtual_stages: tuple[int, ...]  # indices into plan.stages this rank runs, in pipeline order
    device_id: int = -1  # the plan's device this rank stands for
    pipeline: int = 0  # the pipeline replica (batch share) this rank works for
    slice_index: int = 0  # which equal slice of each micro-batch (stages of different dp)
    num_slices: int = 1
    cp_index: int = 0  # context parallelism: which cp rank of its replica (worker/cp.py)
    cp: int = 1

    @property
    def has_first(self) -> bool:
        return self.virtual_stages[0] == 0

    def has_last(self, num_plan_stages: int) -> bool:
        return self.virtual_stages[-1] == num_plan_stages - 1


def rank_layout(plan: Plan, rank: int) -> RankLayout:
    slots = rank_map(plan)
    if not 0 <= rank < len(slots):
        raise MeshplanError(
            "rank", rank, "this rank is not a device of any stage; launch as many ranks as the plan uses"
        )
    sl = slots[rank]
    return RankLayout(
        rank,
        sl.stage,
        sl.replica,
        sl.tp_index,
        plan.pp,
        sl.dp,
        sl.tp,
        sl.virtual_stages,
        sl.device_id,
        sl.pipeline,
        sl.slice_index,
        sl.num_slices,
        sl.cp_index,
        sl.cp,
    )


def mesh_ranks(plan: Plan) -> torch.Tensor:
    """[pp, dp, tp] tensor of global ranks (a uniform plan; see planner/runtime.py), [pp, dp, cp, tp]
    under context parallelism."""
    if plan.cp > 1:
        return torch.tensor([stage_ranks_cp(plan, i) for i in range(plan.pp)])
    return torch.tensor([stage_ranks(plan, i) for i in range(plan.pp)])


def grad_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The ranks a part's gradients sum over: its dp replicas, × its cp ranks under context parallelism."""
    if "cp" not in (mesh.mesh_dim_names or ()):
        return mesh["dp"]
    return mesh["dp", "cp"]._flatten("dp_cp")


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    ranks = mesh_ranks(plan)
    names = ("pp", "dp", "cp", "tp") if plan.cp > 1 else ("pp", "dp", "tp")
    if torch.equal(ranks.flatten(), torch.arange(ranks.numel())):
        return init_device_mesh(device_type, tuple(ranks.shape), mesh_dim_names=names)
    return DeviceMesh(device_type, ranks, mesh_dim_names=names)


def build_stage_part(spec: ModelSpec, plan: Plan, index: int, seed: int, device: torch.device) -> Decoder:
    """Plan stage `index` (a physical or virtual stage) as a Decoder with identically-named, -seeded params."""
    sp = plan.stages[index]
    part = Decoder(spec, layers=(sp.layer_start, sp.layer_end), first=index == 0, last=index == len(plan.stages) - 1)
    init_weights(part, seed, spec.num_layers)
    return part.to(device)


def apply_tp(part: Decoder, spec: ModelSpec, tp_mesh: DeviceMesh, sequence_parallel: bool = False) -> None:
    """Megatron-style TP inside each block: column-split q/k/v and w1/w3, row-split wo and w2.

    The part's input and output stay replicated plain tensors, so pipeline p2p and the embedding /
    head (not split) are unchanged. With `sequence_parallel` (Korthikanti et al. 2022, as torchtitan
    plans it) the norms run on this rank's s/t slice of the sequence (SequenceParallel), attention
    and the MLP all-gather their input (PrepareModuleInput Shard(1) → Replicate) and wo / w2
    reduce-scatter their output back to the slice (RowwiseParallel(output_layouts=Shard(1))), so the
    residual stream stays sequence-sharded from block to block: the part's first block takes its
    slice of the replicated input and the last all-gathers its output (`_shard_sequence_between`).
    """
    row = {"output_layouts": Shard(1)} if sequence_parallel else {}
    styles: dict = {
        "attn.wq": ColwiseParallel(),
        "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(**row),
        "mlp.w1": ColwiseParallel(),
        "mlp.w2": RowwiseParallel(**row),
    }
    if spec.family == "llama":
        styles["mlp.w3"] = ColwiseParallel()
    if sequence_parallel:
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        styles.update({"norm1": SequenceParallel(), "norm2": SequenceParallel(), "attn": gather, "mlp": gather})
    for block in part.blocks.values():
        parallelize_module(block, tp_mesh, styles)
    if sequence_parallel and part.blocks:
        _shard_sequence_between(part, tp_mesh)


def _shard_sequence_between(part: Decoder, tp_mesh: DeviceMesh) -> None:
    """The part's first block takes this rank's sequence slice of its replicated input (backward:
    the slices' gradients all-gathered), its last block all-gathers the slices of its output
    (backward: each rank keeps its slice of the replicated gradient)."""
    blocks = list(part.blocks.values())

    def enter(_module: nn.Module, args: tuple) -> tuple:
        x = DTensor.from_local(args[0], tp_mesh, [Replicate()], run_check=False)
        return (x.redistribute(tp_mesh, [Shard(1)]).to_local(), *args[1:])

    def leave(_module: nn.Module, _args: tuple, out: torch.Tensor) -> torch.Tensor:
        y = DTensor.from_local(out, tp_mesh, [Shard(1)], run_check=False)
        return y.redistribute(tp_mesh, [Replicate()]).to_local()

    blocks[0].register_forward_pre_hook(enter)
    blocks[-1].register_forward_hook(leave)


def _checkpointed_forward(forward, *args, **kwargs):
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_recompute(part: Decoder, mode: str, every: int = 1) -> None:
    """Activation recomputation without renaming parameters (checkpoint wrappers would add a prefix).

    "full" recomputes blocks in backward: with `every` = k, the part's blocks 0, k, 2k, … in order
    (torchtitan's layer AC frequency; ⌈n/k⌉ of n, at least the n/k planner.cost prices);
    "selective" only the attention core, softmax(QKᵀ)·V (Megatron's --recompute-granularity
    selective: the projections' inputs stay saved; the cheapest FLOPs per byte saved;
    planner.cost.memory prices it). Overriding the instance's `forward` keeps module hooks (FSDP's,
    sequence parallelism's) running in `__call__` around it.
    """
    if mode == "none":
        return
    for j, block in enumerate(part.blocks.values()):
        if mode == "full":
            if j % every == 0:
                block.forward = partial(_checkpointed_forward, block.forward)
        else:
            block.attn.core = partial(_checkpointed_forward, block.attn.core)


class GradSumSync:
    """Plain data parallelism for sharding "none": after the schedule, SUM each replica's
    accumulated gradients over the dp group in flat buckets of about `bucket_bytes`.

    Why not DDP: torch 2.13's pipelining drives DDP's reducer by hand (no_sync for all but the last
    micro-batch's backward). With more than one micro-batch that path trips the reducer's bucket
    rebuild assert, and with find_unused_parameters=True (no rebuild) the update no longer matched
    the single-process reference (measured: off by ~half the step). DDP also only overlaps the last
    micro-batch's backward, so an explicit all-reduce after the last backward loses little, is
    exactly right for any number of micro-batches per replica, and handles TP's DTensor gradients
    (their local shards are reduced over dp). Its time shows up as comm_wait_s.

    Buckets of several gradients are packed into one flat buffer that lives as long as the sync
    (≤ 2 × bucket_bytes), not a fresh one per step: on CPU a fresh 25 MB buffer is first-touched page
    by page, and that alone cost ~12 ms of the ~26 ms that packing and unpacking a 25 MB bucket took
    (measured, one core; planner.cost.stage prices the two copies that remain). A gradient of
    bucket_bytes or more is reduced in place, alone.
    """

    def __init__(self, module: nn.Module, group: dist.ProcessGroup, bucket_bytes: int = 25 << 20) -> None:
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.group = group
        self.bucket_bytes = bucket_bytes
        self.before_send: Callable[[int], None] | None = None  # fault injection: delay by bytes sent
        self._flat: torch.Tensor | None = None  # the packing buffer, reused by every bucket and step

    def __call__(self) -> None:
        grads = []
        for p in self.params:
            if p.grad is None:  # a replica that never used a parameter still joins the sum
                p.grad = torch.zeros_like(p)
            g = p.grad
            grads.append(g.to_local() if hasattr(g, "to_local") else g)
        bucket: list[torch.Tensor] = []
        size = 0
        for g in grads:
            nbytes = g.numel() * g.element_size()
            if nbytes >= self.bucket_bytes and g.is_contiguous():
                self._reduce([g])  # a bucket of its own: reduced in place, never copied
                continue
            if bucket and bucket[0].dtype != g.dtype:  # one buffer holds one dtype
                self._reduce(bucket)
                bucket, size = [], 0
            bucket.append(g)
            size += nbytes
            if size >= self.bucket_bytes:
                self._reduce(bucket)
                bucket, size = [], 0
        if bucket:
            self._reduce(bucket)

    def _reduce(self, bucket: list[torch.Tensor]) -> None:
        in_place = len(bucket) == 1 and bucket[0].is_contiguous()
        if in_place:
            flat = bucket[0].view(-1)
        else:
            n, g0 = sum(g.numel() for g in bucket), bucket[0]
            if self._flat is None or self._flat.numel() < n or self._flat.dtype != g0.dtype:
                self._flat = torch.empty(n, dtype=g0.dtype, device=g0.device)
            flat = self._flat[:n]
            torch.cat([g.reshape(-1) for g in bucket], out=flat)
        if self.before_send is not None:
            self.before_send(flat.numel() * flat.element_size())
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        if in_place:
            return
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def apply_dp(part: nn.Module, sp: StagePlan, dp_mesh: DeviceMesh) -> tuple[nn.Module, GradSumSync | None]:
    """Data parallelism for one stage part; gradients are SUMMED over replicas (see train.py).

    Returns the (maybe wrapped) part and, for sharding "none", the gradient sync to call after the
    schedule's step. zero3 → FSDP2 with reshard_after_forward=True; zero1/zero2 → FSDP2 keeping
    parameters gathered between forward and backward (FSDP2 has no optimizer-only sharding; this is
    the closest shape).
    """
    if dp_mesh.size() == 1:
        return part, None
    if sp.sharding == "none":
        return part, GradSumSync(part, dp_mesh.get_group())
    reshard = sp.sharding == "zero3"
    for block in part.blocks.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard)
    fully_shard(part, mesh=dp_mesh, reshard_after_forward=reshard)
    for m in part.modules():
        if isinstance(m, FSDPModule):
            # Factor 1 with forced SUM collectives = plain sum (gloo has no PREMUL_SUM / AVG needed).
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return part, None
