"""What a training runtime overlaps with compute, term by term, and the exposed time that leaves.

A `Runtime` states, for each communication term of a stage, how much of it runs concurrently with
which compute; `dp_terms` turns that into the exposed seconds `stage.stage_coeffs` books (its
zero3_a/b, e0/e1 and g0/g1 coefficients, all linear in the stage's block count n). The runtimes:

The figures of every runtime below live in planner/specs/data/runtimes.toml ([[overlap]] rows, each
figure with its source), loaded once by planner.cost.runtime_table; this docstring derives them.

- `MESHPLAN`, meshplan's own torch runtime (worker/train.py, worker/parallel.py, worker/stages.py):
  * dp gradient sync, sharding none: `GradSumSync` all-reduces after `schedule.step` returned, in
    line, and packs small gradients through a bucket buffer: nothing hidden, the copies exposed.
  * ZeRO (FSDP2 `fully_shard`): the reduce-scatter runs once a step, after the schedule: torch's
    schedules run every micro-batch's backward with `set_requires_gradient_sync(False)` and then
    call `perform_reduce_grad`, which runs each FSDP param group's post_backward (torch
    distributed/pipelining/stage.py, schedules.py), so no compute is left to hide it. (Plans of
    unequal stages run worker/stages.py, which syncs in the last backward instead and could hide
    part of it; priced alike, conservatively.) zero3's all-gathers are prefetched (FSDP2's implicit forward prefetch
    from its all-gather stream, explicit prefetch of one module in backward: torch
    `FSDPModule.set_modules_to_*_prefetch`, default), so each hides behind the neighbouring block's
    compute; in backward it shares the link with the reduce-scatter (one communicator).
    zero1/2 (reshard_after_forward=False) gather the updated shards in the next step's first
    forward, prefetched the same way.
  * On CPU ranks none of this overlaps: gloo has no side streams and the cores are busy with the
    other ranks (planner.measure.calibrate measures overlap 0 there; a calibration wins).
  * TP all-reduces (DTensor `parallelize_module`) wait before the next op uses them; pipeline
    p2p is waited before the compute that needs it (torch.distributed.pipelining): not hidden.
- `TORCHTITAN`, as `MESHPLAN` but FSDP2's reduce-scatter (and DDP's all-reduce) issued in the
  backward's post-hooks, hidden behind the remaining backward.
- `MEGATRON`, Megatron-core as exported plans run it (`--overlap-grad-reduce --overlap-param-gather`,
  DistributedDataParallelConfig; megatron/core/distributed/param_and_grad_buffer.py): gradients
  live in one contiguous buffer (no packing copies), reduced bucket by bucket (bucket_size =
  max(40M, 1M·dp) parameters) as each bucket's gradients are ready during the last backward; the
  last bucket (the first layers and the embedding) launches after the backward: exposed. The
  distributed optimizer's parameter all-gather overlaps the next forward bucket by bucket. TP
  communication is not overlapped (`--tp-comm-overlap` needs Transformer Engine userbuffers; off
  by default). Pipeline p2p overlaps compute only in the interleaved schedule (`overlap_p2p_comm`,
  on by default, used by forward_backward_pipelining_with_interleaving only; 1F1B's
  send_forward_recv_backward blocks).
- `MEGATRON_SC21`, the Megatron-LM of Narayanan et al. SC'21 (v2.x, 2021; the published rows):
  `--DDP-impl local` all-reduces the gradients after forward_backward_func returned
  (megatron/training.py train_step: `allreduce_gradients()`), blocking p2p, no TP overlap.
- `FSDP_COMPOSER`, llm-foundry on Composer with torch FSDP1 (the MPT rows): Composer only wraps
  DDP models in no_sync (composer/trainer/dist_strategy.py `ddp_sync_context` returns at once for
  FSDP), so every micro-batch's backward reduce-scatters; FSDP issues it on its own stream behind
  each unit's backward, and the next unit's prefetched all-gather and this reduce-scatter are
  serialised on the one communicator (Zhao et al., PyTorch FSDP, VLDB 2023 §3.3), so a block's
  backward hides AG + RS together; forwards hide the next unit's all-gather (implicit prefetch).
  Composer's FSDPConfig defaults to backward_prefetch BACKWARD_POST (the next gather issued at this
  unit's post-backward): priced as hidden, since the CPU issues kernels ahead of the GPU; a
  CPU-bound small model hides less.

Derivation (one stage, n blocks; per block: AG / RS the all-gather / reduce-scatter of its weights
or gradients, f and b its forward and backward; h the runtime's hide fraction, 1 = up to the whole
compute; L the comm that starts after the compute that could hide it):
  sync once, hidden by the last backward:  exposed = max(L, S − h·B) = L + max(0, S − L − h·B)
  (exact: max(x, y) = x + max(0, y − x)), S the sync's time, B the backward it runs under (for
  zero3 less the backward's own all-gathers: max(0, b − AG) per block). The first term goes into g0,
  the second is the tail's max(0, e0 + e1·n). Every micro-batch (Composer FSDP): per block
  max(0, AG − h·f) + max(0, AG + RS − h·b) in τ, the first block and the root's RS exposed.
TP all-reduces and boundary p2p keep (1 − overlap) of their time in τ.

Context parallelism's K/V exchange (formulas.cp_kv_exchange_s) keeps (1 − cp_overlap) in τ. Every
runtime here states 0: meshplan's (worker/cp.py) all-gathers K and V with a blocking functional
collective the attention core waits on, and its backward's reduce-scatter sits in the autograd
graph before the projections' gradients; Llama 3's all-gather CP (Dubey et al. 2024 §3.3.2) is
exposed too: the gather is small against attention at long s, which is why it was chosen. Ring
attention (Megatron-core's cp_comm_type p2p, torch's context_parallel) hides each step's send
behind the previous chunk's attention; it is priced for meshplan's all-gather, not as a ring. Approximations, stated: a
hidden p2p is hidden in the pipeline's fill too (≤ 2(pp − 1) transfers a step); the distributed
optimizer's last reduce-scatter is priced per module as FSDP's (first block + root), not per bucket;
NCCL kernels' SM share taken from overlapped compute is not priced. The search prices the user's
runtime (planner.cost.runtimes.Pricing): its bounds keep (1 − tp_overlap) of the TP traffic and drop
p2p, so they stay below the priced time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from planner.cost.runtime_table import OVERLAP_FLAGS, OVERLAP_FRACTIONS, OVERLAP_OPTIONAL_FLAGS, OVERLAP_ROWS
from planner.errors import MeshplanError


@dataclass(frozen=True, slots=True)
class Runtime:
    """How much of each communication term a training runtime hides, and behind what compute."""

    name: str
    grad_sync_overlap: float  # sharding none: fraction of the last backward hiding the all-reduce
    reduce_scatter_overlap: float  # ZeRO: fraction of the backward hiding the gradient reduce-scatter
    gather_overlap: float  # zero3: fraction of a block's forward / backward hiding its prefetched all-gather
    param_gather_overlap: float  # zero1/2: fraction of the next forward hiding the updated-shard all-gather
    tp_overlap: float  # fraction of the TP all-reduces hidden
    p2p_overlap: float  # fraction of the boundary p2p hidden (steady state)
    p2p_overlap_interleaved_only: bool  # the p2p overlap applies to the interleaved schedule only
    reduce_scatter_every_microbatch: bool  # no gradient accumulation without sync (Composer's FSDP)
    grad_buckets_packed: bool  # small gradients copied through a bucket buffer (GradSumSync)
    bucketed_grad_sync: bool  # sharding none: reduced bucket by bucket; the last launched after the backward
    overlaps_on_cpu: bool  # side streams exist on CPU ranks too
    source: str
    # context parallelism: fraction of the K/V exchange (formulas.cp_kv_exchange_s) hidden behind attention
    cp_overlap: float = 0.0
    # fp8 weights cast once a step and cached across micro-batches (memory.Stack.fp8_weight_cached)
    fp8_weight_cached: bool = False
    # selective recompute is torchtitan's per-op policy (planner.cost.memory.op_sac_kept_bytes)
    selective_per_op: bool = False
    # Megatron-core + Transformer Engine's fused norm-linear and SwiGLU kernels (memory.fused_block_saved_bytes)
    fused_block: bool = False
    # the caching allocator runs with expandable segments (formulas.FRAGMENTATION_FRACTION_EXPANDABLE)
    expandable_segments: bool = False
    # unsharded gradients are all-reduced as fp32 copies (DeepSpeed's fp32_allreduce: 4 bytes a gradient
    # on the wire whatever the training dtype; planner.cost.stage.grad_wire_bytes)
    grad_allreduce_fp32: bool = False
    # what crosses a stage boundary beyond 1/tp of the activation and of its gradient
    # (planner.cost.stage.p2p_boundary_bytes): the fp16 [1, 1, s, s] attention mask with every forward
    # send, and the gradient sent whole on every tp rank
    p2p_sends_attention_mask: bool = False
    p2p_grad_whole: bool = False
    # with pp > 1 a tied embedding's gradient is all-reduced between the first and the last stage once a
    # step, after the schedule (planner.cost.stage.tied_embedding_sync_s)
    tied_embedding_allreduce: bool = False
    # p2p is a blocking collective both ends take part in (a broadcast in the two stages' group): a
    # boundary's transfer occupies the receiving stage as well as the sending one (planner.cost.estimate)
    p2p_blocks_receiver: bool = False
    # the last stage's output (the loss's fp32 logits) stays referenced by the engine's pipe buffer after
    # its backward until the next forward into that buffer overwrites it: with two buffers used in turn,
    # a forward holds the outputs of the two micro-batches before it (formulas.stale_output_copies,
    # memory.kept_output_bytes)
    last_stage_keeps_outputs: bool = False
    # CUDA modules loaded eagerly at context creation (CUDA runtime < 11.7 / PyTorch < 1.13): a larger
    # context outside the allocator (formulas.EAGER_MODULE_LOADING_BYTES)
    eager_module_loading: bool = False

    def for_schedule(self, schedule: str) -> Runtime:
        """The runtime as it runs `schedule` (Megatron overlaps p2p in the interleaved schedule only)."""
        if self.p2p_overlap_interleaved_only and schedule != "interleaved-1f1b" and self.p2p_overlap:
            return replace(self, p2p_overlap=0.0)
        return self

    def on_cpu(self) -> Runtime:
        """The runtime on CPU ranks: no side streams, so nothing overlaps unless it says otherwise."""
        if self.overlaps_on_cpu:
            return self
        return replace(
            self,
            grad_sync_overlap=0.0,
            reduce_scatter_overlap=0.0,
            gather_overlap=0.0,
            param_gather_overlap=0.0,
            tp_overlap=0.0,
            p2p_overlap=0.0,
            cp_overlap=0.0,
        )


def _from_row(row: dict) -> Runtime:
    """A Runtime from its [[overlap]] row of data/runtimes.toml (validated by planner.cost.runtime_table)."""
    return Runtime(
        name=row["name"],
        source=row["source"],
        **{f: float(row[f]) for f in OVERLAP_FRACTIONS},
        **{f: row[f] for f in OVERLAP_FLAGS},
        **{f: row[f] for f in OVERLAP_OPTIONAL_FLAGS if f in row},
    )


# The runtimes' figures are data (planner/specs/data/runtimes.toml, each with its source).
RUNTIMES = {name: _from_row(row) for name, row in OVERLAP_ROWS.items()}
# torchtitan's "selective" is its per-op policy (torchtitan/parallelisms/parallelize_llama.py,
# selective_ac_option = "op"), and its launch script runs the allocator with expandable segments
# (run_llama_train.sh: PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"): mechanisms, not figures,
# stated here until the runtime table has a column for them
RUNTIMES["torchtitan"] = replace(RUNTIMES["torchtitan"], selective_per_op=True, expandable_segments=True)
# Megatron-core as exported plans and NeMo run it: TE's LayerNormLinear / LayerNormMLP and the fused
# SwiGLU (planner.cost.memory.fused_block_saved_bytes)
RUNTIMES["megatron"] = replace(RUNTIMES["megatron"], fused_block=True)
MESHPLAN = RUNTIMES["meshplan"]
TORCHTITAN = RUNTIMES["torchtitan"]
MEGATRON = RUNTIMES["megatron"]
MEGATRON_SC21 = RUNTIMES["megatron-sc21"]
FSDP_COMPOSER = RUNTIMES["fsdp-composer"]
# No runtime hides more communication than the whole backward it runs under: what the search's
# dominance rule may assume (planner.search.bounds.recompute_dominated).
MAX_HIDE_FRACTION = 1.0


def runtime_named(name: str) -> Runtime:
    """The runtime called `name` (MeshplanError naming the known ones otherwise)."""
    rt = RUNTIMES.get(name)
    if rt is None:
        raise MeshplanError("runtime", name, f"one of {', '.join(sorted(RUNTIMES))}")
    return rt


class Collective(NamedTuple):
    """(latency s, s per byte of the whole buffer) of one collective over the stage's dp group."""

    lat_s: float
    per_byte_s: float

    def time_s(self, nbytes: float) -> float:
        return self.lat_s + nbytes * self.per_byte_s


