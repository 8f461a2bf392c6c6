"""`meshplan data prepare`: tokenize text, JSONL or Parquet once into a token dataset for `train --data DIR`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cli.app import app, load_settings, prefect_env

data_app = typer.Typer(help="Prepare training data: tokenized, packed, split, with a manifest.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@data_app.command("prepare")
def prepare(
    inputs: Annotated[
        list[Path], typer.Option("--input", help="a .txt (a document per line), .jsonl or .parquet file; repeatable")
    ],
    tokenizer: Annotated[Path, typer.Option("--tokenizer", help="a Hugging Face tokenizer.json, or its folder")],
    out: Annotated[Path, typer.Option("--out", help="the dataset folder to write (must not exist or be empty)")],
    val_fraction: Annotated[
        float, typer.Option("--val-fraction", min=0.0, max=0.5, help="documents held out for validation")
    ] = 0.01,
    text_field: Annotated[str, typer.Option("--text-field", help="JSONL key / Parquet column of the text")] = "text",
    workers: Annotated[int, typer.Option("--workers", min=1, max=64, help="tokenizer processes")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
) -> None:
    """Tokenize the inputs with the tokenizer into OUT: train.bin/val.bin (+ document offsets), tokenizer, manifest."""
    from planner.errors import MeshplanError

    for path in inputs:
        if path.resolve() == out.resolve() or out.resolve() in path.resolve().parents:
            raise MeshplanError("--out", str(out), f"holds the input {path}; write the dataset elsewhere")
    prefect_env(load_settings())
    from flows.data import data_prepare_flow

    o = data_prepare_flow([str(p) for p in inputs], str(tokenizer), str(out), val_fraction, text_field, workers)
    if as_json:
        print(json.dumps(o.model_dump(mode="json")))
        return
    print(
        f"prepared {out}: {o.num_train_documents:,} documents / {o.num_train_tokens:,} tokens for training, "
        f"{o.num_val_documents:,} / {o.num_val_tokens:,} for validation ({o.dtype}, vocabulary {o.vocab_size:,}); "
        f"{o.tokens_per_s:,.0f} tokens/s"
    )
    print(f"train with: meshplan train --plan PLAN --data {out}")


@app.command("export-weights")
def export_weights(
    run: Annotated[str, typer.Option("--run", help="the training run's id")],
    out: Annotated[Path, typer.Option("--out", help="the folder to write (must not exist)")],
    step: Annotated[
        int | None, typer.Option("--step", min=1, help="the checkpoint's step (default: the latest)")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="hf: Hugging Face safetensors + config.json")] = "hf",
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="tokenizer.json to copy (default: the run's --data folder's)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
) -> None:
    """Consolidate a run's checkpoint (any layout) into Hugging Face weights that transformers loads."""
    from cli.app import db_path
    from planner.errors import MeshplanError

    if fmt != "hf":
        raise MeshplanError("--format", fmt, "only hf (Hugging Face safetensors) is written")
    if tokenizer is not None and not tokenizer.is_file():
        raise MeshplanError("--tokenizer", str(tokenizer), "no such file; pass a tokenizer.json")
    cfg = load_settings()
    prefect_env(cfg)
    from flows.weights import export_weights_flow

    o = export_weights_flow(str(db_path(cfg)), run, str(out), step, str(tokenizer) if tokenizer else None)
    if as_json:
        print(json.dumps(o.model_dump(mode="json")))
        return
    print(
        f"exported run {o.run_id} step {o.step} as {o.architecture} ({o.num_params:,} parameters) to {o.out_dir}"
        + (" with its tokenizer" if o.tokenizer else "")
    )
    print(f"load with: transformers.AutoModelForCausalLM.from_pretrained({o.out_dir!r})")
