"""The training runtime as the user's choice: a named profile of how a stack runs a plan.

meshplan can export a plan to other runtimes (torchtitan, Megatron-core, DeepSpeed, Composer), and
each runs the same layout differently. A `RuntimeProfile` names, per runtime, every term that moves
the price, so that `plan`, `estimate`, `compare` and `export --runtime NAME` price under it:

- `overlap`: what communication it hides behind compute (planner.cost.overlap.Runtime);
- `attention` / `loss` / `dropout` / `fp8`: the kernels it runs, which change both time
  (planner.cost.compute.stack_time_delta_s, loss_time_delta_s) and what is kept in memory
  (planner.cost.memory): eager attention keeps s×s probabilities, an unfused loss an fp32 logit copy;
  `fp8` = Transformer Engine / torchao fp8 linears where the plan's devices have an fp8 peak;
- `sequence_parallel`: norms and residuals on T/t tokens when tp > 1 (memory and element-wise time);
- `launch_s` × `kernels_per_block`: the host's fixed cost of issuing one block's kernels (eager
  PyTorch: the dispatcher plus cudaLaunchKernel, about 5–10 µs an op; backward issues twice the
  forward's kernels, a recomputed block's once more). A GPU block cannot run faster than its host
  issues it: its forward + backward take at least 3 × launch_s × kernels_per_block (small shapes on
  small GPUs; nothing at large ones), a term of every stage (planner.cost.stage.Overheads);
- `microbatch_s`: a fixed, serialised cost per micro-batch on every pipeline rank (schedule
  bookkeeping, loss `.item()` syncs, blocking p2p handshakes), so m + pp − 1 slots of it on a 1F1B
  step, m + (pp − 1)/v interleaved (`slots`);
  priors 0 where no source gives a number: fitted;
- `step_kernels`: kernels and syncs the host issues once a step (zero_grad, gradient clipping, loss
  scaling, the loss sync): a per-step fixed cost, prior launch_s × step_kernels on GPUs;
- `kernels`: the derived (uncalibrated) kernel fractions: cuBLAS GEMMs and the runtime's attention
  kernel family (FA2, FA3, FlashAttention in Triton), [[kernel]] rows of data/runtimes.toml.

Every runtime's figures are data: planner/specs/data/runtimes.toml, one [[runtime]] row each with a
source per figure (planner.cost.runtime_table loads and validates it once).

`Figures` are the few numbers calibrated per (device kind, runtime) from measured runs
(`meshplan calibrate`, bench/published.py): `kernel_scale` multiplies the GEMM and attention
fractions of peak (the stack's kernel quality against the catalog's prior) and `microbatch_s`
replaces the profile's fixed per-micro-batch cost (`step_s` the per-step one). Each says on which
runs it was fitted. From 3 runs kernel_scale and the per-micro-batch cost are fitted jointly,
regularised toward the runtime's priors and never below 0 (fit_terms).
Measured layer profiles still win over the shape-based compute that kernel_scale moves.

`Pricing` is a profile with its figures as one value: what the search (planner.search.search, its
Pricer and bounds), its oracle and `price` take, so `plan --runtime X` searches under X's prices.
Every fixed cost is a stage term (linear in a stage's blocks), so the search's split solver and
bounds stay exact under any runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from planner.cost.compute import PRIOR, KernelEfficiency, attention_kernels
from planner.cost.estimate import estimate
from planner.cost.overlap import RUNTIMES, Runtime
from planner.cost.runtime_table import RUNTIME_ROWS
from planner.cost.stage import Overheads
from planner.errors import MeshplanError
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import CostBreakdown, Plan


@dataclass(frozen=True, slots=True)
class RuntimeProfile:
    """One training runtime's kernels, overlap, memory and fixed overheads (module docstring)."""

    name: str
    overlap: Runtime
    attention: str  # "sdpa" | "flash" | "eager"
    loss: str  # "torch" | "vocab-parallel" | "fused"
    dropout: bool
    fp8: bool  # fp8 linears (Transformer Engine / torchao) where every device has an fp8 peak
    sequence_parallel: bool
    launch_s: float  # host cost of issuing one kernel
    kernels_per_block: int  # forward kernels of one transformer block (backward issues twice as many)
    microbatch_s: float  # fixed serialised cost per micro-batch slot (prior)
    source: str
    step_kernels: int = 0  # host-issued kernels once a step (prior per-step cost: launch_s × step_kernels)
    kernels: KernelEfficiency = PRIOR  # derived (uncalibrated) kernel fractions: its attention kernel family


