"""`meshplan replan` (decide for a stored run now) and `meshplan replan-every` (re-plan it on an interval).

`replan-every` (named apart from the pipeline schedule and the cluster scheduler; `meshplan schedule`
is its deprecated old name) serves `replan_flow` as a deployment with an interval schedule; schedules need a real
Prefect server (ephemeral mode cannot schedule), so it requires the one `meshplan ui` starts for
this state folder and fails with one line pointing there otherwise. It runs until Ctrl-C.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.app import app, check_id, db_path, load_settings, prefect_env

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_every(text: str) -> float:
    """'90s', '5m', '2h', '1d' or plain seconds → seconds."""
    from planner.errors import MeshplanError

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise MeshplanError("--every", text, "write a positive interval like 30s, 5m, 2h or 1d")
    return float(m.group(1)) * _UNITS_S[m.group(2) or "s"]


def _replan_kwargs(cfg) -> dict:
    r = cfg.replan
    return {
        "threshold": r.threshold,
        "persistence_steps": r.persistence_steps,
        "window": r.window,
        "margin_s": r.margin_s,
        "min_gain": r.min_gain,
        "cooldown_steps": r.cooldown_steps,
    }


def check_run(cfg: Any, run_id: str | None, cluster: Path | None) -> None:
    """The run and the cluster file exist: checked before a Prefect flow (and maybe a server) starts,
    so a typo costs a line, not a minute."""
    from flows.queries import run_exists
    from planner.errors import MeshplanError

    if cluster is not None and not cluster.is_file():
        raise MeshplanError("--cluster", str(cluster), "no such file; pass a cluster TOML")
    if run_id is not None and not run_exists(db_path(cfg), run_id):
        raise MeshplanError("--run-id", run_id, "no such run in the database; list runs with `meshplan db`")


@app.command()
def replan(
    run_id: Annotated[str, typer.Option("--run-id", help="a training run in the database")],
    cluster: Annotated[Path | None, typer.Option("--cluster", help="cluster TOML (default: its CPU ranks)")] = None,
    act: Annotated[bool, typer.Option("--act/--dry-run", help="rebalance a live run through its control file")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
) -> None:
    """Detect stragglers in a run's telemetry, price keep / rebalance / relayout and record the decision."""
    cfg = load_settings()
    check_run(cfg, run_id, cluster)
    prefect_env(cfg)
    from flows.replan import replan_flow

    out = replan_flow(
        db_path=str(db_path(cfg)),
        run_id=run_id,
        cluster_path=str(cluster) if cluster else None,
        act=act,
        **_replan_kwargs(cfg),
    )
    if as_json:
        typer.echo(out.model_dump_json(indent=2))
        return
    if not out.detected:
        typer.echo(f"run {run_id}: no straggler detected — keep the plan")
        return
    for d in out.detections:
        typer.echo(
            f"rank {d['rank']}: {d['kind']} {d['factor']:.2f}× slower since step {d['since_step']}"
            f" (detected at step {d['detected_at_step']})"
        )
    typer.echo(f"decision: {out.action}{' (acted)' if out.acted else ''} — {out.reason}")


@app.command("replan-every")
def replan_every(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Option("--run-id", help="the training run to re-plan")],
    every: Annotated[str, typer.Option("--every", help="interval: 30s, 5m, 2h, 1d")] = "5m",
    name: Annotated[str | None, typer.Option("--name", help="deployment name (default replan-<run id>)")] = None,
    cluster: Annotated[Path | None, typer.Option("--cluster", help="cluster TOML (default: its CPU ranks)")] = None,
) -> None:
    """Re-plan a run on an interval: serves replan_flow as a deployment on the `meshplan ui` server (Ctrl-C stops)."""
    import os
    from datetime import timedelta

    from planner.errors import MeshplanError

    if ctx.info_name == "schedule":
        typer.echo("note: `meshplan schedule` is now `meshplan replan-every` (the old name will go)", err=True)
    seconds = parse_every(every)
    check_id("--run-id", run_id)  # the run may start later, but its id must be one a run can have
    cfg = load_settings()
    check_run(cfg, None, cluster)  # the run itself may start after its schedule is served
    prefect_env(cfg)
    if "PREFECT_API_URL" not in os.environ:
        raise MeshplanError(
            "replan-every", run_id, "interval runs need a Prefect server: run `meshplan ui` first (same --state-dir)"
        )
    from flows.replan import replan_flow

    params = {
        "db_path": str(db_path(cfg).resolve()),
        "run_id": run_id,
        "cluster_path": str(cluster.resolve()) if cluster else None,
        **_replan_kwargs(cfg),
    }
    deployment = name or f"replan-{run_id}"
    typer.echo(f"serving replan/{deployment} every {every} against {os.environ['PREFECT_API_URL']} — Ctrl-C stops")
    replan_flow.serve(name=deployment, interval=timedelta(seconds=seconds), parameters=params)


app.command("schedule", hidden=True, help="Deprecated name of `replan-every`.")(replan_every)
