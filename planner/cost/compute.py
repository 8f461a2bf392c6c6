"""Compute time from shape: a layer as its list of kernels, each priced on the device's roofline.

A kernel with F FLOPs moving Q bytes takes max(F / (P·η(shape)), Q / (B·η_mem)) on a device of dense
peak P and memory bandwidth B (Williams, Waterman & Patterson, "Roofline", CACM 2009). Kernels of one
layer run one after another on one stream, so their times add (a layer-wide max would hide the
memory-bound ones). η for a GEMM is GEMM_PEAK_FRACTION × its tile and wave quantisation (below);
attention runs as a flash kernel (FLASH_ATTENTION_FRACTION of peak, causal tiles skipped) or
eagerly (two batched GEMMs of depth head_dim and a memory-bound softmax over the s×s scores).
Element-wise kernels (norms, activations, residual adds, dropout, layout copies) are memory-bound.
Backward: two GEMMs per forward GEMM (input and weight gradients, each its own shape), flash
backward 2.5× its forward FLOPs (5 matmuls to the forward's 2, Dao, FlashAttention-2, 2023 §3.1.2),
element-wise kernels twice the forward's bytes (read the saved input and the gradient, write one).

Nothing here is fitted on measured runs: every fraction is a sourced [[kernel]] row of
planner/specs/data/runtimes.toml, per architecture, and a runtime's attention runs at its kernel
family's (attention_kernels); measured profiles, where present, win (planner.cost.completion), and
fitted figures enter only as a calibration (planner.cost.runtimes.Figures.kernel_scale).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from planner.cost.memory import Stack
from planner.cost.runtime_table import KERNEL_ROWS, kernel_fractions
from planner.measure.profiles import MEMORY_EFFICIENCY, LayerProfile, ProfileKey
from planner.specs import flops
from planner.specs.flops import DTYPE_BYTES
from planner.specs.model import ModelSpec

# The kernels' attained fractions of the dense peak are data: planner/specs/data/runtimes.toml
# [[kernel]] rows, each with its source (planner.cost.runtime_table), never fitted on training runs.
# Large bf16/fp16 GEMMs in cuBLAS: about 80% of the dense tensor-core peak (NVIDIA, "Matrix
# Multiplication Background User's Guide": A100 ≈ 250 of 312 TFLOP/s at large sizes).
_GEMM_PAIRS, GEMM_PEAK_FRACTION = kernel_fractions("cublas")
# Output tile of one thread block (cuBLAS's large bf16 tiles are 128×128 to 256×128): a GEMM runs in
# ⌈tiles / SMs⌉ waves, and a partial last wave or a partial edge tile idles the rest.
GEMM_TILE = 128
# FlashAttention-2 forward+backward on A100: 50–73% of peak (Dao 2023, abstract and Fig. 4-6);
# on H100 it reaches only ~35% (Shah et al., FlashAttention-3, 2024, abstract: FA2 does not use
# Hopper's WGMMA/TMA). Other architectures: the A100 figure's lower end. Other kernel families
# (FA3, FlashAttention in Triton) are [[kernel]] rows a runtime names (`attention_kernels`).
_FA2_PAIRS, FLASH_ATTENTION_FRACTION_OTHER = kernel_fractions("fa2")
FLASH_ATTENTION_FRACTION = dict(_FA2_PAIRS)
FLASH_BACKWARD_FLOP_RATIO = 2.5


def compute_peak_flop_per_s(peak: float, sustained_gemm_flop_per_s: float | None, dtype: str) -> float:
    """The tensor peak kernels are priced against: the datasheet's, or on a power-capped board (the
    catalog's `sustained_gemm_flop_per_s`, a large cuBLAS GEMM run back to back) the peak at the
    clock it sustains, measured rate / GEMM_PEAK_FRACTION, since that GEMM reaches
    GEMM_PEAK_FRACTION of whatever clock it runs at. T4: 24 / 0.8 = 30 of 65 TFLOP/s (70 W cap;
    data/gpus.toml). fp32 runs on the CUDA cores, whose datasheet peak is kept. MFU keeps the
    datasheet peak: this is a time, not a definition."""
    if sustained_gemm_flop_per_s is None or dtype == "fp32":
        return peak
    return min(peak, sustained_gemm_flop_per_s / GEMM_PEAK_FRACTION)


@dataclass(frozen=True, slots=True)
class KernelEfficiency:
    """Fractions of the dense peak that large GEMMs and flash attention attain, per architecture
    (pairs, so the value is hashable), with `other` for architectures not listed and the figures'
    provenance. PRIOR holds the sourced assumptions above; planner.cost.fitted any fitted set."""

    gemm: tuple[tuple[str, float], ...] = ()
    gemm_other: float = GEMM_PEAK_FRACTION
    flash: tuple[tuple[str, float], ...] = tuple(FLASH_ATTENTION_FRACTION.items())
    flash_other: float = FLASH_ATTENTION_FRACTION_OTHER
    source: str = "prior: [[kernel]] cublas and fa2 of planner/specs/data/runtimes.toml (sourced, not fitted)"

    def gemm_fraction(self, architecture: str | None) -> float:
        return dict(self.gemm).get(architecture or "", self.gemm_other)

    def flash_fraction(self, architecture: str | None) -> float:
        return dict(self.flash).get(architecture or "", self.flash_other)


PRIOR = KernelEfficiency(gemm=_GEMM_PAIRS)


def attention_kernels(name: str, base: KernelEfficiency = PRIOR) -> KernelEfficiency:
    """`base` with the flash fractions of the attention [[kernel]] row `name` (data/runtimes.toml):
    the derived, uncalibrated kernels of a runtime whose attention runs that kernel family."""
    if name == "fa2":
        return base
    pairs, other = kernel_fractions(name)
    return replace(
        base, flash=pairs, flash_other=other, source=f"{base.source}; attention {name}: {KERNEL_ROWS[name]['source']}"
    )


@dataclass(frozen=True, slots=True)
class Device:
    """What the roofline needs of a device (NodeSpec figures; num_sms / architecture may be unknown)."""

    peak_flop_per_s: float
    memory_bandwidth_bytes_per_s: float
    num_sms: int | None = None
    architecture: str | None = None
    kernels: KernelEfficiency = PRIOR
    peak_fp8_flop_per_s: float | None = None  # dense fp8 tensor-core peak (None: no fp8)

    @property
    def gemm_fraction(self) -> float:
        return self.kernels.gemm_fraction(self.architecture)


def gemm_quantisation(m: int, n: int, num_sms: int | None) -> float:
    """Useful fraction of the tiles a GEMM's M×N output launches: edge tiles (M·N over the padded
    ⌈M/T⌉T·⌈N/T⌉T) times the last wave (tiles / (⌈tiles / SMs⌉·SMs)); 1 for unknown SM counts."""
    tm, tn = ceil(m / GEMM_TILE), ceil(n / GEMM_TILE)
    edge = m * n / (tm * tn * GEMM_TILE * GEMM_TILE)
    if not num_sms:
        return edge
    tiles = tm * tn
    return edge * tiles / (ceil(tiles / num_sms) * num_sms)


def gemm_s(m: int, n: int, k: int, e: int, dev: Device, count: int = 1, out_e: int | None = None) -> float:
    """`count` independent (m×k)·(k×n) GEMMs: 2mnk FLOPs each at η = the GEMM fraction × quantisation
    (a batch quantises as one grid of count × tiles), or reading A and B (e bytes an element) and
    writing C (out_e bytes, default e) once at η_mem × bandwidth, whichever is longer."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    q = gemm_quantisation(m, n * count, dev.num_sms) if count > 1 else gemm_quantisation(m, n, dev.num_sms)
    t_flops = count * 2.0 * m * n * k / (dev.peak_flop_per_s * dev.gemm_fraction * q)
    c_e = e if out_e is None else out_e
    t_bytes = count * (e * (m * k + k * n) + c_e * m * n) / (dev.memory_bandwidth_bytes_per_s * MEMORY_EFFICIENCY)
    return max(t_flops, t_bytes)


