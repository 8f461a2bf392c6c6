"""`python -m worker.export_hf --checkpoint DIR --model-json F --out DIR [--tokenizer F]`.

A run's DCP checkpoint (any layout it was saved in: DCP reshards on load) consolidated in one
process into Hugging Face safetensors, config.json (planner/specs/hf.py) and the tokenizer, written
into a staging folder and renamed onto `out` only when whole. `transformers.AutoModelForCausalLM
.from_pretrained(out)` loads it. Parsed with the one codec (ExportSpec.from_argv); ends via exit_now.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from planner.errors import MeshplanError
from planner.specs.hf import ExportSpec, hf_kind, to_hf_config
from planner.specs.model import ModelSpec


def export(spec: ExportSpec) -> Path:
    from safetensors.torch import save_file

    from worker.checkpoint import load_full_model_state
    from worker.hf_weights import to_hf_tensors

    model = ModelSpec.model_validate_json(Path(spec.model_json).read_text())
    out = Path(spec.out)
    if out.exists():
        raise MeshplanError("--out", str(out), "exists; pick a new folder")
    kind = hf_kind(model)
    tensors = to_hf_tensors(load_full_model_state(Path(spec.checkpoint), model), model, kind)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file(tensors, str(stage / "model.safetensors"), metadata={"format": "pt"})
        config = {**to_hf_config(model, kind), "torch_dtype": "float32"}
        (stage / "config.json").write_text(json.dumps(config, indent=2))
        if spec.tokenizer:
            shutil.copyfile(spec.tokenizer, stage / "tokenizer.json")
        stage.rename(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    from worker.teardown import exit_now

    try:
        out = export(ExportSpec.from_argv(sys.argv[1:] if argv is None else argv))
    except MeshplanError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        exit_now(1)
    print(json.dumps({"out": str(out)}), flush=True)
    exit_now(0)


if __name__ == "__main__":
    main()
