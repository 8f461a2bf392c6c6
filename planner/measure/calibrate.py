"""Calibrate the cost model to measured hardware: contention, gloo collectives, optimizer and overlap.

The default cost model prices a plan from datasheet-style figures: a link's send/recv α–β drives
ring formulas for every collective, each device computes alone at its profiled speed, and an Adam
step moves 28 B/param at memory bandwidth. On CPU ranks under gloo each assumption breaks, by an
amount discovery (planner.measure.discovery, worker.netbench) already measures:

- Contention. Profiles come from one process on one thread; N training ranks share the node's
  cores, caches and memory bus. Two separate effects:
  * Processor sharing (C cores, N > C ranks): the cores run at most C ranks at once, and a rank
    blocked in a gloo wait sleeps, leaving its core to the others. So each phase of the step takes
    at least its total CPU work over C (work conservation), and at least its critical path with
    every rank on a core of its own: phase = max(critical path, Σ_ranks work / C). `estimate`
    applies this to the pipelined part and to the optimizer step (`num_cores` below); with uneven
    stages it is well below slowing every rank by N/C, because ranks idle in the bubble free cores.
  * Shared caches and memory bus (what remains when each rank has a core): discovery times the same
    matmul chunks on one rank alone and on min(N, C) ranks at once, one per core, in the same
    minute (worker.netbench.bench_concurrency); free over alone is `compute_slowdown`, ≥ 1, and
    multiplies every profiled time. (Snapshots from before that bench: rate(1 rank) / median
    rate(N ranks) of the matmul probe, with the sharing factor N/C divided out. At N > C that
    probe read 0.6–1.3 between rounds of the same machine: a 0.1 s probe on shared cores times
    the scheduler's slices more than the caches.)
  * Lockstep (ranks that meet after every chunk of work, as a pipeline's ranks do per micro-batch
    and data parallel's per collective): a rank's speed drifts from moment to moment, and in
    lockstep each chunk takes the slowest rank's time, where running free each rank averages its
    own. The same bench times the chunks with a barrier after each (less a bare barrier's time):
    on this VM's 2 gloo ranks lockstep ran 1.05–1.27x free, with matmul only, so it is neither the
    layers nor the network. `lockstep_slowdown` multiplies every profiled time except rows timed
    on a real tp group, which ran in lockstep with their peers already. Both are timed on at most
    C ranks, since N > C ranks in lockstep on C cores also time the sharing (1.21x at 4 ranks on
    2 cores), which processor sharing above prices.
- Collectives. gloo's all_reduce / all_gather / reduce_scatter cost far more than a ring over the
  send/recv link predicts (they copy through host buffers and run on gloo's own threads). Discovery
  fits t(bytes) = α + β·bytes per op over its N ranks; a group of d ranks is priced by the ring
  algorithm's scaling (Thakur, Rabenseifner & Gropp 2005): α·(d−1)/(N−1) + β·bytes·((d−1)/d)/((N−1)/N).
- Optimizer. torch's AdamW on CPU runs the single-tensor loop (`torch/optim/adamw.py`
  `_single_tensor_adamw`; foreach defaults to CUDA only): weight decay (r4+w4), lerp of m (r8+w4),
  v·β2 + (1−β2)g² (r4+w4, r8+w4), sqrt(v)/bc2 + ε (r4+w4 ×3) and the addcdiv update (r12+w4):
  80 B/param, not the fused kernel's 28 (see formulas.ADAM_BYTES_MOVED_PER_PARAM). Bytes over the
  probed copy bandwidth still misprice it on CPU: a 64 MB copy probe under a busy neighbour read
  3.6–6 GB/s, while the step ran at 4.1–5.3 ns/param (41–55 B/param at the quiet 10–11 GB/s; a
  block's ~3 MB of states per tensor sit in the 4 MB L2). So when a measured time per parameter is
  given (`adam_s_per_param`: torch's own AdamW timed over a block of the model;
  worker.layer_bench.adamw_s_per_param), it wins. Stages whose parameters are DTensors take the
  same step timed on their layout: `adam_dtensor_s_per_param` for tp > 1 (parallelize_module),
  `adam_fsdp_s_per_param` for ZeRO on dp > 1 (FSDP2): every per-tensor op of the single-tensor
  loop dispatches through DTensor, which on CPU costs more than the math for small tensors
  (fidelity bench: 60–120 ms per step for tp2/zero2/zero3 ranks vs 45 ms plain). Timed on
  `adam_num_ranks` > 1 real ranks stepping at once (the profile flow and the fidelity bench), the
  figure holds their contention and lockstep; timed in one process on a fake group, it priced
  FSDP2's step 1.5–2x below the runs (18 against 30–38 ns/param on 2 gloo ranks) and is slowed
  like compute.
- Pipelining. torch.distributed.pipelining's schedule costs, per micro-batch and stage boundary,
  far more than the α–β of its p2p on gloo CPU ranks (Python bookkeeping, batched isend/irecv,
  waits): discovery times a 2-stage 1F1B step of trivial stages (worker.netbench.bench_pipeline;
  4.5–6 ms per micro-batch against a 0.2–0.6 ms send/recv round trip). What the cost model does
  not already price, `pipeline_overhead_s`, is added to every stage's p2p per micro-batch.
- FSDP2. Around each all-gather and reduce-scatter FSDP2 runs Python per module and per tensor
  (hooks, DTensor views, copy-in/copy-out of flat buffers) that the collectives' fits do not see:
  on 2 gloo CPU ranks a module's ZeRO-3 step (two all-gathers, one reduce-scatter) took 6.2–9.8 ms
  at 16 KiB, of which the fits price ~1–3 ms. Discovery times it on trivial modules of two sizes
  and tensor counts (worker.netbench.bench_fsdp); `FsdpOverhead` is what remains after the fits'
  own price, booked per module on every all-gather and reduce-scatter of ZeRO stages.
- Overlap. worker.train all-reduces gradients of sharding "none" after the schedule finished (its
  GradSumSync), and on CPU FSDP2's reduce-scatters run in line (no side stream; the cores are busy
  with the other ranks), so nothing hides them: overlap 0, replacing every hide fraction of planner.cost.overlap's runtime.

Pure: numbers in, a frozen `Calibration` out; `estimate(..., calibration=...)` applies it and the
search, which passes none, is unchanged.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.errors import MeshplanError
from planner.measure.ops import COLLECTIVE_OPS, CONCURRENCY_OPS, BenchOp

if TYPE_CHECKING:
    from planner.specs.cluster import LinkSpec

# Bytes one parameter moves in torch's single-tensor (CPU) AdamW step; derivation in the module docstring.
ADAM_BYTES_PER_PARAM_CPU_LOOP = 80.0
# parameter layouts the optimizer step is timed on (worker.layer_bench.adamw_s_per_param): plain,
# tensor-parallel DTensors, FSDP2-sharded DTensors
OPTIMIZER_LAYOUTS = ("plain", "tp", "fsdp")


@dataclass(frozen=True, slots=True)
class CollectiveFit:
    """t(bytes) = alpha_s + beta_s_per_byte·bytes, measured over `num_ranks` ranks (whole-buffer bytes)."""

    alpha_s: float
    beta_s_per_byte: float
    num_ranks: int

    def coeffs(self, group_size: int) -> tuple[float, float]:
        """(latency s, s per byte) over `group_size` ranks, scaled from the measured group by the ring's
        step count (d−1)/(N−1) and per-rank volume ((d−1)/d)/((N−1)/N)."""
        n, d = self.num_ranks, group_size
        if n <= 1:
            raise MeshplanError("calibration.num_ranks", n, "a collective fit needs at least 2 ranks")
        if d <= 1:
            return 0.0, 0.0
        return self.alpha_s * (d - 1) / (n - 1), self.beta_s_per_byte * ((d - 1) / d) / ((n - 1) / n)

    def time_s(self, num_bytes: float, group_size: int) -> float:
        """The op on a whole buffer of `num_bytes` over `group_size` ranks (0 for one rank or no bytes)."""
        if group_size <= 1 or num_bytes <= 0:
            return 0.0
        lat, per_byte = self.coeffs(group_size)
        return lat + per_byte * num_bytes


@dataclass(frozen=True, slots=True)
class FsdpOverhead:
    """FSDP2's own cost for one sharded module in one ZeRO-3 step (an all-gather before forward, one
    before backward, a reduce-scatter after), beyond what the collectives' fits price:
    module_s + s_per_byte·(module bytes) + tensor_s·(tensors − 1). Measured by discovery
    (worker.netbench.bench_fsdp); the cost model books a third of it on each of the three."""

    module_s: float
    s_per_byte: float
    tensor_s: float

    def op_s(self, num_tensors: int, num_bytes: float) -> float:
        """One all-gather or reduce-scatter of a module with `num_tensors` tensors of `num_bytes` in all."""
        return (self.module_s + self.s_per_byte * num_bytes + self.tensor_s * max(0, num_tensors - 1)) / 3


@dataclass(frozen=True, slots=True)
class Calibration:
    """Measured corrections the cost model applies to a plan running on `num_ranks` ranks of one node."""

    num_ranks: int
    compute_slowdown: float = 1.0
    collectives: tuple[tuple[str, CollectiveFit], ...] = ()
    adam_bytes_per_param: float | None = None
    adam_s_per_param: float | None = None  # measured optimizer step per parameter, plain
    adam_dtensor_s_per_param: float | None = None  # the same on tensor-parallel DTensor parameters
    adam_fsdp_s_per_param: float | None = None  # the same on FSDP2-sharded DTensor parameters
    adam_num_ranks: int = 1  # ranks that stepped at once when measured (> 1: lockstep included)
    grad_sync_overlap: float | None = None
    num_cores: int | None = None  # the node's cores, for processor sharing (None: one core per rank)
    pipeline_overhead_s: float = 0.0  # per micro-batch and stage boundary, beyond the p2p's α–β
    fsdp: FsdpOverhead | None = None  # FSDP2's own cost per sharded module, beyond its collectives
    lockstep_slowdown: float = 1.0  # ranks that meet after every chunk of work vs running free
    # resident bytes of a rank before its plan allocates (discovery: worker.netbench.runtime_rss_bytes),
    # replacing formulas.RUNTIME_RESERVE_BYTES_CPU's stand-in; None: not measured
    runtime_reserve_bytes: int | None = None
    # one all-reduce of discovery's smallest message over num_ranks ranks: what a scalar all-reduce
    # costs (the α–β fits run through the large sizes and misprice a few bytes); None: not measured
    small_allreduce_s: float | None = None
    source: str = ""

    def fit(self, op: BenchOp) -> CollectiveFit | None:
        return dict(self.collectives).get(op)

    def scalar_allreduce_s(self, group_size: int) -> float | None:
        """A few bytes all-reduced over `group_size` ranks: the measured small all-reduce, scaled by the
        ring's step count (d − 1)/(N − 1) as CollectiveFit.coeffs scales α; None when not measured."""
        if self.small_allreduce_s is None or self.num_ranks <= 1:
            return None
        return self.small_allreduce_s * max(0, group_size - 1) / (self.num_ranks - 1)

    def slowdown(self, real_group: bool = False) -> float:
        """What multiplies a profiled time on these ranks: the contention slowdown, and the lockstep
        slowdown unless the row was timed on a real group (a tp block timed with its all-reduces
        already ran in lockstep with its peers)."""
        return self.compute_slowdown * (1.0 if real_group else self.lockstep_slowdown)