def gemm_train_s(m: int, n: int, k: int, e: int, dev: Device, out_e: int | None = None) -> tuple[float, float]:
    """(forward, backward) of a linear layer Y = X·W with X m×k, W k×n: backward is dX = dY·Wᵀ
    (m×k output, depth n) and dW = Xᵀ·dY (k×n output, depth m); operands e bytes, outputs out_e."""
    fwd = gemm_s(m, n, k, e, dev, out_e=out_e)
    return fwd, gemm_s(m, k, n, e, dev, out_e=out_e) + gemm_s(k, n, m, e, dev, out_e=out_e)


def memory_s(num_bytes: float, dev: Device) -> float:
    return num_bytes / (dev.memory_bandwidth_bytes_per_s * MEMORY_EFFICIENCY)


def attention_train_s(
    model: ModelSpec, b: int, s: int, tp: int, dtype: str, dev: Device, attention: str, dropout: bool
) -> tuple[float, float]:
    """(forward, backward) of the attention core of one block on one tp rank.

    flash / sdpa: causal tiles above the diagonal are skipped, so the kernel runs half of the
    4·b·s²·h/t FLOPs flops.block_forward_flops counts, at FLASH_ATTENTION_FRACTION of peak.
    eager: QKᵀ and A·V as b·a/t batched GEMMs (s×s×d and s×d×s, full, then masked), the fused
    scale-mask-softmax reading and writing the s×s scores (plus the dropout mask and output), and in
    backward two batched GEMMs per forward one and the softmax gradient at twice the bytes.
    """
    e = DTYPE_BYTES[dtype]
    heads = max(1, model.num_heads // tp)
    d = model.head_dim
    if attention in ("flash", "sdpa"):
        frac = dev.kernels.flash_fraction(dev.architecture)
        fwd = 0.5 * flops.attention_core_forward_flops(model, b, s, tp) / (dev.peak_flop_per_s * frac)
        io = e * b * s * heads * d * 4  # q, k, v read, o written
        fwd = max(fwd, memory_s(io, dev))
        return fwd, max(FLASH_BACKWARD_FLOP_RATIO * fwd, memory_s(2 * io, dev))
    n = b * heads
    scores = e * n * s * s
    softmax = 2 * scores + (scores / e * (2 * e + 1) if dropout else 0.0)
    fwd = gemm_s(s, s, d, e, dev, n) + gemm_s(s, d, s, e, dev, n) + memory_s(softmax, dev)
    bwd = 2 * (gemm_s(s, s, d, e, dev, n) + gemm_s(s, d, s, e, dev, n)) + memory_s(2 * softmax, dev)
    return fwd, bwd


def block_linear_shapes(model: ModelSpec, b: int, s: int, tp: int) -> list[tuple[int, int, int]]:
    """(m, n, k) of a block's linear layers on one tp rank, Y(m×n) = X(m×k)·W(k×n), T = b·s tokens:
    q/k/v (T, (h + 2kv)/t, h), output projection (T, h, h/t), MLP up (T, (mats − 1)·f/t, h) and
    down (T, h, f/t), mats = 2 for GELU, 3 for SwiGLU."""
    t_tok, h, f = b * s, model.hidden, model.ffn
    kv = model.kv_heads * model.head_dim
    mats = 2 if model.family == "gpt" else 3
    return [(t_tok, (h + 2 * kv) // tp, h), (t_tok, h, h // tp), (t_tok, (mats - 1) * f // tp, h), (t_tok, h, f // tp)]


# Bytes per element of one dynamic-scaling fp8 cast (torchao.float8 tensorwise, torchtitan's
# default): read the e-byte tensor for its amax, read it again to scale and write 1 byte, then the
# column-major copy the other GEMM operand order needs (Hopper's fp8 GEMMs take K-major operands
# only): read 1, write 1. Transformer Engine's delayed scaling fuses the amax into one cast-transpose
# kernel (e + 2 bytes), so this is the costlier of the two stacks' casts.
def fp8_cast_bytes_per_element(e: int) -> int:
    return 2 * e + 1 + 2


def fp8_linear_delta_s(model: ModelSpec, b: int, s: int, tp: int, dtype: str, dev: Device) -> tuple[float, float]:
    """(forward, backward) seconds fp8 linears add to a block (negative: a saving), per tp rank.

    Every forward GEMM and both backward GEMMs (dX = dY·Wᵀ, dW = Xᵀ·dY) of the block's linears
    (block_linear_shapes) run on the fp8 peak at the architecture's GEMM fraction (the bf16
    figure: an assumption, not fitted), operands 1 byte an element and outputs in the dtype
    (torch._scaled_mm / TE write bf16), instead of at the dtype's peak; and each linear casts X (m×k) and W (k×n) in forward and dY (m×n) in backward
    (fp8_cast_bytes_per_element each, memory-bound). Attention, norms, embedding and head keep
    the dtype (torchtitan's float8 converter and TE convert nn.Linear layers of the blocks only).
    """
    assert dev.peak_fp8_flop_per_s is not None, "fp8 linears need a device with an fp8 peak (estimate checks)"
    e = DTYPE_BYTES[dtype]
    fp8 = replace(dev, peak_flop_per_s=dev.peak_fp8_flop_per_s)
    c = fp8_cast_bytes_per_element(e)
    dfwd = dbwd = 0.0
    for m_, n_, k_ in block_linear_shapes(model, b, s, tp):
        f0, g0 = gemm_train_s(m_, n_, k_, e, dev)
        f1, g1 = gemm_train_s(m_, n_, k_, 1, fp8, out_e=e)
        dfwd += f1 - f0 + memory_s(c * (m_ * k_ + k_ * n_), dev)
        dbwd += g1 - g0 + memory_s(c * m_ * n_, dev)
    return dfwd, dbwd


def block_train_s(model: ModelSpec, b: int, s: int, tp: int, dtype: str, dev: Device) -> tuple[float, float]:
    """(forward, backward) of one block on one tp rank as meshplan's runtime runs it (SDPA, no
    dropout, no sequence parallelism): the four projections (three for the MLP under SwiGLU), the
    attention core, and the element-wise kernels' bytes (read + write): two norms 2·2·T·h, two
    residual adds 2·3·T·h, GELU 2·T·f/t or SiLU·gate 5·T·f/t, SDPA's output transpose 2·T·h/t, RoPE
    2·T·(h + 2kv)/t (Llama), each e bytes an element, T = b·s tokens."""
    e = DTYPE_BYTES[dtype]
    t_tok, h, f = b * s, model.hidden, model.ffn
    kv = model.kv_heads * model.head_dim
    fwd = bwd = 0.0
    for m_, n_, k_ in block_linear_shapes(model, b, s, tp):
        a, g = gemm_train_s(m_, n_, k_, e, dev)
        fwd, bwd = fwd + a, bwd + g
    a, g = attention_train_s(model, b, s, tp, dtype, dev, "sdpa", False)
    fwd, bwd = fwd + a, bwd + g
    elem = 4 * t_tok * h + 6 * t_tok * h + 2 * t_tok * h / tp
    elem += 2 * t_tok * f / tp if model.family == "gpt" else 5 * t_tok * f / tp + 2 * t_tok * (h + 2 * kv) / tp
    fwd += memory_s(e * elem, dev)
    bwd += memory_s(2 * e * elem, dev)
    return fwd, bwd


def loss_logit_traffic_bytes(loss: str, e: int) -> tuple[int, int]:
    """(forward, backward) bytes each loss kernel reads and writes per logit element (b·s·V/t), the
    kernels being memory-bound on the logits (a few FLOPs per element); e = the working dtype's
    bytes. The kernels as flops.loss_logit_bytes describes them:

    - "torch", F.cross_entropy(logits.float()): forward the cast (read e, write 4) and log-softmax
      (read 4, write 4): e + 12; backward nll's dense fp32 gradient (write 4), log-softmax's backward
      (read gradient and output 4 + 4, write 4) and the cast's (read 4, write e): e + 20.
    - "vocab-parallel", Megatron-LM's vocab_parallel_cross_entropy(output.float()) (SC'21-era
      megatron/mpu/cross_entropy.py): the cast (e + 4), the row max (read 4), subtracting it in place
      (4 + 4), exp in place (4 + 4), the row sum (read 4) and the in-place division that leaves the
      softmax for backward (4 + 4): e + 36; backward scales the softmax by the loss gradient in place
      (4 + 4) and casts back (read 4, write e): e + 12.
    - "fused", flash-attn's CrossEntropyLoss kernel: forward reads the logits once (online
      log-sum-exp): e; backward reads them again and writes their gradient: 2e.
    """
    if loss == "torch":
        return e + 12, e + 20
    if loss == "vocab-parallel":
        return e + 36, e + 12
    if loss == "fused":
        return e, 2 * e
    raise ValueError(f"unknown loss kernel {loss!r}")


def loss_time_delta_s(
    model: ModelSpec, b: int, s: int, tp: int, dtype: str, dev: Device, loss: str
) -> tuple[float, float]:
    """(forward, backward) seconds the stack's loss kernel takes beyond the runtime's torch cross
    entropy, which head_train_s (and so every head profile row) prices: the difference of their
    logit traffic (loss_logit_traffic_bytes) over the b·s·V/t logits at memory bandwidth."""
    e = DTYPE_BYTES[dtype]
    logits = b * s * model.padded_vocab / tp
    (f0, g0), (f1, g1) = loss_logit_traffic_bytes("torch", e), loss_logit_traffic_bytes(loss, e)
    return memory_s((f1 - f0) * logits, dev), memory_s((g1 - g0) * logits, dev)


def head_train_s(model: ModelSpec, b: int, s: int, tp: int, dtype: str, dev: Device) -> tuple[float, float]:
    """(forward, backward) of the final norm (read + write e·T·h; backward twice that), the
    vocab-parallel LM head GEMM and torch's cross entropy on fp32 logits (the runtime's loss:
    loss_logit_traffic_bytes "torch")."""
    e = DTYPE_BYTES[dtype]
    t_tok, h = b * s, model.hidden
    logits = t_tok * model.padded_vocab / tp
    fwd, bwd = gemm_train_s(t_tok, model.padded_vocab // tp, h, e, dev)
    lf, lb = loss_logit_traffic_bytes("torch", e)
    fwd += memory_s(2 * e * t_tok * h + lf * logits, dev)
    bwd += memory_s(4 * e * t_tok * h + lb * logits, dev)
    return fwd, bwd


def estimate_layer_from_shape(model: ModelSpec, key: ProfileKey, dev: Device, like: LayerProfile) -> LayerProfile:
    """`like` (estimate_layer's row for the same key: its bytes) with block and head times from
    their kernels; the embedding keeps like's memory-bound times. Recompute adds one forward."""
    b, s, t = key.micro_batch_size, key.seq_len, key.tp
    if key.layer_kind == "block":
        fwd, bwd = block_train_s(model, b, s, t, key.dtype, dev)
    elif key.layer_kind == "head":
        fwd, bwd = head_train_s(model, b, s, t, key.dtype, dev)
    else:
        return like
    if key.recompute:
        bwd += fwd
    return LayerProfile(
        key=key,
        forward_s=fwd,
        backward_s=bwd,
        param_bytes=like.param_bytes,
        activation_bytes=like.activation_bytes,
        workspace_bytes=like.workspace_bytes,
        estimated=True,
        efficiency=None,
    )


def cp_shape_delta_s(
    model: ModelSpec, b: int, s: int, tp: int, dtype: str, dev: Device, cp: int
) -> tuple[float, float]:
    """(forward, backward) seconds a block on one cp rank takes beyond 1/cp of the whole-sequence
    block: its linears and element-wise kernels run on T/cp tokens, and smaller GEMMs lose to tile
    and wave quantisation and fall towards the memory roof (gemm_s), which 1/cp of the T-token time
    does not see; the attention core is exactly 1/cp of the causal work with load-balanced chunks
    (planner.cost.stage), so it is left out of both sides. Zero where every kernel scales linearly
    in T (compute-bound, unquantised GEMMs)."""
    if cp == 1:
        return 0.0, 0.0
    part = block_train_s(model, b, s // cp, tp, dtype, dev)
    part_att = attention_train_s(model, b, s // cp, tp, dtype, dev, "sdpa", False)
    full = block_train_s(model, b, s, tp, dtype, dev)
    full_att = attention_train_s(model, b, s, tp, dtype, dev, "sdpa", False)
    return tuple(  # type: ignore[return-value]
        (part[i] - part_att[i]) - (full[i] - full_att[i]) / cp for i in (0, 1)
    )


def stack_time_delta_s(
    model: ModelSpec, b: int, s: int, tp: int, dtype: str, dev: Device, stack: Stack
) -> tuple[float, float]:
    """(forward, backward) seconds a block on `stack` takes beyond meshplan's runtime block (the
    profile's): the attention core as that kernel runs it (attention_train_s), FlashAttention's
    layout dropping SDPA's output transpose (2·T·h/t elements read + written), dropout on the two
    hidden outputs (read e, write e and a 1-byte mask: (2e + 1)·T·h each), sequence parallelism
    running the norms and residual adds (10·T·h elements) on T/t tokens, and fp8 linears
    (fp8_linear_delta_s)."""
    if stack == Stack(selective=stack.selective, recompute_every=stack.recompute_every):
        return 0.0, 0.0
    if stack.fp8:
        a, g = stack_time_delta_s(model, b, s, tp, dtype, dev, replace(stack, fp8=False))
        f8, g8 = fp8_linear_delta_s(model, b, s, tp, dtype, dev)
        return a + f8, g + g8
    e = DTYPE_BYTES[dtype]
    t_tok, h = b * s, model.hidden
    base_f, base_b = attention_train_s(model, b, s, tp, dtype, dev, "sdpa", False)
    f, g = attention_train_s(model, b, s, tp, dtype, dev, stack.attention, stack.dropout)
    dfwd, dbwd = f - base_f, g - base_b
    elem = 0.0
    if stack.attention == "flash":
        elem -= e * 2 * t_tok * h / tp
    if stack.dropout:
        elem += 2 * (2 * e + 1) * t_tok * h
    if stack.sequence_parallel and tp > 1:
        elem -= e * 10 * t_tok * h * (1 - 1 / tp)
    return dfwd + memory_s(elem, dev), dbwd + memory_s(2 * elem, dev)
