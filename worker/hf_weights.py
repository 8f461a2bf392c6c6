"""Hugging Face safetensors in and out of meshplan's Decoder (`train --init hf:DIR`, `export-weights`).

In: each rank opens the folder's `*.safetensors` lazily (`safe_open`; a sharded checkpoint through
its `model.safetensors.index.json`) and reads only the tensors of the blocks, embedding and head its
stage holds, before tensor parallelism splits them. The name map and the RoPE row order are
planner/specs/hf.py's one table. A missing tensor or a shape that differs is one MeshplanError
naming the tensor.

Out: a whole-model state dict (meshplan names, consolidated from a DCP checkpoint) written as
Hugging Face tensors, q/k rows back in the half-split order, with config.json beside them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from planner.errors import MeshplanError
from planner.specs.hf import TensorRule, hf_tensor_map, model_type, rope_row_order
from planner.specs.model import ModelSpec

INDEX = "model.safetensors.index.json"


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise MeshplanError("--init", str(folder), "no config.json there; pass a folder save_pretrained wrote")
    return json.loads(path.read_text(encoding="utf-8"))


def _files_of(folder: Path) -> dict[str, Path]:
    """Hugging Face tensor name -> the safetensors file holding it."""
    index = folder / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        return {name: folder / file for name, file in weight_map.items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise MeshplanError("--init", str(folder), "no *.safetensors there; save the model with safe_serialization")
    from safetensors import safe_open

    out: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            out.update(dict.fromkeys(h.keys(), f))
    return out


def _convert(raw: torch.Tensor, rule: TensorRule, spec: ModelSpec) -> torch.Tensor:
    t = raw.t() if rule.transpose else raw
    if rule.part is not None:  # GPT-2's fused c_attn: q, k, v of hidden rows each (MHA)
        t = t.chunk(3, dim=0)[rule.part]
    if rule.rope_heads:
        t = t[rope_row_order(rule.rope_heads, spec.head_dim)]
    if rule.hf.endswith("wpe.weight"):  # GPT-2's position table: the positions this model trains
        t = t[: spec.seq_len]
    return t


def load_into(part: nn.Module, spec: ModelSpec, folder: Path) -> int:
    """Copy the folder's tensors into `part` (a whole model or one stage); returns tensors read."""
    from safetensors import safe_open

    kind = model_type(read_config(folder))
    rules = hf_tensor_map(spec, kind)
    where = _files_of(folder)
    handles: dict[Path, object] = {}
    read = 0
    try:
        for name, param in part.named_parameters():
            rule = rules.get(name)
            if rule is None:
                raise MeshplanError("--init", name, f"meshplan has no {kind} tensor for this parameter")
            file = where.get(rule.hf)
            if file is None:
                raise MeshplanError(
                    "--init", rule.hf, f"missing from {folder}; the checkpoint does not match its config"
                )
            if file not in handles:
                handles[file] = safe_open(str(file), framework="pt")
            value = _convert(handles[file].get_tensor(rule.hf), rule, spec)  # type: ignore[attr-defined]
            rows = param.shape[0]
            if name in ("embed.tok.weight", "head.out.weight") and value.shape[0] < rows:  # padded vocabulary
                value = torch.cat([value, value.new_zeros(rows - value.shape[0], *value.shape[1:])])
            if tuple(value.shape) != tuple(param.shape):
                raise MeshplanError(
                    "--init", rule.hf, f"shape {tuple(value.shape)} where the model needs {tuple(param.shape)}"
                )
            with torch.no_grad():
                param.copy_(value.to(param.dtype))
            read += 1
    finally:
        handles.clear()
    return read


def to_hf_tensors(state: dict[str, torch.Tensor], spec: ModelSpec, kind: str) -> dict[str, torch.Tensor]:
    """meshplan's whole-model state dict as the architecture's Hugging Face tensors (inverse of load_into)."""
    rules = hf_tensor_map(spec.model_copy(update={"tie_embeddings": False}), kind)
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, list[torch.Tensor | None]] = {}
    for name, rule in rules.items():
        if name not in state:
            raise MeshplanError("export-weights", name, "missing from the checkpoint")
        t = state[name].detach().float().cpu()
        if name in ("embed.tok.weight", "head.out.weight"):
            t = t[: spec.vocab_size]
        if rule.rope_heads:
            inverse = torch.empty(t.shape[0], dtype=torch.long)
            inverse[torch.tensor(rope_row_order(rule.rope_heads, spec.head_dim))] = torch.arange(t.shape[0])
            t = t[inverse]
        if rule.part is not None:
            fused.setdefault(rule.hf, [None, None, None])[rule.part] = t
            continue
        out[rule.hf] = (t.t() if rule.transpose else t).contiguous()
    for hf_name, parts in fused.items():
        whole = torch.cat([p for p in parts if p is not None], dim=0)
        out[hf_name] = (whole.t() if whole.dim() == 2 else whole).contiguous()
    return out