def contention_slowdown(
    single_rank_flop_per_s: float, per_rank_flop_per_s: Iterable[float], num_cores: int | None = None
) -> float:
    """rate(1 rank) / median concurrent per-rank rate, with the processor-sharing factor N/C of N > C
    probing ranks divided out (`estimate` prices sharing itself); never below 1 (noise must not
    speed ranks up)."""
    rates = list(per_rank_flop_per_s)
    if single_rank_flop_per_s <= 0 or not rates or min(rates) <= 0:
        raise MeshplanError("calibration.rates", rates, "matmul rates must be positive; rerun discovery")
    sharing = max(1.0, len(rates) / num_cores) if num_cores else 1.0
    return max(1.0, single_rank_flop_per_s / statistics.median(rates) / sharing)


def pipeline_overhead_s(microbatch_s: float, message_bytes: float, latency_s: float, bandwidth: float) -> float:
    """The schedule's own cost per micro-batch and boundary, from discovery's trivial 2-stage 1F1B
    step: its measured time per micro-batch less the forward and backward p2p the cost model already
    prices on the link (α + bytes/bw each way, as planner.cost.formulas.p2p_s); never below 0."""
    return max(0.0, microbatch_s - 2 * (latency_s + message_bytes / bandwidth))


def pipeline_overhead_from(measurements: Iterable[Mapping], link: LinkSpec) -> float:
    """`pipeline_overhead_s` from one discovery snapshot's measurement rows: the median time of its
    `pipeline_microbatch` rows on the node's intra-node link; 0 when it has none (one rank, or a
    snapshot from before the pipeline bench)."""
    pts = [m for m in measurements if m["op"] == BenchOp.PIPELINE_MICROBATCH]
    if not pts:
        return 0.0
    t = statistics.median(m["time_s"] for m in pts)
    return pipeline_overhead_s(t, pts[0]["message_bytes"], link.latency_s, link.bandwidth_bytes_per_s)


