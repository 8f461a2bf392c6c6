"""The decoder in torch, built from a ModelSpec: embedding, transformer blocks, final norm + head.

Written for the parallel runtime (torchtitan style): blocks live in a ModuleDict keyed by their
global index, so a pipeline stage keeps only the blocks it owns (and the embedding/head if first/
last) and parameter names stay identical across layouts — which is what lets a DCP checkpoint
saved under one plan load under another. Attention and MLP use separate projections (wq, wk, wv,
wo; w1, w2 and w3 for SwiGLU) so DTensor's ColwiseParallel/RowwiseParallel apply directly.

`Block(spec, tp=t)` builds the *local* shapes one of t tensor-parallel ranks holds (heads/t,
kv heads/t, ffn/t), so the profiler can time a TP shard without a process group.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from planner.specs.model import ModelSpec, RopeScaling


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _norm(spec: ModelSpec) -> nn.Module:
    eps = spec.norm_eps or 1e-5
    return nn.LayerNorm(spec.hidden, eps=eps) if spec.family == "gpt" else RMSNorm(spec.hidden, eps)


def rope_tables(
    head_dim: int, seq: int, theta: float = 500_000.0, scaling: RopeScaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    if scaling is not None and scaling.kind == "linear":
        inv = inv / scaling.factor
    elif scaling is not None:  # llama3 (Llama 3.1): long wavelengths / factor, short kept, blended between
        wavelen = 2 * math.pi / inv
        low_wl = scaling.original_max_position / scaling.low_freq_factor
        high_wl = scaling.original_max_position / scaling.high_freq_factor
        smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        blended = (1 - smooth) * inv / scaling.factor + smooth * inv
        inv = torch.where(wavelen > low_wl, inv / scaling.factor, torch.where(wavelen < high_wl, inv, blended))
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on (b, heads, s, d): rotate pairs (x[2i], x[2i+1]) by position angles."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[: x.shape[-2]].to(x.dtype), sin[: x.shape[-2]].to(x.dtype)
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, tp: int = 1) -> None:
        super().__init__()
        if spec.num_heads % tp:
            raise ValueError(f"tp={tp} must divide num_heads={spec.num_heads}")
        self.rope = spec.family == "llama"
        self.head_dim = spec.head_dim
        self.heads = spec.num_heads // tp
        self.kv_heads = max(1, spec.kv_heads // tp)
        bias, qkv_bias = spec.family == "gpt", spec.has_qkv_bias
        h, d = spec.hidden, spec.head_dim
        self.wq = nn.Linear(h, self.heads * d, bias=qkv_bias)
        self.wk = nn.Linear(h, self.kv_heads * d, bias=qkv_bias)
        self.wv = nn.Linear(h, self.kv_heads * d, bias=qkv_bias)
        self.wo = nn.Linear(self.heads * d, h, bias=bias)
        self.kv_gather = None  # context parallelism (worker/cp.py): this rank's positions, k / v all-gather
        if self.rope:
            cos, sin = rope_tables(d, spec.seq_len, spec.rope_theta or 500_000.0, spec.rope_scaling)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        # -1 heads: under DTensor tensor parallelism each rank sees heads/tp locally.
        q = self.wq(x).view(b, s, -1, d).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, d).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, d).transpose(1, 2)
        cp, mask = self.kv_gather, None
        if self.rope:
            cos, sin = (self.cos, self.sin) if cp is None else (self.cos[cp.positions], self.sin[cp.positions])
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cp is not None:  # keys and values of the whole sequence, masked by global positions
            k, v, mask = cp(k), cp(v), cp.mask
        if k.shape[1] != q.shape[1]:  # grouped-query attention: share each kv head across its group
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = self.core(q, k, v, mask)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The attention core (what selective recompute re-runs: worker.parallel.apply_recompute);
        causal, or `mask` (True = attend) where the keys are not the queries' own sequence."""
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, tp: int = 1) -> None:
        super().__init__()
        if spec.ffn % tp:
            raise ValueError(f"tp={tp} must divide ffn={spec.ffn}")
        f, bias = spec.ffn // tp, spec.family == "gpt"
        self.swiglu = spec.family == "llama"
        self.w1 = nn.Linear(spec.hidden, f, bias=bias)
        self.w2 = nn.Linear(f, spec.hidden, bias=bias)
        self.w3 = nn.Linear(spec.hidden, f, bias=False) if self.swiglu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, tp: int = 1) -> None:
        super().__init__()
        self.norm1 = _norm(spec)
        self.attn = Attention(spec, tp)
        self.norm2 = _norm(spec)
        self.mlp = MLP(spec, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Embedding(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.tok = nn.Embedding(spec.padded_vocab, spec.hidden)
        self.pos = nn.Embedding(spec.seq_len, spec.hidden) if spec.family == "gpt" else None
        self.positions: torch.Tensor | None = None  # context parallelism: this rank's token positions

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            pos = self.positions if self.positions is not None else torch.arange(tokens.shape[1], device=tokens.device)
            x = x + self.pos(pos)
        return x


class Head(nn.Module):
    """Final norm + LM head; returns logits (the loss is applied by the caller / pipeline schedule)."""

    def __init__(self, spec: ModelSpec, tp: int = 1) -> None:
        super().__init__()
        self.norm = _norm(spec)
        self.out = nn.Linear(spec.hidden, spec.padded_vocab // tp if tp > 1 else spec.padded_vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class Decoder(nn.Module):
    """The whole model, or one pipeline stage of it (`layers=(start, end)`, `first`, `last`)."""

    def __init__(
        self,
        spec: ModelSpec,
        layers: tuple[int, int] | None = None,
        first: bool = True,
        last: bool = True,
    ) -> None:
        super().__init__()
        start, end = layers or (0, spec.num_layers)
        self.spec = spec
        self.embed = Embedding(spec) if first else None
        self.blocks = nn.ModuleDict({str(i): Block(spec) for i in range(start, end)})
        # The head is never tied to the embedding here: under pipelining they live on different
        # ranks and tying would need a cross-stage gradient sync. The runtime's memory is therefore
        # that of an untied model (a few % more parameters for GPT presets).
        self.head = Head(spec) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


def init_weights(model: nn.Module, seed: int, num_layers: int) -> None:
    """Deterministic init that does not depend on the layout: each parameter is seeded by its name.

    So a stage built under any plan holds exactly the weights the full model holds for the same
    names — the property that makes single-process vs pipeline-parallel comparisons exact.
    """
    for name, p in model.named_parameters():
        g = torch.Generator().manual_seed(seed * 1_000_003 + _stable_hash(name))
        with torch.no_grad():
            if p.dim() == 1:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                std = 0.02 / math.sqrt(2 * num_layers) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)


def _stable_hash(s: str) -> int:
    h = 2166136261
    for ch in s.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
