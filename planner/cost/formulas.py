"""The cost model's formulas: one small function per term, each deriving itself and citing its source.

Units: seconds, bytes, bytes/s, FLOP/s. `n` is a group size, `alpha_s` a per-message latency and
`bw` a per-device, per-direction bandwidth (what LinkSpec holds).
"""

from __future__ import annotations

from planner.specs.flops import DTYPE_BYTES

# Mixed-precision Adam keeps bf16 params + bf16 grads (2+2 B) and fp32 master weights, m and v
# (4+4+4 B): 16 B/param (Rajbhandari et al., ZeRO, SC'20 §3.1, "2Ψ + 2Ψ + 12Ψ"). fp32 training
# needs no master copy: 4+4+4+4 = 16 B as well.
OPTIMIZER_STATE_BYTES_MIXED = 12
OPTIMIZER_STATE_BYTES_FP32 = 8
# An Adam step reads master, m, v and the grad and writes master, m, v and the working copy:
# (4+4+4+2) + (4+4+4+2) = 28 B/param with bf16 (fp32: 16 read + 12 written = 28 B as well).
ADAM_BYTES_MOVED_PER_PARAM = 28
# Data parallelism without sharding (worker.parallel.GradSumSync) packs gradients smaller than this
# into one flat buffer per bucket and unpacks the reduced sum: two copies of their bytes. A gradient
# this big or bigger is reduced in place.
GRAD_BUCKET_BYTES = 25 * 2**20
# Memory outside PyTorch's allocator, so no plan may use it: the CUDA context with lazy module
# loading (PyTorch's default since 1.13; ~0.3–0.5 GiB) and NCCL's communicator buffers
# (NCCL_BUFFSIZE = 4 MiB per channel and direction, up to 32 channels per peer kind: ~0.25–0.5 GiB).
# cuBLAS's workspace is allocated through PyTorch (≤ 32 MiB, CUBLAS_WORKSPACE_CONFIG ":4096:8" on
# Hopper) and is not part of it. CPU ranks only pay for the Python/torch runtime.
RUNTIME_RESERVE_BYTES_GPU = int(1.0 * 2**30)
RUNTIME_RESERVE_BYTES_CPU = int(0.25 * 2**30)
# What eager module loading adds to the CUDA context (Runtime.eager_module_loading: CUDA runtime
# < 11.7, PyTorch < 1.13 load every kernel of every library at context creation): pytorch/pytorch#86509
# measured torch's context at 666,632,192 bytes eager and 287,047,680 bytes with CUDA_MODULE_LOADING=LAZY.
EAGER_MODULE_LOADING_BYTES = 666_632_192 - 287_047_680
# The one fragmentation constant: PyTorch's caching allocator rounds blocks (512 B; > 1 MiB to
# 2 MiB multiples) and keeps freed blocks cached in their segments, so reserved exceeds allocated;
# 5–15% in long runs (PyTorch CUDA-semantics notes, "memory management"), charged at 10%. An
# assumption, not fitted: bench/published.py's rows that ran all fit under it.
FRAGMENTATION_FRACTION = 0.10
# With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (torchtitan's launch script sets it) the
# allocator maps 2 MiB pages into one segment per stream that grows and shrinks, so a freed block's
# pages serve any later size: what stays is the rounding of each allocation to 512 B / 2 MiB pages,
# megabytes against the tens of GiB priced here. Charged at 0 (derived, not fitted).
FRAGMENTATION_FRACTION_EXPANDABLE = 0.0


def ring_allreduce_s(num_bytes: float, n: int, bw: float, alpha_s: float) -> float:
    """Ring all-reduce of `num_bytes` over n ranks: 2(n−1)/n · bytes / bw + 2(n−1)·α.

    A reduce-scatter and an all-gather, each n−1 steps moving bytes/n per rank per step
    (Patarasuk & Yuan 2009; Thakur, Rabenseifner & Gropp 2005). n = 1 costs nothing.
    """
    if n <= 1 or num_bytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * num_bytes / bw + 2 * (n - 1) * alpha_s