def _profile(row: dict) -> RuntimeProfile:
    """A RuntimeProfile from its [[runtime]] row of data/runtimes.toml (planner.cost.runtime_table)."""
    return RuntimeProfile(
        name=row["name"],
        overlap=RUNTIMES[row["overlap"]],
        attention=row["attention"],
        loss=row["loss"],
        dropout=row["dropout"],
        fp8=row["fp8"],
        sequence_parallel=row["sequence_parallel"],
        launch_s=float(row["launch_s"]),
        kernels_per_block=row["kernels_per_block"],
        microbatch_s=float(row["microbatch_s"]),
        source=row["source"],
        kernels=attention_kernels(row["attention_kernel"]),
        step_kernels=row["step_kernels"],
    )


# Every runtime's figures are data: planner/specs/data/runtimes.toml, one [[runtime]] row each, every
# figure with its source. megatron-sc21 (the published SC'21 rows) is priced but not a user's choice.
_ALL = {name: _profile(row) for name, row in RUNTIME_ROWS.items()}
MESHPLAN_RT = _ALL["meshplan"]
TORCHTITAN_RT = _ALL["torchtitan"]
MEGATRON_RT = _ALL["megatron"]
DEEPSPEED_RT = _ALL["deepspeed"]
COMPOSER_RT = _ALL["composer"]
MEGATRON_SC21_RT = _ALL["megatron-sc21"]

PROFILES = {name: p for name, p in _ALL.items() if RUNTIME_ROWS[name]["choice"]}
RUNTIME_NAMES = tuple(PROFILES)


def profile_named(name: str) -> RuntimeProfile:
    """The runtime called `name`; MeshplanError naming the choices otherwise."""
    p = PROFILES.get(name) or _ALL.get(name)
    if p is None:
        raise MeshplanError("runtime", name, f"one of {', '.join(RUNTIME_NAMES)}")
    return p


def step_prior_s(profile: RuntimeProfile) -> float:
    """The per-step fixed cost's prior: launch_s × step_kernels (data/runtimes.toml)."""
    return profile.launch_s * profile.step_kernels


@dataclass(frozen=True, slots=True)
class Figures:
    """A runtime's calibrated figures on one device kind, with where they came from."""

    kernel_scale: float = 1.0
    microbatch_s: float | None = None  # None: the profile's prior
    runs: int = 0
    source: str = "prior"
    step_s: float | None = None  # fixed cost once a step; None: the profile's prior (step_prior_s)

    def label(self, device_kind: str, runtime: str) -> str:
        if not self.runs:
            return f"uncalibrated: {device_kind}/{runtime}"
        return f"calibrated: {self.runs} runs, {device_kind}/{runtime}"


PRIOR_FIGURES = Figures()


def scaled_kernels(kernels: KernelEfficiency, scale: float) -> KernelEfficiency:
    """`kernels` with every GEMM and attention fraction multiplied by `scale` (kept ≤ 1)."""
    if scale == 1.0:
        return kernels

    def s(x: float) -> float:
        return min(1.0, x * scale)

    return replace(
        kernels,
        gemm=tuple((a, s(v)) for a, v in kernels.gemm),
        gemm_other=s(kernels.gemm_other),
        flash=tuple((a, s(v)) for a, v in kernels.flash),
        flash_other=s(kernels.flash_other),
        source=f"{kernels.source} × {scale:.3f} (calibrated kernel_scale)",
    )


def apply_stack(plan: Plan, profile: RuntimeProfile) -> Plan:
    """The plan as `profile` runs it: its attention and loss kernels, dropout and sequence parallelism
    on tp > 1 stages (fp8 stays the plan's choice; `profile.fp8` says the runtime can run it)."""
    stages = tuple(
        s.model_copy(update={"sequence_parallel": profile.sequence_parallel and s.tp > 1}) for s in plan.stages
    )
    return plan.model_copy(
        update={
            "attention": profile.attention,
            "loss": profile.loss,
            "dropout": profile.dropout,
            "stages": stages,
        }
    )


def slots(plan: Plan) -> float:
    """Micro-batch slots on the critical path of one step: what one more second of every rank's
    per-micro-batch cost adds to the pipeline (planner.cost.stage.Overheads): m + pp − 1 under
    GPipe / 1F1B (the pipeline's fill and drain), m + (pp − 1)/v under interleaved 1F1B (its
    pipeline time (1/v)·Σ τ + (m − 1/v)·max τ, formulas.interleaved_time_s), m the largest
    replica's micro-batch count."""
    m = max(plan.num_microbatches(r) for r in range(len(plan.batch_shares)))
    if plan.schedule == "interleaved-1f1b":
        return m + (plan.pp - 1) / plan.virtual_stages
    return m + plan.pp - 1


def is_gpu(cluster: ClusterSpec) -> bool:
    """Whether any device is a GPU (fixed host costs are priced on GPUs; on CPU ranks the host's time
    is the measured compute)."""
    return any(n.device != "cpu" for n in cluster.nodes)