def measured_slowdowns(measurements: Iterable[Mapping]) -> tuple[float | None, float]:
    """(contention, lockstep) from one discovery snapshot's concurrency rows
    (worker.netbench.bench_concurrency): free over alone, and lockstep over free, per-chunk times of
    the same ranks in the same minute, each never below 1 (noise must not speed ranks up). Contention
    is None without an `compute_alone` row (the caller falls back on the matmul probe's rates);
    lockstep is 1 without its rows (one rank, or an older snapshot)."""
    t = {m["op"]: float(m["time_s"]) for m in measurements if m["op"] in CONCURRENCY_OPS}
    alone, lock = BenchOp.COMPUTE_ALONE, BenchOp.COMPUTE_LOCKSTEP
    free = t.get(BenchOp.COMPUTE_FREE, 0.0)
    if free <= 0:
        return None, 1.0
    contention = max(1.0, free / t[alone]) if t.get(alone, 0.0) > 0 else None
    lockstep = max(1.0, t[lock] / free) if lock in t else 1.0
    return contention, lockstep


def fsdp_overhead_from(measurements: Iterable[Mapping], fits: Mapping[str, CollectiveFit]) -> FsdpOverhead | None:
    """`FsdpOverhead` from one discovery snapshot's `fsdp_module` rows (two module sizes) and
    `fsdp_tensor` row, less the two all-gathers and the reduce-scatter of the module's bytes over the
    bench's 2 ranks that `fits` already price; None when the snapshot has no such rows (one rank, or
    a snapshot from before the FSDP bench)."""
    rows = list(measurements)
    mods = sorted((float(m["message_bytes"]), float(m["time_s"])) for m in rows if m["op"] == BenchOp.FSDP_MODULE)
    if len({b for b, _ in mods}) < 2:
        return None
    ag, rs = fits.get(BenchOp.ALL_GATHER), fits.get(BenchOp.REDUCE_SCATTER)

    def residual(nbytes: float, t: float) -> float:
        priced = 2 * ag.time_s(nbytes, 2) if ag is not None else 0.0
        return t - priced - (rs.time_s(nbytes, 2) if rs is not None else 0.0)

    (b1, t1), (b2, t2) = mods[0], mods[-1]
    r1, r2 = residual(b1, t1), residual(b2, t2)
    per_byte = max(0.0, (r2 - r1) / (b2 - b1))
    tensors = [float(m["time_s"]) for m in rows if m["op"] == BenchOp.FSDP_TENSOR]
    return FsdpOverhead(max(0.0, r1 - per_byte * b1), per_byte, statistics.median(tensors) if tensors else 0.0)


