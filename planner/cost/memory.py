"""Memory a stage holds, term by term, the way real training stacks allocate it.

A layer profile (measured on meshplan's runtime, or `planner.measure.profiles.estimate_layer`)
describes that runtime's block: torch SDPA (a flash kernel), no dropout, no sequence parallelism,
recompute none or full, torch's cross entropy on fp32 logits. A plan may describe another stack
(`Plan.attention`, `Plan.loss`, `Plan.dropout`, `Plan.fp8`, `StagePlan.sequence_parallel`, selective
recompute, `StagePlan.recompute_every`); this module turns the profile's bytes into that stack's bytes by adding
or removing the terms that differ, each derived below from what the kernels keep for backward
(element counts after Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", 2022, Table 2 and §4: a = heads, t = tp, s = seq, b = micro-batch, h = hidden, e = dtype
bytes). Every function is linear in the micro-batch size and the stage's block count stays outside,
so stage coefficients remain a·n + b.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.specs import flops
from planner.specs.flops import DTYPE_BYTES
from planner.specs.model import ModelSpec

# A 1-byte mask per dropped element (torch's native_dropout keeps a bool mask), Korthikanti Table 2.
DROPOUT_MASK_BYTES = 1


@dataclass(frozen=True, slots=True)
class Stack:
    """The options of a stage that change what it keeps (hashable: part of StageContext)."""

    attention: str = "sdpa"
    loss: str = "torch"
    dropout: bool = False
    sequence_parallel: bool = False
    selective: bool = False
    recompute_every: int = 1
    fp8: bool = False
    cp: int = 1  # context parallelism (StagePlan.cp): each rank holds seq / cp tokens
    # fp8 weights cast once a step and cached across micro-batches (Transformer Engine under
    # Megatron-core: is_first_microbatch), not kept per micro-batch in flight (torchao)
    fp8_weight_cached: bool = False
    # selective recompute as torchtitan's per-op policy (op_sac_kept_bytes), not the attention core's
    selective_op: bool = False
    # Megatron-core + Transformer Engine's fused block kernels (fused_block_kept_delta_bytes)
    fused_block: bool = False


RUNTIME = Stack()  # what meshplan's runtime (and so every profile row) does


def attention_scores_bytes(m: ModelSpec, batch: int, seq: int, tp: int, dtype: str) -> float:
    """One s×s matrix per local head: e·b·(a/t)·s² bytes."""
    return DTYPE_BYTES[dtype] * batch * (m.num_heads / tp) * seq * seq


def eager_attention_kept_bytes(m: ModelSpec, batch: int, seq: int, tp: int, dtype: str, dropout: bool) -> float:
    """What non-flash attention keeps beyond flash's q, k, v and output, per block and tp rank.

    softmax(QKᵀ) keeps its output for its backward and A·V reads it: e·a·s²·b/t. With attention
    dropout the mask (1 byte) and the dropped probabilities A·V then reads (e) are kept as well:
    (2e + 1)·a·s²·b/t — Korthikanti's 5as²b at e = 2. Flash kernels keep none of these (they
    recompute the scores tile by tile in backward and regenerate the dropout mask from the RNG seed).
    """
    scores = attention_scores_bytes(m, batch, seq, tp, dtype)
    if not dropout:
        return scores
    e = DTYPE_BYTES[dtype]
    return scores * (2 * e + DROPOUT_MASK_BYTES) / e


def hidden_dropout_mask_bytes(m: ModelSpec, batch: int, seq: int) -> float:
    """Dropout after the attention and the MLP output projections: two b×s×h 1-byte masks, on the
    replicated activations (Korthikanti Table 2: sbh each)."""
    return 2 * DROPOUT_MASK_BYTES * batch * seq * m.hidden


def replicated_bytes(m: ModelSpec, batch: int, seq: int, dtype: str, dropout: bool) -> float:
    """Activations every tp rank keeps whole without sequence parallelism: the norms' inputs and
    outputs (flops.block_replicated_activation_bytes) and the hidden dropout masks."""
    out = flops.block_replicated_activation_bytes(m, batch, seq, dtype)
    return out + (hidden_dropout_mask_bytes(m, batch, seq) if dropout else 0.0)


def block_kept_bytes(
    m: ModelSpec, batch: int, seq: int, tp: int, dtype: str, stack: Stack, runtime_bytes: float
) -> float:
    """Bytes one block keeps without recompute under `stack`, from the runtime's `runtime_bytes`.

    + eager attention's s×s terms (its A·V output is permuted into a copy, as SDPA's is); none
      under selective recompute, which drops exactly these and keeps the linear layers' inputs
      (Korthikanti §4.2.2's 34·sbh/t with sequence parallelism);
    + hidden dropout masks;
    − with sequence parallelism, (1 − 1/t) of the replicated part: norms and dropout run on s/t of
      the sequence, so each rank keeps 1/t of them (Korthikanti eq. 4 → 34·sbh/t);
    − FlashAttention's own layout (b×s×heads×d): the output it saves is the output projection's
      input, where SDPA's b×heads×s×d output is transposed into a second b×s×h/t copy;
    − under selective recompute with SDPA, the kernel's own output (SDPA saves it for its backward;
      the projection keeps its transposed copy), rebuilt in backward with the core;
    """
    if stack.selective and stack.selective_op:
        return op_sac_kept_bytes(m, batch, seq, tp, dtype, stack.sequence_parallel)
    out = runtime_bytes
    if stack.attention == "flash" or (stack.attention == "sdpa" and stack.selective):
        out -= flops.block_input_bytes(m, batch, seq, dtype) / tp
    if stack.attention == "eager" and not stack.selective:
        out += eager_attention_kept_bytes(m, batch, seq, tp, dtype, stack.dropout)
    if stack.dropout:
        out += hidden_dropout_mask_bytes(m, batch, seq)
    out -= gqa_repeat_bytes(m, batch, seq, tp, dtype, stack)
    out -= fused_block_saved_bytes(m, batch, seq, tp, dtype, stack)
    if stack.sequence_parallel and tp > 1:
        out -= replicated_bytes(m, batch, seq, dtype, stack.dropout) * (1 - 1 / tp)
    if stack.fp8:
        out += fp8_linear_kept_delta_bytes(m, batch, seq, tp, dtype, stack.sequence_parallel)
        if stack.fp8_weight_cached:
            out -= linear_weight_params(m, tp)  # held once per block instead: fp8_cached_weight_bytes
    return out


# The matrix multiplies of a Llama block in forward order (torchtitan's Attention and FeedForward):
# wq, wk, wv, [SDPA], wo, w1, w3, w2. torchtitan's per-op policy saves every odd one.
OP_SAC_SAVED_MMS = ("wq", "wv", "w1", "w2")
OP_SAC_RECOMPUTED_MMS = ("wk", "wo", "w3")


def _mm_out_elems(m: ModelSpec, name: str, tp: int) -> float:
    """Output elements per token of one of a block's matrix multiplies on one tp rank. Column-parallel
    projections (wq, wk, wv, w1, w3) keep 1/t of their outputs; the row-parallel ones (wo, w2) produce
    partial sums of the whole h before their all-reduce / reduce-scatter."""
    kv = m.kv_heads * m.head_dim
    return {"wq": m.hidden / tp, "wk": kv / tp, "wv": kv / tp, "wo": m.hidden, "w1": m.ffn / tp,
            "w3": m.ffn / tp, "w2": m.hidden}[name]  # fmt: skip


def op_sac_kept_bytes(m: ModelSpec, batch: int, seq: int, tp: int, dtype: str, sequence_parallel: bool) -> float:
    """What one block keeps under torchtitan's per-op selective activation checkpointing, per tp rank.

    torchtitan (torchtitan/parallelisms/parallelize_llama.py, 2024: `_apply_ac_to_transformer_block`
    with selective_ac_option "op") wraps each block in a non-reentrant checkpoint whose policy saves the
    outputs of aten.mm, the SDPA flash / efficient kernels and functional reduce_scatter, "except every
    second mm"; every other op is recomputed in backward. So a block keeps
    - its input (the checkpoint's argument): b·s·h, b·s·h/t under sequence parallelism;
    - the outputs of the 1st, 3rd, 5th and 7th mm of wq, wk, wv, wo, w1, w3, w2: wq (h/t), wv (kv/t),
      w1 (f/t) and w2 (the row-parallel partial sum, h per token);
    - the SDPA output (h/t) and its fp32 log-sum-exp (4 bytes per head and token, a/t heads);
    - with sequence parallelism on tp > 1, the reduce-scatter outputs after wo and w2 (2·h/t).
    Everything is e bytes per element except the log-sum-exp. GELU (gpt) blocks have no w3: the odd mms
    are then wq, wv, w1 (the up projection) and the attention's wo — priced as the Llama block."""
    e = DTYPE_BYTES[dtype]
    sp = sequence_parallel and tp > 1
    per_token = m.hidden / (tp if sp else 1)
    per_token += sum(_mm_out_elems(m, n, tp) for n in OP_SAC_SAVED_MMS) + m.hidden / tp
    if sp:
        per_token += 2 * m.hidden / tp
    lse = 4.0 * batch * seq * m.num_heads / tp
    return e * batch * seq * per_token + lse


def op_sac_recompute_flops(m: ModelSpec, batch: int, seq: int, tp: int) -> float:
    """Forward FLOPs torchtitan's per-op policy runs again in backward: the mms it does not save (wk,
    wo, w3: 2·b·s·h·(kv + h + f)/t); norms, RoPE and the activation are memory-bound and left out."""
    kv = m.kv_heads * m.head_dim
    return 2.0 * batch * seq * m.hidden * (kv + m.hidden + m.ffn) / tp


def gqa_repeat_bytes(m: ModelSpec, batch: int, seq: int, tp: int, dtype: str, stack: Stack) -> float:
    """What a flash kernel does not keep of the runtime's K, V repeated to every query head: the
    runtime block (flops.block_activation_bytes) keeps k and v at h each under GQA; FlashAttention-2
    and Transformer Engine's attention read the g kv heads themselves ("MQA/GQA by passing in KV with
    fewer heads than Q", flash_attn_interface.flash_attn_func), so they keep 2·kv: e·b·s·(2h − 2kv)/t.
    0 for other kernels and for multi-head attention."""
    kv = m.kv_heads * m.head_dim
    if stack.attention != "flash" or m.family == "gpt" or kv >= m.hidden:
        return 0.0
    return DTYPE_BYTES[dtype] * batch * seq * 2 * (m.hidden - kv) / tp


def fused_block_saved_bytes(m: ModelSpec, batch: int, seq: int, tp: int, dtype: str, stack: Stack) -> float:
    """What Megatron-core with Transformer Engine's fused kernels does not keep of a Llama block that
    the runtime block keeps (`Stack.fused_block`; 0 for GPT blocks, whose LayerNorms keep input and
    output either way, and for other stacks):
    - RMSNorm fused into the following linear (TE LayerNormLinear / LayerNormMLP: the norm's input,
      its output as the GEMM's input and fp32 rstd are saved), not the un-fused x·rstd intermediate:
      2·b·s·h for the two norms (1/t of it under sequence parallelism);
    - SwiGLU as one fused function that saves only its input, the fc1 output of w1 and w3 (2f), whose
      f output is the fc2 input (megatron/core/fusions/fused_bias_swiglu.py, SwiGLUFunction): 3f of the
      runtime's 4f (w1 out, SiLU out, w3 out, product), e·b·s·f/t less."""
    if not stack.fused_block or m.family == "gpt":
        return 0.0
    e, b, s = DTYPE_BYTES[dtype], batch, seq
    norms = 2 * b * s * m.hidden / (tp if stack.sequence_parallel and tp > 1 else 1)
    return e * (norms + b * s * m.ffn / tp)


def fp8_cached_weight_bytes(m: ModelSpec, tp: int, stack: Stack) -> float:
    """Per block, the fp8 weight copy a weight-caching runtime holds once for the whole step (1 byte
    per linear parameter, linear_weight_params): Megatron-core passes `is_first_microbatch` to
    Transformer Engine's linears, which cast the weight to fp8 on the first micro-batch and reuse
    the cached copy (and its transpose for dgrad is the same tensor's fp8 transpose, cached alike)
    for every later micro-batch (transformer_engine/pytorch/module/linear.py, `fp8 weight caching`).
    0 unless `stack.fp8` and `stack.fp8_weight_cached`."""
    return linear_weight_params(m, tp) if stack.fp8 and stack.fp8_weight_cached else 0.0


def cp_gathered_kv_bytes(m: ModelSpec, batch: int, seq: int, tp: int, dtype: str) -> float:
    """The whole sequence's K and V one tp rank gathers per attention layer under context
    parallelism: 2·b·s·(g/t)·d·e (g kv heads, at least one per rank, d head dim)."""
    return 2.0 * batch * seq * max(1.0, m.kv_heads / tp) * m.head_dim * DTYPE_BYTES[dtype]


def cp_kept_kv_bytes(m: ModelSpec, batch: int, seq: int, tp: int, dtype: str, stack: Stack) -> float:
    """What a block keeps for the attention's backward beyond its own sequence chunk under cp:
    the other ranks' (1 − 1/cp) of the gathered K and V. The kernel keeps them at the heads it
    reads: meshplan's SDPA runtime repeats kv heads to the query heads before the kernel (so a
    row's K, V at the full s are num_heads wide), FlashAttention reads the g kv heads (GQA)."""
    if stack.cp <= 1:
        return 0.0
    heads = m.num_heads if stack.attention in ("sdpa", "eager") else m.kv_heads
    whole = 2.0 * batch * seq * max(1.0, heads / tp) * m.head_dim * DTYPE_BYTES[dtype]
    return whole * (1 - 1 / stack.cp)


def linear_weight_params(m: ModelSpec, tp: int) -> float:
    """Weights of one block's linear layers on one tp rank: the q/k/v projection h·(h + 2kv), the
    output projection h·h and the MLP's (mats − 1)·h·f up and f·h down projections (mats = 2 for
    GPT's GELU MLP, 3 for SwiGLU), over t."""
    kv = m.kv_heads * m.head_dim
    mats = 2 if m.family == "gpt" else 3
    return (m.hidden * (m.hidden + 2 * kv) + m.hidden * m.hidden + mats * m.hidden * m.ffn) / tp


def fp8_linear_kept_delta_bytes(
    m: ModelSpec, batch: int, seq: int, tp: int, dtype: str, sequence_parallel: bool
) -> float:
    """What fp8 linears change in a block's kept bytes, per tp rank (negative: a saving).

    Both stacks save each linear's input already cast to fp8 and the fp8 weight for the backward
    GEMMs (torchao.float8's tensorwise `manual_float8_matmul_with_args_in_float8` saves
    (input_fp8, weight_fp8_t); Transformer Engine's `_Linear` saves the fp8 input (transposed for
    wgrad) and `weight_t_fp8`). So the four inputs the projections alone keep drop from e to 1 byte
    an element: the two norms' outputs (b·s·h each; not needed by the norms' own backward, which
    reads their input; s/t of them under sequence parallelism, Megatron/TE save the local shard and
    gather again in backward), the output projection's input (b·s·h/t) and the down projection's
    input (b·s·f/t: GELU's output, or SwiGLU's product; the activations' backward reads their
    inputs). Each forward also keeps its fp8 weight copy, 1 byte per linear parameter
    (linear_weight_params), with every micro-batch in flight (torchao); a runtime that caches the
    fp8 weight across micro-batches (Transformer Engine, `Stack.fp8_weight_cached`) holds it once
    per block instead (block_kept_bytes, fp8_cached_weight_bytes).
    """
    e = DTYPE_BYTES[dtype]
    b, s, h = batch, seq, m.hidden
    norms = 2 * b * s * h / (tp if sequence_parallel and tp > 1 else 1)
    inputs = norms + b * s * h / tp + b * s * m.ffn / tp
    return -(e - 1) * inputs + linear_weight_params(m, tp)


def recomputed_kept_bytes(m: ModelSpec, batch: int, seq: int, tp: int, dtype: str, stack: Stack) -> float:
    """A fully recomputed block keeps its input, b×s×h (Korthikanti §5: 2sbh at e = 2); with
    sequence parallelism each rank keeps its s/t slice."""
    out = flops.block_input_bytes(m, batch, seq, dtype)
    return out / tp if stack.sequence_parallel and tp > 1 else out


def block_mixed_kept_bytes(plain_bytes: float, recomputed_bytes: float, recompute_every: int) -> float:
    """Per block, averaged over a stage where one block in k is fully recomputed and the others keep
    everything: (1 − 1/k)·plain + (1/k)·recomputed (k = 1: every block recomputed)."""
    f = 1.0 / recompute_every
    return (1 - f) * plain_bytes + f * recomputed_bytes


def block_workspace_bytes(
    m: ModelSpec, batch: int, seq: int, tp: int, dtype: str, stack: Stack, runtime_bytes: float, recompute: bool
) -> float:
    """Transient bytes at a block's backward peak, from the runtime row's `runtime_bytes`.

    Eager attention's softmax backward holds the gradient of the probabilities and of the scores at
    once: 2·e·a·s²·b/t when that exceeds the runtime's two largest transients. Recompute (full, or
    selective's attention core) rebuilds the dropped set inside backward: under eager attention the
    s×s terms are part of what is rebuilt.
    """
    out = runtime_bytes
    if stack.attention == "eager":
        out = max(out, 2 * attention_scores_bytes(m, batch, seq, tp, dtype))
        if recompute or stack.selective:
            out += eager_attention_kept_bytes(m, batch, seq, tp, dtype, stack.dropout)
    return out


def head_bytes(
    m: ModelSpec, batch: int, seq: int, tp: int, dtype: str, stack: Stack, kept: float, workspace: float
) -> tuple[float, float]:
    """(kept, workspace) of the head under `stack`'s loss kernel, from the runtime row's bytes
    (torch's cross entropy, flops.loss_logit_bytes): the difference per logit element times the
    b·s·V/t logits of one rank (vocab-parallel head)."""
    if stack.loss == RUNTIME.loss:
        return kept, workspace
    elems = batch * seq * m.padded_vocab / tp
    k0, w0 = flops.loss_logit_bytes(RUNTIME.loss, dtype)
    k1, w1 = flops.loss_logit_bytes(stack.loss, dtype)
    return max(0.0, kept + (k1 - k0) * elems), max(0.0, workspace + (w1 - w0) * elems)


def kept_output_bytes(m: ModelSpec, batch: int, seq: int, tp: int, dtype: str, stack: Stack) -> float:
    """The last stage's output as a pipeline engine keeps it in its buffer: the loss's input, b·s·V/t
    logits on one rank at the bytes the loss kernel keeps per element (flops.loss_logit_bytes: Megatron's
    vocab-parallel loss turns the fp32 copy into the softmax in place, 4 bytes)."""
    return flops.loss_logit_bytes(stack.loss, dtype)[0] * batch * seq * m.padded_vocab / tp


def zero3_working_bytes(largest_params: float, neighbour_params: float, dtype: str) -> float:
    """FSDP / ZeRO-3 keeps whole only the layers in flight, never the stage. The peak is in backward:
    the layer being differentiated, its unsharded gradient before the reduce-scatter, and the
    neighbour prefetched one layer ahead (FSDP's BACKWARD_PRE; the forward holds only the layer and
    the next): 2·P_x + P_neighbour e-byte values, largest for the stage's largest module x (a block,
    or a tied / untied embedding table) next to a block: 3·P_block for a stage of blocks alone."""
    return (2 * largest_params + neighbour_params) * DTYPE_BYTES[dtype]


def grad_pack_buffer_bytes(m: ModelSpec, tp: int, dtype: str, bucket_bytes: float) -> float:
    """The flat buffer a runtime that packs small gradients into buckets (worker.parallel.GradSumSync,
    `Runtime.grad_buckets_packed`) keeps for the whole run: one buffer, reused by every bucket and
    step, as large as the largest bucket. A bucket closes once it holds `bucket_bytes` or more, so it
    is at most bucket_bytes plus the last small gradient added (< bucket_bytes + the largest small
    tensor), and never more than all the model's small gradients on this tp rank (flops.layer_params
    of the layers whose largest tensor is below bucket_bytes, as planner.cost.stage._packed_bytes
    counts them). A stage's own share is not known per block count (coefficients stay a·n + b), so
    the whole model's small gradients bound it: exact for a one-stage plan, at most one bucket over
    for a pipeline stage."""
    e = DTYPE_BYTES[dtype]
    counts = {"block": m.num_layers, "embedding": 1, "head": 1}
    small = [(n * flops.layer_params(k, m, tp) * e, flops.largest_tensor_params(k, m, tp) * e)
             for k, n in counts.items() if n and flops.largest_tensor_params(k, m, tp) * e < bucket_bytes]  # fmt: skip
    if not small:
        return 0.0
    return min(sum(b for b, _ in small), bucket_bytes + max(t for _, t in small))
