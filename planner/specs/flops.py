"""FLOP and byte counts per layer kind, derived from the model's matmuls.

Conventions (Megatron-LM, Narayanan et al. SC'21, appendix; Korthikanti et al. 2022):
- a matmul of (m×k)·(k×n) costs 2·m·k·n FLOPs; element-wise ops are ignored;
- attention scores and the attention-weighted sum are counted over the full s×s matrix (no causal
  halving), so a GPT block with ffn = 4h costs 24·b·s·h² + 4·b·s²·h forward FLOPs;
- backward costs twice the forward; full recompute adds one more forward.
Layer kinds: "embedding", "block", "head" (final norm + LM head + cross-entropy).
"""

from __future__ import annotations

from typing import Literal

from planner.specs.model import ModelSpec

LayerKind = Literal["embedding", "block", "head"]
LAYER_KINDS: tuple[LayerKind, ...] = ("embedding", "block", "head")

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def block_forward_flops(m: ModelSpec, batch: int, seq: int, tp: int = 1) -> float:
    """Forward FLOPs of one transformer block on one of `tp` tensor-parallel ranks.

    QKV projection 2·b·s·h·(h + 2·kv), output projection 2·b·s·h², scores QKᵀ and A·V 2·2·b·s²·h,
    MLP 2·b·s·h·f per matrix (2 matrices for GELU, 3 for SwiGLU). Every term splits evenly over tp.
    With kv = h and f = 4h: 6bsh² + 2bsh² + 4bs²h + 16bsh² = 24bsh² + 4bs²h (Megatron).
    """
    b, s, h = batch, seq, m.hidden
    kv = m.kv_heads * m.head_dim
    mats = 2 if m.family == "gpt" else 3
    flops = 2 * b * s * h * (h + 2 * kv) + 2 * b * s * h * h + 4 * b * s * s * h + mats * 2 * b * s * h * m.ffn
    return flops / tp


def head_forward_flops(m: ModelSpec, batch: int, seq: int, tp: int = 1) -> float:
    """LM head logits 2·b·s·h·V (V padded), split over tp (vocab-parallel)."""
    return 2 * batch * seq * m.hidden * m.padded_vocab / tp


def embedding_forward_flops(m: ModelSpec, batch: int, seq: int, tp: int = 1) -> float:
    """An embedding is a gather: no matmul FLOPs."""
    return 0.0


def forward_flops(kind: LayerKind, m: ModelSpec, batch: int, seq: int, tp: int = 1) -> float:
    return {"embedding": embedding_forward_flops, "block": block_forward_flops, "head": head_forward_flops}[kind](
        m, batch, seq, tp
    )


def training_flops(kind: LayerKind, m: ModelSpec, batch: int, seq: int, tp: int = 1, recompute: bool = False) -> float:
    """Forward + backward (2× forward) + a recomputed forward when activations are recomputed."""
    return forward_flops(kind, m, batch, seq, tp) * (4 if recompute else 3)


def model_flops_per_step(m: ModelSpec, global_batch: int, seq: int) -> float:
    """Model FLOPs of one optimizer step (no recompute): the numerator of MFU (PaLM, Chowdhery et al.)."""
    per_sample = m.num_layers * training_flops("block", m, 1, seq) + training_flops("head", m, 1, seq)
    return per_sample * global_batch