class DpTerms(NamedTuple):
    """The exposed data-parallel time of a stage as stage_coeffs books it (see the module docstring)."""

    zero3_a: float = 0.0
    zero3_b: float = 0.0
    e0: float = 0.0
    e1: float = 0.0
    g0: float = 0.0
    g1: float = 0.0


def dp_terms(
    rt: Runtime,
    sharding: str,
    ag: Collective,
    rs: Collective,
    ar: Collective,
    block: tuple[float, float, float],
    consts: list[tuple[float, float, float]],
    fsdp_s: tuple[float, float] = (0.0, 0.0),
    measured_overlap: float | None = None,
    bucket_bytes: float = 0.0,
) -> DpTerms:
    """Exposed dp time per micro-batch (zero3_a·n + zero3_b), after the pipeline (max(0, e0 + e1·n))
    and always after it (g0 + g1·n), for one stage under runtime `rt`.

    `block` = (weight bytes, forward s, backward s) of one block; `consts` the same for the stage's
    embedding / head rows; `fsdp_s` FSDP2's own cost per collective of a block and of the constant rows
    (calibrated CPU ranks); `measured_overlap` a calibrated runtime's measured hide fraction, which
    replaces every fraction of `rt` (planner.measure.calibrate); `bucket_bytes` the gradient bucket of
    a bucketed all-reduce (megatron_bucket_params × bytes per gradient element)."""
    pa, fa, ba = block
    pb = sum(c[0] for c in consts)
    fs_a, fs_b = fsdp_s
    h_sync, h_rs, h_ag, h_pg = (
        (measured_overlap,) * 4
        if measured_overlap is not None
        else (rt.grad_sync_overlap, rt.reduce_scatter_overlap, rt.gather_overlap, rt.param_gather_overlap)
    )
    bwd_b = sum(c[2] for c in consts)
    if sharding == "none":
        # one all-reduce of every gradient, under the last backward; the last bucket after it
        last = ar.time_s(min(bucket_bytes, pa + pb)) if rt.bucketed_grad_sync else 0.0
        e1 = pa * ar.per_byte_s - h_sync * ba
        e0 = ar.time_s(pb) - h_sync * bwd_b - last
        return DpTerms(e0=e0, e1=e1, g0=last)

    def gather(nbytes: float, compute_s: float) -> float:
        return max(0.0, ag.time_s(nbytes) - h_ag * compute_s)

    zero3 = sharding == "zero3"
    # zero3's own all-gathers in every forward and backward (prefetched behind the neighbour's compute)
    z_a = gather(pa, fa) + gather(pa, ba) + 2 * fs_a if zero3 else 0.0
    z_b = sum(gather(c[0], c[1]) + gather(c[0], c[2]) for c in consts) + 2 * fs_b if zero3 else 0.0
    # what of a block's backward its all-gather leaves to hide the reduce-scatter behind
    spare_a = max(0.0, ba - ag.time_s(pa)) if zero3 else ba
    spare_b = sum(max(0.0, c[2] - ag.time_s(c[0])) for c in consts) if zero3 else bwd_b
    # the first block's and the root's reduce-scatters run after the compute that could hide them
    last = rs.time_s(pa + pb)
    g0 = g1 = 0.0
    if not zero3:
        # zero1/2: the updated shards gathered in the next forward (prefetched), once per step
        g1 = max(0.0, pa * ag.per_byte_s - h_pg * fa) + fs_a
        g0 = ag.time_s(pb) + fs_b
    if rt.reduce_scatter_every_microbatch and measured_overlap is None:
        # every micro-batch: a block's backward hides its reduce-scatter after its own all-gather
        per = max(0.0, rs.time_s(pa) - h_rs * spare_a) + fs_a
        z_a += per
        z_b += last - per + fs_b
        if not zero3:
            # zero2 reshards after every synced backward: each forward gathers again
            z_a += g1
            z_b += g0
            g0 = g1 = 0.0
        return DpTerms(zero3_a=z_a, zero3_b=z_b, g0=g0, g1=g1)
    # once, in the last micro-batch's backward
    e1 = pa * rs.per_byte_s - h_rs * spare_a + fs_a
    e0 = rs.lat_s + pb * rs.per_byte_s - h_rs * spare_b - last + fs_b
    return DpTerms(zero3_a=z_a, zero3_b=z_b, e0=e0, e1=e1, g0=g0 + last, g1=g1)


def megatron_bucket_params(dp: int) -> float:
    """Megatron-core's gradient bucket: max(40M, 1M·dp) parameters (DistributedDataParallelConfig
    bucket_size default, megatron/core/distributed/distributed_data_parallel.py)."""
    return max(40e6, 1e6 * dp)