def tree_allreduce_s(num_bytes: float, n: int, num_nodes: int, bw: float, alpha_s: float) -> float:
    """NCCL's tree all-reduce over n ranks on N nodes: 2·bytes / bw + 2(⌈log₂ N⌉ + n/N − 1)·α.

    NCCL ≥ 2.4 reduces up and broadcasts down two complementary binary trees across nodes, each
    carrying half the data, with a chain through the node's n/N ranks inside it (Jeaugey, "Massively
    scale your deep learning training with NCCL 2.4", NVIDIA blog 2019). Each node sends and receives
    the whole buffer once per phase: 2·bytes at the bus bandwidth (vs the ring's 2(n − 1)/n), but the
    critical path is ⌈log₂ N⌉ tree levels plus the chain, not 2(n − 1) ring steps.
    """
    if n <= 1 or num_bytes <= 0:
        return 0.0
    return 2 * num_bytes / bw + 2 * tree_hops(n, num_nodes) * alpha_s


def tree_hops(n: int, num_nodes: int) -> int:
    """Latency steps of one tree phase: ⌈log₂ N⌉ levels across nodes plus the intra-node chain."""
    return max(1, num_nodes - 1).bit_length() + max(0, n // max(1, num_nodes) - 1)


def allreduce_s(num_bytes: float, n: int, bw: float, alpha_s: float, num_nodes: int = 1) -> float:
    """All-reduce as NCCL picks it: the faster of ring and tree across nodes (its tuner predicts both
    from α–β figures and takes the lower, src/graph/tuning.cc); the ring alone inside one node (or
    when the node count is unknown, num_nodes = 1)."""
    ring = ring_allreduce_s(num_bytes, n, bw, alpha_s)
    if num_nodes < 2:
        return ring
    return min(ring, tree_allreduce_s(num_bytes, n, num_nodes, bw, alpha_s))


def allreduce_latency_s(n: int, alpha_s: float, num_nodes: int = 1) -> float:
    """Latency term of a bandwidth-priced all-reduce (per bucket or buffer): the ring's 2(n − 1)·α, or
    across nodes the tree's 2(⌈log₂ N⌉ + n/N − 1)·α when lower. Gradient buckets are priced at the
    ring's bandwidth term with the lower latency: for n ≥ 8 the tree's extra bytes term, 2/n of the
    buffer, is within 1/(n − 1) of the ring's and NCCL's choice flips on latency alone."""
    ring = 2 * (n - 1) * alpha_s
    if num_nodes < 2 or n <= 1:
        return ring
    return min(ring, 2 * tree_hops(n, num_nodes) * alpha_s)


def reduce_scatter_s(num_bytes: float, n: int, bw: float, alpha_s: float) -> float:
    """Ring reduce-scatter (or all-gather, same cost): (n−1)/n · bytes / bw + (n−1)·α (Thakur et al. 2005)."""
    if n <= 1 or num_bytes <= 0:
        return 0.0
    return (n - 1) / n * num_bytes / bw + (n - 1) * alpha_s


all_gather_s = reduce_scatter_s


def cp_kv_exchange_s(kv_bytes: float, cp: int, bw: float, alpha_s: float, recomputed: float = 0.0) -> float:
    """Context parallelism's K/V exchange for one attention layer and micro-batch, forward + backward.

    The runtime (worker.cp, as Llama 3 trains: Dubey et al. 2024 §3.3.2) all-gathers K and V over
    the cp group before the attention core; `kv_bytes` = 2·b·s·(g/t)·d·e is the gathered buffer (the
    whole sequence's K and V, g kv heads over tp t, head dim d, e bytes), of which each rank holds
    1/cp. A ring all-gather moves (cp−1)/cp of it through each rank's link in cp−1 steps:
        t_ag = (cp−1)/cp · kv_bytes / bw + (cp−1)·α          (Thakur et al. 2005, as all_gather_s)
    Backward: the all-gather's adjoint is a reduce-scatter of dK, dV, the same bytes and steps, so
    t_rs = t_ag. A recomputed block runs its forward all-gather again (`recomputed` = the fraction of
    blocks recomputed, 0…1). Total = (2 + recomputed)·t_ag. (torch's ring attention moves the same
    (cp−1)/cp · kv_bytes per pass as p2p; its backward passes K, V and dK, dV: 3 passes, not 2.)
    """
    if cp <= 1:
        return 0.0
    return (2.0 + recomputed) * all_gather_s(kv_bytes, cp, bw, alpha_s)


def p2p_s(num_bytes: float, bw: float, alpha_s: float) -> float:
    """One point-to-point message: α + bytes / bw (the α–β model, Hockney 1994)."""
    return alpha_s + num_bytes / bw


def tp_allreduces_per_block(recompute: bool) -> int:
    """Tensor-parallel all-reduces per block and micro-batch: 2 forward (after attention and MLP),
    2 backward (the f/g conjugates; Shoeybi et al., Megatron-LM 2019, Fig. 4); full recompute
    repeats the forward's 2 (Korthikanti et al. 2022 §4)."""
    return 6 if recompute else 4


def pipeline_time_s(stage_s: list[float], num_microbatches: int, min_slot_s: float = 0.0) -> float:
    """GPipe / 1F1B step time of one pipeline with per-micro-batch stage times t_i:
    Σ t_i + (m − 1)·max t_i. Every micro-batch passes every stage once (Σ t_i, fill + drain)
    and the rest are paced by the slowest stage. With equal stages this is (m + p − 1)·t, i.e. a
    bubble of (p − 1)/m of the ideal m·t (Narayanan et al. SC'21 §2.2; Huang et al. GPipe 2019).
    `min_slot_s` floors those m − 1 steady slots: ranks that share cores (planner.measure.calibrate) all
    compute at once there, so a slot lasts at least their joint work over the cores."""
    return sum(stage_s) + (num_microbatches - 1) * max(max(stage_s), min_slot_s)


def interleaved_time_s(
    rank_s: list[float], num_microbatches: int, virtual_stages: int, min_slot_s: float = 0.0
) -> float:
    """Interleaved 1F1B with v model chunks per rank, per-rank time t_j (all its chunks):
    m·max t_j + (Σ t_j − max t_j)/v. With equal ranks: m·t + (p − 1)·t/v, the bubble shrinks by v
    (Narayanan et al. SC'21 §2.2.2, bubble fraction (p − 1)/(v·m)). `min_slot_s` as in
    pipeline_time_s paces the m steady slots."""
    top = max(rank_s)
    return num_microbatches * max(top, min_slot_s) + (sum(rank_s) - top) / virtual_stages


def bubble_fraction(pp: int, num_microbatches: int, virtual_stages: int = 1) -> float:
    """Idle fraction of a balanced pipeline: (p − 1)/(v·m) (Narayanan et al. SC'21, eq. 1 and §2.2.2)."""
    return (pp - 1) / (virtual_stages * num_microbatches)


def inflight_microbatches(schedule: str, stage: int, pp: int, m: int, virtual_stages: int = 1) -> float:
    """Micro-batches whose activations stage `stage` of `pp` holds at its peak.

    GPipe runs all m forwards before any backward: m. 1F1B warms up with pp − stage forwards and
    then alternates, so stage i holds min(pp − i, m) (Narayanan et al. SC'21 §2.2.1). Interleaved:
    Megatron-LM's warm-up of 2·(pp − i − 1) + (v − 1)·pp chunk forwards plus the one in flight
    (megatron/core/pipeline_parallel/schedules.py), each chunk 1/v of the rank's layers; capped at m·v.
    Returned in units of the whole stage's per-micro-batch activations.
    """
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(pp - stage, m))
    chunks = min(2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1, m * virtual_stages)
    return chunks / virtual_stages


