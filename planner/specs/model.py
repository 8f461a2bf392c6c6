"""Model specs: GPT- and Llama-style decoders by preset name or by their dimensions.

A model is a stack of `num_layers` identical transformer blocks, an embedding in front and a final
norm + LM head + loss behind. GPT: LayerNorm, GELU MLP (ffn = 4h), multi-head attention, learned
positions, tied embedding. Llama: RMSNorm, SwiGLU MLP, grouped-query attention, RoPE, untied head.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.errors import MeshplanError, UnknownNameError, closest
from planner.limits import MAX_PARAMS

Family = Literal["gpt", "llama"]


class RopeScaling(BaseModel):
    """RoPE frequency scaling as Hugging Face configs write it: `linear` (positions / factor) or `llama3`
    (Llama 3.1: long wavelengths / factor, short ones kept, a smooth blend between)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["linear", "llama3"]
    factor: float = Field(gt=0, le=1e6)
    low_freq_factor: float = Field(default=1.0, gt=0, le=1e6)
    high_freq_factor: float = Field(default=4.0, gt=0, le=1e6)
    original_max_position: int = Field(default=8192, gt=0, le=10_000_000)


class ModelSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    family: Family = "gpt"
    num_layers: int = Field(gt=0, le=10_000)
    hidden: int = Field(gt=0, le=1_000_000)
    num_heads: int = Field(gt=0)
    num_kv_heads: int | None = Field(default=None, gt=0, description="None = num_heads (multi-head attention)")
    ffn_hidden: int | None = Field(default=None, gt=0, description="None = 4*hidden (GPT) or Llama's 8h/3 rounded")
    vocab_size: int = Field(gt=0, le=10_000_000)
    seq_len: int = Field(gt=0, le=10_000_000)
    tie_embeddings: bool = Field(
        default=False,
        description="meshplan's runtime keeps the head untied (stages may differ); True only for counting",
    )
    learned_positions: bool | None = Field(
        default=None,
        description="a learned position table (seq × h); None = the family's default (GPT yes, Llama RoPE no). "
        "False prices ALiBi/RoPE GPT-style models such as MPT; meshplan's runtime does not build it yet",
    )
    # What a Hugging Face config adds (planner/specs/hf.py); None = meshplan's own default, and a field at
    # None is left out of the fingerprint, so the presets' and stored profiles' ids do not move.
    rope_theta: float | None = Field(default=None, gt=0, le=1e12, description="RoPE base; None = 500000")
    rope_scaling: RopeScaling | None = Field(default=None, description="RoPE frequency scaling (linear or llama3)")
    norm_eps: float | None = Field(default=None, gt=0, le=1.0, description="norm epsilon; None = 1e-5")
    qkv_bias: bool | None = Field(
        default=None,
        description="biases on q/k/v (Qwen2); None = the family's default (GPT: every linear, Llama: none)",
    )
    vocab_multiple: int | None = Field(
        default=None, gt=0, le=4096, description="the embedding's rows are padded to a multiple of this; None = 128"
    )

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.hidden % self.num_heads:
            raise MeshplanError(
                "model.hidden",
                self.hidden,
                f"must be divisible by model.num_heads={self.num_heads} (head dim = hidden/heads)",
            )
        if self.kv_heads > self.num_heads or self.num_heads % self.kv_heads:
            raise MeshplanError(
                "model.num_kv_heads",
                self.num_kv_heads,
                f"must divide model.num_heads={self.num_heads} (grouped-query attention)",
            )
        if self.num_params() > MAX_PARAMS:  # the one bound submit, plan and the scheduler share
            raise MeshplanError(
                "model.num_layers",
                self.num_layers,
                f"with hidden={self.hidden} the model has {self.num_params():.3g} parameters, more than "
                f"{MAX_PARAMS:.0e} (5x the largest published); use fewer layers or a smaller hidden",
            )
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def ffn(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        if self.family == "gpt":
            return 4 * self.hidden
        f = int(8 * self.hidden / 3)
        return 256 * ((f + 255) // 256)

    @property
    def tied(self) -> bool:
        return self.tie_embeddings

    @property
    def padded_vocab(self) -> int:
        """Vocabulary padded to a multiple of 128, as Megatron and nanoGPT do for matmul efficiency
        (`vocab_multiple`: a Hugging Face model keeps its own rows, 1)."""
        m = self.vocab_multiple or 128
        return m * ((self.vocab_size + m - 1) // m)

    @property
    def has_qkv_bias(self) -> bool:
        return self.family == "gpt" if self.qkv_bias is None else self.qkv_bias

    def block_params(self) -> int:
        """Parameters of one transformer block (weights and biases/norm scales)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * (h + 2 * kv) + h * h
        if self.family == "gpt":
            mlp = 2 * h * self.ffn
            extra = (h + 2 * kv) + h + self.ffn + h + 4 * h  # qkv/proj/fc/out biases + 2 LayerNorms (w, b)
        else:
            mlp = 3 * h * self.ffn
            extra = 2 * h + (h + 2 * kv if self.has_qkv_bias else 0)  # 2 RMSNorm scales (+ q/k/v biases)
        return attn + mlp + extra

    @property
    def has_learned_positions(self) -> bool:
        return self.family == "gpt" if self.learned_positions is None else self.learned_positions

    def embedding_params(self) -> int:
        pos = self.seq_len * self.hidden if self.has_learned_positions else 0
        return self.padded_vocab * self.hidden + pos

    def head_params(self) -> int:
        """Final norm + LM head (0 head weights when tied to the embedding)."""
        norm = 2 * self.hidden if self.family == "gpt" else self.hidden
        return norm + (0 if self.tied else self.padded_vocab * self.hidden)

    def num_params(self) -> int:
        return self.num_layers * self.block_params() + self.embedding_params() + self.head_params()

    def fingerprint(self) -> str:
        """Stable id of the dimensions (not the name): profiles keyed by it are reused across names."""
        dims = self.model_dump(exclude={"name", "learned_positions"})
        for key in ("rope_theta", "rope_scaling", "norm_eps", "qkv_bias", "vocab_multiple"):
            if dims[key] is None:
                del dims[key]  # ids of models without them unchanged
        if self.has_learned_positions != (self.family == "gpt"):
            dims["learned_positions"] = self.has_learned_positions  # ids of family-default models unchanged
        dims.update(ffn_hidden=self.ffn, num_kv_heads=self.kv_heads, tie_embeddings=self.tied)
        return hashlib.sha256(json.dumps(dims, sort_keys=True).encode()).hexdigest()[:16]


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int = 1024, vocab: int = 50257) -> ModelSpec:
    return ModelSpec(
        name=name, family="gpt", num_layers=layers, hidden=hidden, num_heads=heads, vocab_size=vocab, seq_len=seq
    )


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int) -> ModelSpec:
    return ModelSpec(
        name=name,
        family="llama",
        num_layers=layers,
        hidden=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden=ffn,
        vocab_size=128256,
        seq_len=8192,
    )


# GPT-2: Radford et al. 2019; GPT-3: Brown et al. 2020, Table 2.1 (seq 2048); Llama 3: Meta 2024, Table 3.
PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec(name="tiny", family="gpt", num_layers=4, hidden=64, num_heads=4, vocab_size=256, seq_len=64),
        ModelSpec(
            name="tiny-llama",
            family="llama",
            num_layers=4,
            hidden=64,
            num_heads=4,
            num_kv_heads=2,
            ffn_hidden=176,
            vocab_size=256,
            seq_len=64,
        ),
        _gpt("gpt2-small", 12, 768, 12),
        _gpt("gpt2-medium", 24, 1024, 16),
        _gpt("gpt2-large", 36, 1280, 20),
        _gpt("gpt2-xl", 48, 1600, 25),
        _gpt("gpt3-1.3b", 24, 2048, 16, seq=2048),
        _gpt("gpt3-2.7b", 32, 2560, 32, seq=2048),
        _gpt("gpt3-6.7b", 32, 4096, 32, seq=2048),
        _gpt("gpt3-13b", 40, 5120, 40, seq=2048),
        _gpt("gpt3-175b", 96, 12288, 96, seq=2048),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248),
    ]
}


def get_model(name: str) -> ModelSpec:
    """A preset by name; unknown names fail with the closest presets suggested."""
    if name in PRESETS:
        return PRESETS[name]
    hint = ", ".join(closest(name, list(PRESETS)))
    raise UnknownNameError(
        "model", name, f"no such preset{'; did you mean ' + hint + '?' if hint else ''} (presets: {', '.join(PRESETS)})"
    )