@dataclass(frozen=True, slots=True)
class Pricing:
    """What plans are priced under, as one value: a runtime's profile and the figures calibrated for
    it. The search (planner.search.search), its oracle and `price` take it whole, so a search under a
    runtime enumerates with that runtime's prices and memory, bounds included:

    - `kernels`: the runtime's derived kernel fractions × the calibrated kernel_scale (estimated rows);
    - `overlap`: what it hides of each communication term (planner.cost.overlap.Runtime);
    - `dress(plan)`: its stack on the plan (attention, loss, dropout, sequence parallelism; not for
      meshplan's own runtime, whose stack the search chooses);
    - `overheads` / `step_s`: its fixed costs as stage terms (planner.cost.stage.Overheads: the host's
      kernel issue time floors a GPU block, a cost per micro-batch on every stage) and once a step.

    meshplan's runtime with nothing calibrated on CPU ranks prices exactly as planner.cost.estimate
    (`plain_on`): its host costs are GPU costs and its per-micro-batch prior is 0."""

    profile: RuntimeProfile
    figures: Figures = PRIOR_FIGURES

    @property
    def restack(self) -> bool:
        return self.profile.name != "meshplan"

    @property
    def overlap(self) -> Runtime:
        return self.profile.overlap

    @property
    def kernels(self) -> KernelEfficiency:
        return scaled_kernels(self.profile.kernels, self.figures.kernel_scale)

    @property
    def overheads(self) -> Overheads:
        per = self.figures.microbatch_s if self.figures.microbatch_s is not None else self.profile.microbatch_s
        return Overheads(self.profile.launch_s * self.profile.kernels_per_block, per)

    def step_s(self, gpu: bool) -> float:
        """The fixed cost once a step: calibrated, else launch_s × step_kernels on GPUs, 0 on CPU ranks."""
        if self.figures.step_s is not None:
            return self.figures.step_s
        return step_prior_s(self.profile) if gpu else 0.0

    def dress(self, plan: Plan) -> Plan:
        """The plan as this runtime runs it (apply_stack), or unchanged for meshplan's own."""
        return apply_stack(plan, self.profile) if self.restack else plan

    def plain_on(self, cluster: ClusterSpec) -> bool:
        """True when this prices exactly as planner.cost.estimate on `cluster` (class docstring)."""
        return self.profile.name == "meshplan" and self.figures == PRIOR_FIGURES and not is_gpu(cluster)

    def label(self, device_kind: str) -> str:
        return self.figures.label(device_kind, self.profile.name)


def device_kind_of(cluster: ClusterSpec) -> str:
    """The device kind a runtime's figures are calibrated and looked up for: the first node group's
    (a mixed cluster's label names it)."""
    return cluster.nodes[0].device_kind


def pricing_named(runtime: str, figures: Figures | None = None) -> Pricing:
    """The Pricing of runtime `runtime` (MeshplanError naming the choices for another name) on the
    figures calibrated for it (storage.calibrations reads them), its priors when None."""
    return Pricing(profile_named(runtime), figures or PRIOR_FIGURES)


def price(plan: Plan, model: ModelSpec, cluster: ClusterSpec, pricing: Pricing | None, **kw) -> CostBreakdown:
    """`plan` priced under `pricing` (None, or one that prices as estimate: planner.cost.estimate);
    `kw` passes profiles / index / calibration."""
    if pricing is None or pricing.plain_on(cluster):
        return estimate(plan, model, cluster, **kw)
    return price_under(plan, model, cluster, pricing.profile, pricing.figures, restack=pricing.restack, **kw)


def price_under(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    profile: RuntimeProfile,
    figures: Figures = PRIOR_FIGURES,
    restack: bool = True,
    **kw,
) -> CostBreakdown:
    """`estimate` of `plan` as `profile` runs it (its stack when `restack`, its overlap, its derived
    kernels (profile.kernels: the [[kernel]] rows of its GEMMs and attention family) scaled by the
    calibrated figures, its fixed costs as stage terms and once a step: Pricing); `kw` passes
    profiles / calibration / index, or other `kernels`."""
    pricing = Pricing(profile, figures)
    kernels = scaled_kernels(kw.pop("kernels", None) or profile.kernels, figures.kernel_scale)
    p = apply_stack(plan, profile) if restack else plan
    gpu = is_gpu(cluster)
    ov, step = pricing.overheads, pricing.step_s(gpu)
    cost = estimate(p, model, cluster, kernels=kernels, runtime=profile.overlap, overheads=ov, step_s=step, **kw)
    note = (
        f"priced for runtime {profile.name}; fixed costs: {ov.microbatch_s * 1e3:.2f} ms a micro-batch a stage, "
        f"{step * 1e3:.2f} ms a step" + (f", a GPU block issued in ≥ {3 * ov.issue_s * 1e6:.0f} µs" if gpu else "")
    )
    return cost.model_copy(update={"notes": (*cost.notes, note)})


