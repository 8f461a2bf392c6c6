"""`meshplan export-weights` as a flow: a run's checkpoint (any layout) to Hugging Face safetensors,
config.json and tokenizer (worker/export_hf.py), which `transformers` loads."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow

import rundir
from flows.outcomes import ExportOutcome
from planner.errors import MeshplanError
from planner.specs.dataset import TOKENIZER, is_prepared
from planner.specs.hf import ExportSpec, hf_kind
from planner.specs.model import ModelSpec
from storage.runs import load_run
from tasks.weights import export_weights


def checkpoint_of(run_dir: Path, step: int | None) -> Path:
    if step is None:
        step = rundir.latest_checkpoint_step(run_dir)
        if not step:
            raise MeshplanError("--run", str(run_dir), "has no checkpoint yet; train it (a run saves one at its end)")
    ckpt = rundir.checkpoint_dir(run_dir, step)
    if not ckpt.is_dir():
        have = sorted(
            int(m[1]) for p in rundir.checkpoints_dir(run_dir).glob("step_*") if (m := rundir.STEP_DIR.match(p.name))
        )
        raise MeshplanError("--step", step, f"no checkpoint at that step; the run has {have or 'none'}")
    return ckpt


@flow(name="export-weights", log_prints=True)
def export_weights_flow(
    db_path: str, run_id: str, out: str, step: int | None = None, tokenizer: str | None = None
) -> ExportOutcome:
    run = load_run(db_path, run_id)
    if run is None:
        raise MeshplanError("--run", run_id, 'no such run; `meshplan db "select run_id from runs"` lists them')
    run_dir = Path(run["run_dir"])
    model_json = rundir.model_path(run_dir)
    if not model_json.is_file():
        raise MeshplanError("--run", run_id, f"its folder has no {rundir.MODEL} (trained before export existed)")
    if tokenizer is None and rundir.spec_path(run_dir).is_file():  # the prepared dataset's own tokenizer
        data = json.loads(rundir.spec_path(run_dir).read_text()).get("data", "")
        if is_prepared(data) and (Path(data) / TOKENIZER).is_file():
            tokenizer = str(Path(data) / TOKENIZER)
    ckpt = checkpoint_of(run_dir, step)
    spec = ExportSpec(
        checkpoint=str(ckpt), model_json=str(model_json), out=str(Path(out).resolve()), tokenizer=tokenizer or ""
    )
    if Path(spec.out).exists():
        raise MeshplanError("--out", out, "exists; pick a new folder")
    export_weights(spec)
    model = ModelSpec.model_validate_json(model_json.read_text())
    return ExportOutcome(
        run_id=run_id,
        out_dir=spec.out,
        step=int(rundir.STEP_DIR.match(ckpt.name)[1]),  # type: ignore[index]
        architecture=hf_kind(model),
        tokenizer=tokenizer,
        num_params=model.num_params(),
    )
