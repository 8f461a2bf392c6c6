"""A Hugging Face model folder checked before any rank starts (`train --init hf:DIR`).

Reads only each `*.safetensors` file's JSON header (8 bytes of length, then the header: names,
dtypes, shapes; the safetensors format), so a missing tensor or a wrong shape is one line naming the
tensor, found in milliseconds and without torch; the ranks then read their own tensors
(worker/hf_weights.py).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from planner.errors import MeshplanError
from planner.specs.hf import from_hf_config, hf_shapes, model_type
from planner.specs.model import ModelSpec

MAX_HEADER_BYTES = 100 << 20  # the format's own limit


def read_config(folder: Path, flag: str) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise MeshplanError(flag, str(folder), "no config.json there; pass a folder save_pretrained wrote")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MeshplanError(flag, str(path), f"not a JSON config ({exc.__class__.__name__})") from None
    if not isinstance(config, dict):
        raise MeshplanError(flag, str(path), "must be a JSON object")
    return config


def tensor_shapes(folder: Path, flag: str = "--init") -> dict[str, tuple[int, ...]]:
    """Every tensor's shape across the folder's safetensors files."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise MeshplanError(flag, str(folder), "no *.safetensors there; save the model with safe_serialization")
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with f.open("rb") as h:
            head = h.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < n <= MAX_HEADER_BYTES:
                raise MeshplanError(flag, str(f), "not a safetensors file (bad header length)")
            try:
                header = json.loads(h.read(n))
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise MeshplanError(flag, str(f), "not a safetensors file (bad header)") from None
        shapes.update({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return shapes


def check_weights(init: str, spec: ModelSpec) -> str:
    """`hf:DIR` checked against the model the ranks build; the folder as an absolute path."""
    flag = "--init"
    if not init.startswith("hf:"):
        raise MeshplanError(flag, init, "use hf:DIR (a Hugging Face folder with config.json and safetensors)")
    folder = Path(init[3:]).expanduser().resolve()
    config = read_config(folder, flag)
    kind = model_type(config)
    theirs = from_hf_config(config, spec.name, seq_len=spec.seq_len)
    if theirs.fingerprint() != spec.fingerprint():
        raise MeshplanError(
            flag, init, f"its config.json is not the model being trained ({spec.name}); plan with --model hf:{folder}"
        )
    have = tensor_shapes(folder, flag)
    for name, shape in hf_shapes(spec, kind).items():
        if name not in have:
            raise MeshplanError(flag, name, f"missing from {folder}; the checkpoint does not match its config")
        got = have[name]
        ok = got == shape or (name.endswith("wpe.weight") and got[1:] == shape[1:] and got[0] >= shape[0])
        if not ok:
            raise MeshplanError(flag, name, f"shape {got} in {folder}, the model needs {shape}")
    return f"hf:{folder}"
