"""`meshplan train`: launch torchrun training from a plan file or a stored plan, then report the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flows.app import app, db_path, load_settings, prefect_env


@app.command()
def train(
    plan: Annotated[Path | None, typer.Option("--plan", help="plan JSON file")] = None,
    plan_id: Annotated[str | None, typer.Option("--plan-id", help="id of a plan stored in the database")] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="total optimizer steps (config train.steps)")] = None,
    nproc_per_node: Annotated[int | None, typer.Option("--nproc-per-node", help="ranks on this node")] = None,
    nnodes: Annotated[int, typer.Option("--nnodes", help="number of nodes")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", help="this node's index (0..nnodes-1)")] = 0,
    rdzv_endpoint: Annotated[str | None, typer.Option("--rdzv-endpoint", help="HOST:PORT of node 0")] = None,
    data: Annotated[str | None, typer.Option("--data", help="synthetic | text (config train.data)")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="reuse a run id to resume its checkpoint")] = None,
    resume: Annotated[
        str, typer.Option("--resume", help="auto | none | a checkpoint or run folder (may be another plan's)")
    ] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
) -> None:
    """Train under a plan with torchrun; telemetry goes to the database, predicted vs measured is reported."""
    extra = []
    for field, value in (("steps", steps), ("nproc_per_node", nproc_per_node), ("data", data),
                         ("rdzv_endpoint", rdzv_endpoint)):  # fmt: skip
        if value is not None:
            extra.append(f"train.{field}={json.dumps(value)}")
    cfg = load_settings(extra)
    prefect_env(cfg)

    from planner.errors import MeshplanError

    if (plan is None) == (plan_id is None):
        raise MeshplanError("--plan/--plan-id", str(plan or plan_id), "give exactly one: --plan FILE or --plan-id ID")
    if plan is not None and not plan.is_file():
        raise MeshplanError("--plan", str(plan), "no such file; pass a plan JSON file")

    from flows.train import train_flow

    t, path = cfg.train, db_path(cfg)
    out = train_flow(
        db_path=str(path), plan_path=str(plan) if plan else None, plan_id=plan_id, steps=t.steps,
        nproc_per_node=t.nproc_per_node, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=t.rdzv_endpoint,
        data=t.data, lr=t.lr, optimizer=t.optimizer, seed=t.seed, checkpoint_every=t.checkpoint_every,
        resume=resume, max_restarts=t.max_restarts, run_id=run_id, runs_dir=str(Path(cfg.state.dir) / "runs"),
        timeout_s=t.timeout_s, collective_timeout_s=t.collective_timeout_s,
    )  # fmt: skip
    if as_json:
        typer.echo(json.dumps(out, indent=2, default=str))
        return
    measured, predicted = out["measured_step_time_s"], out["predicted_step_time_s"]
    typer.echo(f"run {out['run_id']} {out['status']}: {len(out['losses'])} steps in {out['run_dir']}")
    if measured is not None:
        typer.echo(
            f"step time measured {measured * 1e3:.1f} ms"
            + (f", predicted {predicted * 1e3:.1f} ms" if predicted else "")
        )
    losses = [v for v in out["losses"] if v is not None]
    if losses:
        typer.echo(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