def stale_output_copies(num_microbatches: int) -> int:
    """Last-stage outputs a DeepSpeed PipelineEngine still references during a forward
    (Runtime.last_stage_keeps_outputs): its last stage has num_pipe_buffers = max(2, min(2, m)) = 2
    buffers used in turn (micro-batch k in buffer k mod 2), and an output is dropped only when the next
    forward into its buffer stores its own, after computing it. So micro-batch k's forward runs while
    the outputs of k − 1 and k − 2 are held: min(m − 1, 2) copies at the peak."""
    return max(0, min(num_microbatches - 1, 2))


def state_bytes_per_param(dtype: str, sharding: str, dp: int) -> float:
    """Bytes per parameter for weights, grads and Adam states under ZeRO sharding over dp ranks.

    e = dtype bytes; states = 12 (fp32 master + m + v) or 8 (fp32 training: m + v).
    zero1 shards the optimizer states, zero2 also the grads, zero3 also the weights
    (Rajbhandari et al. SC'20, Fig. 1: 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N with N = dp).
    """
    e = DTYPE_BYTES[dtype]
    opt = OPTIMIZER_STATE_BYTES_FP32 if dtype == "fp32" else OPTIMIZER_STATE_BYTES_MIXED
    w, g = float(e), float(e)
    if sharding in ("zero1", "zero2", "zero3"):
        opt /= dp
    if sharding in ("zero2", "zero3"):
        g /= dp
    if sharding == "zero3":
        w /= dp
    return w + g + opt