def layer_params(kind: LayerKind, m: ModelSpec, tp: int = 1) -> int:
    """Parameters one tp rank holds for a layer (norms replicated; counted once per rank)."""
    if kind == "block":
        return -(-m.block_params() // tp)
    if kind == "embedding":
        return -(-m.embedding_params() // tp)
    return -(-m.head_params() // tp)


def layer_tensors(kind: LayerKind, m: ModelSpec) -> int:
    """Parameter tensors of a layer in worker/model.py: a GPT block's two LayerNorms and four
    attention and two MLP Linears, each with weight and bias (16); a Llama block's two RMSNorm
    weights and q, k, v, o, w1, w2, w3 (9). GPT embeds tokens and positions, Llama tokens; the head
    is a norm (GPT with bias) and the output projection."""
    gpt = m.family == "gpt"
    if kind == "block":
        return 16 if gpt else 9
    if kind == "embedding":
        return 2 if gpt else 1
    return 3 if gpt else 2


def tp_sharded_tensors(m: ModelSpec) -> int:
    """Parameter tensors of a block that tensor parallelism shards (worker.parallel.apply_tp): the
    column-parallel linears' weights and biases (q, k, v and the MLP's up projections: GPT's w1 with
    its bias, Llama's w1 and w3) and the row-parallel linears' weights (o and the down projection;
    their biases stay replicated). GPT: 3·2 + 2 + 2 = 10; Llama without q/k/v biases: 3 + 2 + 2 = 7."""
    qkv = 3 * (2 if m.has_qkv_bias else 1)
    up = 2  # GPT: w1's weight and bias; Llama: w1 and w3 (no biases)
    return qkv + up + 2


def largest_tensor_params(kind: LayerKind, m: ModelSpec, tp: int = 1) -> int:
    """Parameters of a layer's largest weight on one tp rank (worker/model.py's shapes: a block's
    h×max(h, ffn) projection, the padded-vocabulary embedding or head)."""
    if kind == "block":
        return -(-m.hidden * max(m.hidden, m.ffn) // tp)
    return -(-m.padded_vocab * m.hidden // tp)


def block_activation_bytes(m: ModelSpec, batch: int, seq: int, tp: int = 1, dtype: str = "bf16") -> float:
    """Bytes one block keeps for backward, per tp rank, without recompute (analytic estimate).

    Korthikanti et al. 2022 (eq. 2, tensor parallel without sequence parallelism), with flash
    attention (no s×s score matrix kept) and no dropout masks, counted on meshplan's runtime block
    (worker/model.py; checked against a saved-tensor count in tests/worker/test_profile_layers.py):

    GPT: LayerNorm inputs and outputs (4·sbh, replicated), q, k, v (sb(h+2kv)/t), the attention
    output and the output-projection input (2·sbh/t), the MLP's fc output and GELU output (2·sbf/t).
    Llama: RMSNorm (un-fused: input, x·rstd and output, 6·sbh replicated), the rotated q and the
    k, v that attention reads — repeated to all heads under GQA (3·sbh/t), else sb(h+2kv)/t — the
    attention output and output-projection input (2·sbh/t), and SwiGLU's w1 output, SiLU output,
    w3 output and their product (4·sbf/t). Softmax statistics and RoPE tables are negligible.
    """
    e = DTYPE_BYTES[dtype]
    b, s, h = batch, seq, m.hidden
    kv = m.kv_heads * m.head_dim
    if m.family == "gpt":
        split = s * b * (h + 2 * kv) + 2 * s * b * h + 2 * s * b * m.ffn
    else:
        qkv = 3 * h if kv < h else h + 2 * kv
        split = s * b * qkv + 2 * s * b * h + 4 * s * b * m.ffn
    return block_replicated_activation_bytes(m, batch, seq, dtype) + e * split / tp


def block_replicated_activation_bytes(m: ModelSpec, batch: int, seq: int, dtype: str = "bf16") -> float:
    """The part of block_activation_bytes every tp rank keeps whole (the norms' inputs and outputs:
    4·sbh elements for GPT's LayerNorms, 6·sbh for un-fused RMSNorm); sequence parallelism shards it."""
    return DTYPE_BYTES[dtype] * (4 if m.family == "gpt" else 6) * seq * batch * m.hidden


def largest_activation_bytes(m: ModelSpec, batch: int, seq: int, tp: int = 1, dtype: str = "bf16") -> float:
    """The largest tensor a block's forward produces on one tp rank: the MLP's b×s×ffn/tp hidden
    (ffn ≥ h + 2·kv for every family this models)."""
    return DTYPE_BYTES[dtype] * batch * seq * max(m.ffn, m.hidden + 2 * m.kv_heads * m.head_dim) / tp


def attention_core_forward_flops(m: ModelSpec, batch: int, seq: int, tp: int = 1) -> float:
    """The s×s part of block_forward_flops: QKᵀ and A·V, 2·2·b·s²·h over tp (what selective
    recompute runs again)."""
    return 4 * batch * seq * seq * m.hidden / tp


def loss_logit_bytes(loss: str, dtype: str) -> tuple[float, float]:
    """(bytes kept until backward, extra bytes at the backward's peak) per logit element (b·s·V/tp),
    by the stack's loss kernel; e = the working dtype's bytes.

    - "torch": F.cross_entropy on an fp32 copy (meshplan's runtime `logits.float()`, torch autocast,
      which runs cross_entropy in fp32). The e-byte logits stay referenced by the caller, log_softmax
      keeps its fp32 output (the fp32 input copy is freed: log_softmax's backward needs only its
      output); backward holds the fp32 gradient of that output and of its input at once: kept e + 4,
      workspace 2·4 (peak e + 12).
    - "vocab-parallel": Megatron-LM's vocab_parallel_cross_entropy(output.float()) (SC'21 era code,
      megatron/mpu/cross_entropy.py): exp, normalisation and the gradient are computed in place on
      the fp32 copy, which alone is kept (the e-byte logits are not referenced after the cast); the
      cast's backward writes the e-byte gradient: kept 4, workspace e (peak 4 + e).
    - "fused": a kernel that reads the working-dtype logits and keeps only per-row statistics
      (flash-attn's CrossEntropyLoss, llm-foundry's `fused_crossentropy` default): kept e, its
      backward writes an e-byte gradient (inplace_backward=False): workspace e (peak 2e).
    """
    e = float(DTYPE_BYTES[dtype])
    if loss == "torch":
        return e + 4.0, 8.0
    if loss == "vocab-parallel":
        return 4.0, e
    if loss == "fused":
        return e, e
    raise ValueError(f"unknown loss kernel {loss!r}")


def block_input_bytes(m: ModelSpec, batch: int, seq: int, dtype: str = "bf16") -> float:
    """Bytes of the b×s×h hidden state passed between blocks/stages (the only thing full recompute keeps)."""
    return DTYPE_BYTES[dtype] * batch * seq * m.hidden