def collective_fits(
    fits: Iterable[Mapping], num_ranks: int, link_class: str = "intra-node"
) -> dict[str, CollectiveFit]:
    """Discovery's per-op α–β fit rows ({op, link_class, alpha_s, beta_s_per_byte}) → CollectiveFit by op."""
    out = {}
    for f in fits:
        if f["op"] in COLLECTIVE_OPS and f["link_class"] == link_class:
            out[BenchOp(f["op"])] = CollectiveFit(float(f["alpha_s"]), float(f["beta_s_per_byte"]), num_ranks)
    return out


def small_allreduce_from(measurements: Iterable[Mapping]) -> float | None:
    """The time of the smallest all-reduce message among a snapshot's measurement rows (None without any)."""
    rows = [m for m in measurements if m["op"] == BenchOp.ALL_REDUCE]
    if not rows:
        return None
    smallest = min(int(m["message_bytes"]) for m in rows)
    return statistics.median(float(m["time_s"]) for m in rows if int(m["message_bytes"]) == smallest)


def cpu_calibration(
    single_rank_flop_per_s: float,
    per_rank_flop_per_s: Iterable[float],
    fits: Iterable[Mapping],
    num_ranks: int,
    num_cores: int | None = None,
    adam_s_per_param: float | None = None,
    adam_dtensor_s_per_param: float | None = None,
    pipeline_overhead: float = 0.0,
    measurements: Iterable[Mapping] = (),
    adam_fsdp_s_per_param: float | None = None,
    adam_num_ranks: int = 1,
    runtime_reserve_bytes: int | None = None,
) -> Calibration:
    """The calibration of `num_ranks` CPU ranks from two discoveries: one rank alone, and `num_ranks` ranks
    (plus, optionally, the measured optimizer step per parameter, and the snapshot's measurement rows
    for FSDP2's own cost; see the module docstring)."""
    measurements = list(measurements)
    measured, lockstep = measured_slowdowns(measurements)
    slowdown = measured or contention_slowdown(single_rank_flop_per_s, per_rank_flop_per_s, num_cores)
    ops = collective_fits(fits, num_ranks)
    fsdp = fsdp_overhead_from(measurements, ops)
    return Calibration(
        num_ranks=num_ranks,
        compute_slowdown=slowdown,
        collectives=tuple(sorted(ops.items())),
        adam_bytes_per_param=ADAM_BYTES_PER_PARAM_CPU_LOOP,
        adam_s_per_param=adam_s_per_param,
        adam_dtensor_s_per_param=adam_dtensor_s_per_param,
        adam_fsdp_s_per_param=adam_fsdp_s_per_param,
        adam_num_ranks=adam_num_ranks,
        grad_sync_overlap=0.0,
        num_cores=num_cores,
        pipeline_overhead_s=pipeline_overhead,
        fsdp=fsdp,
        lockstep_slowdown=lockstep,
        runtime_reserve_bytes=runtime_reserve_bytes,
        small_allreduce_s=small_allreduce_from(measurements),
        source=f"discovery: {num_ranks} ranks, slowdown {slowdown:.2f}, lockstep {lockstep:.2f}, gloo fits for {', '.join(sorted(ops)) or 'none'}",
    )
