"""A Hugging Face `config.json` as meshplan's ModelSpec (`--model hf:DIR`).

Llama (GQA, RoPE θ and scaling, tied or untied embeddings), Mistral (a Llama without sliding-window
attention at the trained length), Qwen2 (a Llama with q/k/v biases) and GPT-2 map onto the two
families meshplan's runtime builds (worker/model.py). What a config says that the runtime cannot
build (another activation, a head dim that is not hidden/heads, a window shorter than the sequence)
is one MeshplanError naming the key, never a silently different model.

The names of each architecture's tensors in its safetensors files, and how they become meshplan's
parameters, live here too (`hf_tensor_map`): the weights loader (worker/hf_weights.py) and the
exporter read the one table. Pure: takes the parsed dict; the CLI edge reads the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from planner.errors import MeshplanError
from planner.specs.model import ModelSpec, RopeScaling
from planner.specs.runspec import ArgvModel

SUPPORTED = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}
HF_PREFIX = "hf:"


def _unsupported(what: str) -> MeshplanError:
    names = ", ".join(f"{v} ({k})" for k, v in SUPPORTED.items())
    return MeshplanError("config.json: model_type", what, f"supported architectures: {names}")


def model_type(config: dict[str, Any]) -> str:
    kind = config.get("model_type")
    if kind not in SUPPORTED:
        arch = config.get("architectures") or [kind]
        raise _unsupported(str(arch[0] if isinstance(arch, list) and arch else kind))
    return str(kind)


def _get(config: dict[str, Any], key: str, kind: type, default: Any = ...) -> Any:
    if key not in config or config[key] is None:
        if default is ...:
            raise MeshplanError(
                f"config.json: {key}", None, "missing; a Hugging Face config of this architecture has it"
            )
        return default
    value = config[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise MeshplanError(f"config.json: {key}", value, f"must be {kind.__name__}")
    return value


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    """transformers ≥ 5 writes `rope_parameters` ({rope_theta, rope_type, factor, ...}); earlier
    versions `rope_theta` and `rope_scaling`. One view of both."""
    params = config.get("rope_parameters")
    if params is None:
        return {"rope_theta": config.get("rope_theta"), **(config.get("rope_scaling") or {})}
    if not isinstance(params, dict):
        raise MeshplanError("config.json: rope_parameters", params, "must be an object")
    return params


def _rope_scaling(config: dict[str, Any]) -> RopeScaling | None:
    raw = {k: v for k, v in _rope(config).items() if k != "rope_theta"}
    if not raw:
        return None
    kind = raw.get("rope_type", raw.get("type"))
    if kind in (None, "default"):
        return None
    if kind not in ("linear", "llama3"):
        raise MeshplanError("config.json: rope_scaling.rope_type", kind, "meshplan's runtime builds linear and llama3")
    try:
        return RopeScaling(
            kind=kind,
            factor=float(raw["factor"]),
            low_freq_factor=float(raw.get("low_freq_factor", 1.0)),
            high_freq_factor=float(raw.get("high_freq_factor", 4.0)),
            original_max_position=int(raw.get("original_max_position_embeddings", 8192)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MeshplanError("config.json: rope_scaling", raw, f"not a {kind} scaling ({exc})") from None


def from_hf_config(config: dict[str, Any], name: str, seq_len: int | None = None) -> ModelSpec:
    """The ModelSpec of a Hugging Face causal-LM config. `seq_len`: the training sequence length
    (default: the config's max_position_embeddings / n_positions)."""
    if not isinstance(config, dict):
        raise MeshplanError("config.json", type(config).__name__, "must be a JSON object")
    kind = model_type(config)
    if kind == "gpt2":
        act = config.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise MeshplanError(
                "config.json: activation_function", act, "meshplan's GPT runtime builds gelu_new (tanh)"
            )
        for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if config.get(key):
                raise MeshplanError(
                    f"config.json: {key}", True, "meshplan's GPT runtime builds GPT-2's plain attention"
                )
        hidden = _get(config, "n_embd", int)
        positions = _get(config, "n_positions", int)
        dims = dict(
            family="gpt",
            num_layers=_get(config, "n_layer", int),
            hidden=hidden,
            num_heads=_get(config, "n_head", int),
            ffn_hidden=_get(config, "n_inner", int, 4 * hidden),
            vocab_size=_get(config, "vocab_size", int),
            seq_len=seq_len or positions,
            norm_eps=_get(config, "layer_norm_epsilon", float, 1e-5),
            tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        )
        if (seq_len or positions) > positions:
            raise MeshplanError("--seq-len", seq_len, f"GPT-2 has {positions} learned positions (n_positions)")
    else:
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise MeshplanError("config.json: hidden_act", act, "meshplan's Llama runtime builds SwiGLU (silu)")
        if config.get("mlp_bias"):
            raise MeshplanError("config.json: mlp_bias", True, "meshplan's Llama runtime has no MLP biases")
        hidden, heads = _get(config, "hidden_size", int), _get(config, "num_attention_heads", int)
        head_dim = config.get("head_dim")
        if head_dim is not None and heads and head_dim * heads != hidden:
            raise MeshplanError(
                "config.json: head_dim", head_dim, f"must be hidden_size/num_attention_heads = {hidden // heads}"
            )
        seq = seq_len or _get(config, "max_position_embeddings", int)
        window = config.get("sliding_window") if config.get("use_sliding_window", kind == "mistral") else None
        if window is not None and window < seq:
            raise MeshplanError(
                "config.json: sliding_window",
                window,
                f"shorter than the sequence ({seq}): pass --seq-len {window} or less",
            )
        qkv_bias = kind == "qwen2" or bool(config.get("attention_bias", False))
        dims = dict(
            family="llama",
            num_layers=_get(config, "num_hidden_layers", int),
            hidden=hidden,
            num_heads=heads,
            num_kv_heads=_get(config, "num_key_value_heads", int, heads),
            ffn_hidden=_get(config, "intermediate_size", int),
            vocab_size=_get(config, "vocab_size", int),
            seq_len=seq,
            rope_theta=_get(_rope(config), "rope_theta", float, 10000.0),
            rope_scaling=_rope_scaling(config),
            norm_eps=_get(config, "rms_norm_eps", float, 1e-6),
            qkv_bias=qkv_bias or None,
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    dims["vocab_multiple"] = 1  # the checkpoint's own rows: padded logits would change the loss
    from planner.validation import parse

    return parse(ModelSpec, {"name": name, **{k: v for k, v in dims.items() if v is not None}}, origin="config.json")


def to_hf_config(spec: ModelSpec, kind: str) -> dict[str, Any]:
    """The config.json `export-weights` writes for a model meshplan trained (untied head: meshplan's
    runtime trains it untied, so the head is written as its own tensor)."""
    if kind == "gpt2" or spec.family == "gpt":
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_embd": spec.hidden,
            "n_layer": spec.num_layers,
            "n_head": spec.num_heads,
            "n_inner": spec.ffn,
            "n_positions": spec.seq_len,
            "vocab_size": spec.vocab_size,
            "layer_norm_epsilon": spec.norm_eps or 1e-5,
            "activation_function": "gelu_new",
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "tie_word_embeddings": False,
        }
    arch = SUPPORTED.get(kind, "LlamaForCausalLM")
    out: dict[str, Any] = {
        "architectures": [arch],
        "model_type": kind if kind in SUPPORTED else "llama",
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.kv_heads,
        "intermediate_size": spec.ffn,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.seq_len,
        "rms_norm_eps": spec.norm_eps or 1e-5,
        "rope_theta": spec.rope_theta or 500_000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": bool(spec.has_qkv_bias) if kind == "llama" else False,
    }
    if spec.rope_scaling is not None:
        r = spec.rope_scaling
        out["rope_scaling"] = {"rope_type": r.kind, "factor": r.factor}
        if r.kind == "llama3":
            out["rope_scaling"].update(
                low_freq_factor=r.low_freq_factor,
                high_freq_factor=r.high_freq_factor,
                original_max_position_embeddings=r.original_max_position,
            )
    return out


@dataclass(frozen=True)
class TensorRule:
    """How one meshplan parameter comes from a Hugging Face tensor.

    `transpose`: GPT-2's Conv1D stores (in, out); `part`: a third of GPT-2's fused c_attn (q, k or v);
    `rope_heads`: rows of q or k in Hugging Face's half-split RoPE order, permuted to meshplan's
    interleaved pairs (rows of each head: [0, d/2, 1, d/2+1, ...]), the number of heads given."""

    hf: str
    transpose: bool = False
    part: Literal[0, 1, 2] | None = None
    rope_heads: int = 0


def hf_tensor_map(spec: ModelSpec, kind: str) -> dict[str, TensorRule]:
    """meshplan parameter name -> its rule, for every parameter of the whole model."""
    rules: dict[str, TensorRule] = {}
    if kind == "gpt2":
        rules["embed.tok.weight"] = TensorRule("transformer.wte.weight")
        rules["embed.pos.weight"] = TensorRule("transformer.wpe.weight")
        for i in range(spec.num_layers):
            p, b = f"transformer.h.{i}.", f"blocks.{i}."
            rules[b + "norm1.weight"] = TensorRule(p + "ln_1.weight")
            rules[b + "norm1.bias"] = TensorRule(p + "ln_1.bias")
            rules[b + "norm2.weight"] = TensorRule(p + "ln_2.weight")
            rules[b + "norm2.bias"] = TensorRule(p + "ln_2.bias")
            for j, w in enumerate(("wq", "wk", "wv")):
                rules[b + f"attn.{w}.weight"] = TensorRule(p + "attn.c_attn.weight", transpose=True, part=j)  # type: ignore[arg-type]
                rules[b + f"attn.{w}.bias"] = TensorRule(p + "attn.c_attn.bias", part=j)  # type: ignore[arg-type]
            rules[b + "attn.wo.weight"] = TensorRule(p + "attn.c_proj.weight", transpose=True)
            rules[b + "attn.wo.bias"] = TensorRule(p + "attn.c_proj.bias")
            rules[b + "mlp.w1.weight"] = TensorRule(p + "mlp.c_fc.weight", transpose=True)
            rules[b + "mlp.w1.bias"] = TensorRule(p + "mlp.c_fc.bias")
            rules[b + "mlp.w2.weight"] = TensorRule(p + "mlp.c_proj.weight", transpose=True)
            rules[b + "mlp.w2.bias"] = TensorRule(p + "mlp.c_proj.bias")
        rules["head.norm.weight"] = TensorRule("transformer.ln_f.weight")
        rules["head.norm.bias"] = TensorRule("transformer.ln_f.bias")
        rules["head.out.weight"] = TensorRule("lm_head.weight" if not spec.tied else "transformer.wte.weight")
        return rules
    rules["embed.tok.weight"] = TensorRule("model.embed_tokens.weight")
    for i in range(spec.num_layers):
        p, b = f"model.layers.{i}.", f"blocks.{i}."
        rules[b + "norm1.weight"] = TensorRule(p + "input_layernorm.weight")
        rules[b + "norm2.weight"] = TensorRule(p + "post_attention_layernorm.weight")
        rules[b + "attn.wq.weight"] = TensorRule(p + "self_attn.q_proj.weight", rope_heads=spec.num_heads)
        rules[b + "attn.wk.weight"] = TensorRule(p + "self_attn.k_proj.weight", rope_heads=spec.kv_heads)
        rules[b + "attn.wv.weight"] = TensorRule(p + "self_attn.v_proj.weight")
        rules[b + "attn.wo.weight"] = TensorRule(p + "self_attn.o_proj.weight")
        if spec.has_qkv_bias:
            rules[b + "attn.wq.bias"] = TensorRule(p + "self_attn.q_proj.bias", rope_heads=spec.num_heads)
            rules[b + "attn.wk.bias"] = TensorRule(p + "self_attn.k_proj.bias", rope_heads=spec.kv_heads)
            rules[b + "attn.wv.bias"] = TensorRule(p + "self_attn.v_proj.bias")
        rules[b + "mlp.w1.weight"] = TensorRule(p + "mlp.gate_proj.weight")
        rules[b + "mlp.w3.weight"] = TensorRule(p + "mlp.up_proj.weight")
        rules[b + "mlp.w2.weight"] = TensorRule(p + "mlp.down_proj.weight")
    rules["head.norm.weight"] = TensorRule("model.norm.weight")
    rules["head.out.weight"] = TensorRule("lm_head.weight" if not spec.tied else "model.embed_tokens.weight")
    return rules


def rope_row_order(heads: int, head_dim: int) -> list[int]:
    """Hugging Face rows in meshplan's order: meshplan row h*d + 2i is HF row h*d + i, row h*d + 2i + 1
    is HF row h*d + d/2 + i (half-split rotation -> interleaved pairs; attention scores are unchanged
    because q and k are permuted alike)."""
    half = head_dim // 2
    order = []
    for h in range(heads):
        for i in range(half):
            order += [h * head_dim + i, h * head_dim + half + i]
    return order


def parse_model_arg(model: str) -> str | None:
    """The folder of `hf:DIR`, or None for any other --model."""
    return model[len(HF_PREFIX) :] if model.startswith(HF_PREFIX) else None


def hf_shapes(spec: ModelSpec, kind: str) -> dict[str, tuple[int, ...]]:
    """The shape each Hugging Face tensor must have for `spec` (GPT-2's position table: at least seq_len
    rows, checked by the caller as a lower bound)."""
    h, v, f, d = spec.hidden, spec.vocab_size, spec.ffn, spec.head_dim
    q, kv = spec.num_heads * d, spec.kv_heads * d
    out: dict[str, tuple[int, ...]] = {}
    if kind == "gpt2":
        out["transformer.wte.weight"] = (v, h)
        out["transformer.wpe.weight"] = (spec.seq_len, h)
        for i in range(spec.num_layers):
            p = f"transformer.h.{i}."
            for n in ("ln_1", "ln_2"):
                out[p + n + ".weight"] = out[p + n + ".bias"] = (h,)
            out[p + "attn.c_attn.weight"], out[p + "attn.c_attn.bias"] = (h, 3 * h), (3 * h,)
            out[p + "attn.c_proj.weight"], out[p + "attn.c_proj.bias"] = (h, h), (h,)
            out[p + "mlp.c_fc.weight"], out[p + "mlp.c_fc.bias"] = (h, f), (f,)
            out[p + "mlp.c_proj.weight"], out[p + "mlp.c_proj.bias"] = (f, h), (h,)
        out["transformer.ln_f.weight"] = out["transformer.ln_f.bias"] = (h,)
        if not spec.tied:
            out["lm_head.weight"] = (v, h)
        return out
    out["model.embed_tokens.weight"] = (v, h)
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "self_attn.q_proj.weight"], out[p + "self_attn.o_proj.weight"] = (q, h), (h, q)
        out[p + "self_attn.k_proj.weight"] = out[p + "self_attn.v_proj.weight"] = (kv, h)
        if spec.has_qkv_bias:
            out[p + "self_attn.q_proj.bias"] = (q,)
            out[p + "self_attn.k_proj.bias"] = out[p + "self_attn.v_proj.bias"] = (kv,)
        out[p + "mlp.gate_proj.weight"] = out[p + "mlp.up_proj.weight"] = (f, h)
        out[p + "mlp.down_proj.weight"] = (h, f)
    out["model.norm.weight"] = (h,)
    if not spec.tied:
        out["lm_head.weight"] = (v, h)
    return out


def hf_kind(spec: ModelSpec) -> str:
    """The architecture a trained model is exported as: GPT-2 for the gpt family, Qwen2 for a Llama with
    q/k/v biases, else Llama (a Mistral trained within its window is a Llama)."""
    if spec.family == "gpt":
        return "gpt2"
    return "qwen2" if spec.has_qkv_bias else "llama"


class ExportSpec(ArgvModel):
    """What `python -m worker.export_hf` is told (`meshplan export-weights`): one run's checkpoint to
    Hugging Face safetensors, config.json and tokenizer in `out` (staged, renamed whole)."""

    checkpoint: str = Field(description="a published DCP checkpoint folder of the run")
    model_json: str = Field(description="the run's ModelSpec JSON (its model.json)")
    out: str = Field(description="the folder to write; must not exist")
    tokenizer: str = Field(default="", description="tokenizer.json to copy beside the weights; empty = none")