def grad_pack_s(nbytes: float, copy_bandwidth_bytes_per_s: float) -> float:
    """Packing `nbytes` of gradients into a bucket and unpacking the sum: two copies, each moving every
    byte twice (read + write) at the node's copy bandwidth (counted, as discovery measures it, as
    bytes read + written per second)."""
    return 4.0 * nbytes / copy_bandwidth_bytes_per_s


def adam_step_s(
    num_params: float, memory_bandwidth_bytes_per_s: float, bytes_per_param: float = ADAM_BYTES_MOVED_PER_PARAM
) -> float:
    """Adam is memory-bound: 28 B moved per parameter (see ADAM_BYTES_MOVED_PER_PARAM) at HBM speed
    (the roofline of an element-wise kernel; Williams et al. 2009). An unfused implementation moves
    more (planner.measure.calibrate.ADAM_BYTES_PER_PARAM_CPU_LOOP for torch's CPU loop)."""
    return num_params * bytes_per_param / memory_bandwidth_bytes_per_s


def runtime_reserve_bytes(device_kind: str, measured: int | None = None) -> int:
    """Bytes a device loses before the plan allocates anything: `measured` where discovery measured
    it (planner.measure.calibrate.Calibration.runtime_reserve_bytes: a CPU rank's resident set with
    the training runtime imported), else RUNTIME_RESERVE_BYTES_*."""
    if measured is not None:
        return measured
    return RUNTIME_RESERVE_BYTES_CPU if device_kind == "cpu" else RUNTIME_RESERVE_BYTES_GPU


def peak_memory_bytes(
    allocated_bytes: float,
    device_kind: str,
    fragmentation: float = FRAGMENTATION_FRACTION,
    reserve_bytes: int | None = None,
) -> float:
    """Reserved bytes at the peak: allocations × (1 + fragmentation) + the runtime reserve
    (`fragmentation`: FRAGMENTATION_FRACTION, or FRAGMENTATION_FRACTION_EXPANDABLE for a runtime that
    runs the allocator with expandable segments; `reserve_bytes`: a measured reserve, as
    runtime_reserve_bytes takes it)."""
    return allocated_bytes * (1 + fragmentation) + runtime_reserve_bytes(device_kind, reserve_bytes)