# Fewer measured runs than this fit kernel_scale alone (microbatch_s stays the prior): with 3 runs of
# similar micro-batch counts the two figures trade off and the per-micro-batch cost runs away. A
# regularised fit (fit_terms with reg > 0, as `meshplan calibrate` and bench/published.py run it)
# fits them jointly from MIN_RUNS_JOINT runs instead, pulled toward the runtime's priors.
MIN_RUNS_FOR_MICROBATCH = 6
MIN_RUNS_JOINT = 3
# The priors' spreads for the regularised fit: a per-micro-batch cost MB_SIGMA_S or a per-step cost
# STEP_SIGMA_S away from its prior costs as much as REG in the sum of squared log errors (0.01: one
# run 10 % off). Stated, not fitted: tens of ms per micro-batch is the scale the issue measured on
# Megatron-DeepSpeed stacks, and a per-step cost beyond 100 ms is beyond any launch-bound prior.
MB_SIGMA_S = 0.010
STEP_SIGMA_S = 0.100
REG = 0.01


def fit_figures(
    price, scale_bounds: tuple[float, float] = (0.15, 4.0), max_mb_s: float = 5.0, fit_microbatch: bool = True
) -> tuple[float, float]:
    """(kernel_scale, microbatch_s) minimising the mean squared log(predicted / measured) over runs
    (fit_terms without the per-step cost or a prior)."""
    scale, mb, _ = fit_terms(price, scale_bounds, max_mb_s, fit_microbatch)
    return scale, mb


def fit_terms(
    price,
    scale_bounds: tuple[float, float] = (0.15, 4.0),
    max_mb_s: float = 5.0,
    fit_microbatch: bool = True,
    fit_step: bool = False,
    prior: tuple[float, float] = (0.0, 0.0),
    reg: float = 0.0,
    max_step_s: float = 60.0,
) -> tuple[float, float, float]:
    """(kernel_scale, microbatch_s, step_s) minimising the mean squared log(predicted / measured)
    over runs plus, when `reg` > 0, reg × ((microbatch_s − prior[0]) / MB_SIGMA_S)² + ((step_s −
    prior[1]) / STEP_SIGMA_S)², over n (a prior worth `reg` of squared log error); both costs ≥ 0.

    `price(scale)` returns, per run, (predicted step at microbatch_s = step_s = 0, its slot count,
    measured): the costs add slots × microbatch_s + step_s, so for each scale (golden-section search
    in log space) the best costs are a cheap coordinate search without pricing again. Pure: the
    caller prices."""

    def best_costs(rows: list[tuple[float, int, float]]) -> tuple[float, float, float]:
        n = max(1, len(rows))

        def loss(mb: float, st: float) -> float:
            fit = sum(math.log((p + k * mb + st) / m) ** 2 for p, k, m in rows)
            pen = ((mb - prior[0]) / MB_SIGMA_S) ** 2 * fit_microbatch + (
                (st - prior[1]) / STEP_SIGMA_S
            ) ** 2 * fit_step
            return (fit + reg * pen) / n

        mb = prior[0] if fit_microbatch and reg > 0 else 0.0
        st = prior[1] if fit_step and reg > 0 else 0.0
        if not fit_microbatch and not fit_step:
            return loss(0.0, 0.0), 0.0, 0.0
        for _ in range(3 if fit_microbatch and fit_step else 1):
            if fit_microbatch:
                cand = golden(lambda x, st=st: loss(x, st), 0.0, max_mb_s, iters=30)
                mb = cand if loss(cand, st) < loss(0.0, st) else 0.0
            if fit_step:
                cand = golden(lambda x, mb=mb: loss(mb, x), 0.0, max_step_s, iters=30)
                st = cand if loss(mb, cand) < loss(mb, 0.0) else 0.0
        return loss(mb, st), mb, st

    memo: dict[float, tuple[float, float, float]] = {}

    def at(x: float) -> float:
        memo[x] = best_costs(price(math.exp(x)))
        return memo[x][0]

    x = golden(at, math.log(scale_bounds[0]), math.log(scale_bounds[1]), iters=12)
    at(x)
    return math.exp(x), memo[x][1], memo[x][2]


GOLD = (math.sqrt(5) - 1) / 2


def golden(f, lo: float, hi: float, iters: int = 18) -> float:
    """Golden-section minimum of a unimodal f on [lo, hi]."""
    a, b = lo, hi
    c, d = b - GOLD * (b - a), a + GOLD * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - GOLD * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLD * (b - a)
            fd = f(d)
    return (a + b) / 2
