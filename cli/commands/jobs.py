"""`meshplan submit`, `meshplan jobs`, `meshplan cancel`: the multi-job queue in the state folder's DuckDB."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.app import SMALL_WRITE_BYTES, app, check_id, db_path, load_settings, need_space, state
from cli.commands.model_options import model_option_flags
from cli.commands.run_options import run_option_flags, train_overrides
from cli.commands.tables import Col, FormatOption, emit, print_table
from planner.limits import MAX_GLOBAL_BATCH, MAX_PRIORITY, MAX_SECONDS, MAX_SEQ, MAX_STEPS

if TYPE_CHECKING:
    from planner.specs.config import RunConfig
    from planner.specs.model import ModelSpec


@app.command()
@run_option_flags(exclude=("steps",))  # a job's steps are its --iterations
@model_option_flags()
def submit(
    global_batch: Annotated[int, typer.Option("--global-batch", min=1, max=MAX_GLOBAL_BATCH, help="samples per step")],
    iterations: Annotated[int, typer.Option("--iterations", min=1, max=MAX_STEPS, help="steps to run")],
    model_spec: ModelSpec | None = None,
    job_id: Annotated[str | None, typer.Option("--job-id", help="default: a fresh id")] = None,
    seq: Annotated[
        int | None, typer.Option("--seq", min=1, max=MAX_SEQ, help="sequence length (default: the model's)")
    ] = None,
    priority: Annotated[
        int, typer.Option("--priority", min=-MAX_PRIORITY, max=MAX_PRIORITY, help="higher runs first")
    ] = 0,
    deadline_s: Annotated[
        float | None, typer.Option("--deadline-s", min=0.001, max=MAX_SECONDS, help="seconds from submission")
    ] = None,
    gpu_kinds: Annotated[str, typer.Option("--gpu-kinds", help="allowed kinds, comma separated (default any)")] = "",
    run_options: dict[str, Any] | None = None,
) -> None:
    """Queue a training job for the cluster scheduler (training options default to the config's train section).

    The model is named as for `meshplan plan`: a preset, `custom` with its dimensions, or a model
    TOML; a custom model's dimensions are stored with the job, priced by the scheduler and built by
    the job's ranks."""
    from flows.queries import submit_job
    from planner.errors import MeshplanError
    from planner.scheduler.types import parse_kinds
    from planner.specs.runspec import RunOptions

    # an unknown preset or bad dimensions fail here, naming the option, not in a later round
    spec = model_spec
    if spec is None:
        raise MeshplanError("--model", None, "name a preset, `custom` with --layers --hidden --heads, or a model TOML")
    if seq is not None and spec.has_learned_positions and seq > spec.seq_len:
        raise MeshplanError("--seq", seq, f"the model's learned positions end at {spec.seq_len}; pass --seq <= that")
    check_id("--job-id", job_id)
    kinds = parse_kinds(gpu_kinds)
    # the job's options as `train` takes them: the config's [train], then --set, then these flags
    # (a bad value is named by the flag typed); stored whole and typed, its steps the --iterations
    extra, flags = train_overrides(run_options or {})
    cfg = load_settings(extra, flags)
    need_space(cfg, need=SMALL_WRITE_BYTES)  # a job stored whole or refused, never half-written on a full disk
    train = RunOptions(**{**cfg.train.options(), "steps": iterations})
    jid = submit_job(
        state(cfg).db,
        spec,
        global_batch,
        iterations,
        job_id=job_id,
        seq=seq,
        priority=priority,
        deadline_s=deadline_s,
        gpu_kinds=kinds,
        train=train,
    )
    typer.echo(jid)


@app.command()
def jobs(
    state: Annotated[str | None, typer.Option("--state", help="only jobs in this state")] = None,
    events: Annotated[bool, typer.Option("--events", help="print every state transition")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON (= --format json)")] = False,
    fmt: FormatOption = "table",
) -> None:
    """List the queue's jobs (and their transitions)."""
    from flows.queries import job_transitions
    from flows.queries import jobs as queued

    db = db_path(load_settings())
    frame = job_transitions(db) if events else queued(db, state)
    if emit("json" if as_json else fmt, [_job_doc(r) for r in frame.to_dicts()]):
        return
    if frame.height == 0:
        typer.echo("no jobs")
        return
    cols = (
        ["job_id", "seq", "from_state", "to_state", "allocation", "reason"]
        if events
        else ["job_id", "state", "model", "global_batch", "iterations", "priority", "allocation"]
    )
    rows = [["-" if v is None else str(v) for v in row] for row in frame.select(cols).iter_rows()]
    spec = [Col(c, keep=len(cols) - i, wrap=c == "reason", right=c in _NUMERIC) for i, c in enumerate(cols)]
    print_table("job transitions" if events else "jobs", spec, rows)


_NUMERIC = ("seq", "global_batch", "iterations", "priority")


def _job_doc(row: dict[str, Any]) -> dict[str, Any]:
    """A jobs / job_events row for --json: the allocation as numbers too (`4xcpu/1` is 4 cpu devices on 1 node)."""
    from planner.scheduler.types import parse_alloc

    doc = {k: v for k, v in row.items() if k not in ("train_json", "model_json", "options")}
    if "options" in row:  # the job's RunOptions (an old row's: the flags it was given)
        doc["train"] = json.loads(row["options"] or row.get("train_json") or "{}")
    if "model_json" in row:  # a custom model's dimensions; null: the preset `model` names
        doc["model_spec"] = json.loads(row["model_json"]) if row["model_json"] else None
    for key in ("allocation", "base_allocation"):
        if key not in row:
            continue
        a = parse_alloc(row[key]) if row[key] else None
        prefix = key.removesuffix("allocation")
        doc[f"{prefix}num_devices"] = a.count if a else None
        doc[f"{prefix}device_kind"] = a.kind if a else None
        doc[f"{prefix}num_nodes"] = a.num_nodes if a else None
    return doc


@app.command()
def cancel(job_id: Annotated[str, typer.Argument(help="the job to cancel")]) -> None:
    """Cancel a queued or running job (recorded as a transition)."""
    from flows.queries import cancel_job

    cancel_job(db_path(load_settings()), job_id)
    typer.echo(f"cancelled {job_id}")


@app.command("schedule-cluster")
def schedule_cluster(
    cluster: Annotated[Path, typer.Option("--cluster", help="the cluster TOML the jobs share")],
    every: Annotated[str, typer.Option("--every", help="interval: 30s, 5m, 2h, 1d")] = "5m",
    policy: Annotated[
        str,
        typer.Option("--policy", help="srtf (default), jct, throughput, deadline, fairness, fcfs, gavel, crius, sia"),
    ] = "srtf",
    speed: Annotated[
        Path | None, typer.Option("--speed", help="measured iteration times (sim_lookup.csv format)")
    ] = None,
    name: Annotated[str, typer.Option("--name", help="deployment name")] = "cluster",
    launch: Annotated[bool, typer.Option("--launch/--no-launch", help="act on real ranks, or record only")] = True,
    executor: Annotated[
        str, typer.Option("--executor", help="local: this machine's ranks | slurm: nodes read from Slurm, sbatch jobs")
    ] = "local",
    partition: Annotated[str | None, typer.Option("--partition", help="slurm: the partition to schedule")] = None,
) -> None:
    """Serve scheduler_flow as a deployment on the `meshplan ui` server: one round every --every (Ctrl-C stops)."""
    import os
    from datetime import timedelta

    from cli.app import prefect_env
    from cli.commands.replan import parse_every
    from planner.errors import MeshplanError
    from planner.scheduler import POLICIES

    seconds = parse_every(every)
    if executor not in ("local", "slurm"):
        raise MeshplanError("--executor", executor, "use local (this machine's ranks) or slurm (sbatch)")
    if policy not in POLICIES:
        raise MeshplanError("--policy", policy, f"choose one of {', '.join(POLICIES)}")
    for what, path in (("--cluster", cluster), ("--speed", speed)):
        if path is not None and not path.is_file():
            raise MeshplanError(what, str(path), "no such file")
    cfg = load_settings()
    prefect_env(cfg)
    if "PREFECT_API_URL" not in os.environ:
        raise MeshplanError(
            "schedule-cluster",
            str(cluster),
            "schedules need a Prefect server: run `meshplan ui` first (same --state-dir)",
        )
    from flows.scheduler import scheduler_flow

    params = scheduler_parameters(cfg, cluster, policy, speed, launch, executor, partition)
    typer.echo(f"serving scheduler/{name} every {every} against {os.environ['PREFECT_API_URL']} — Ctrl-C stops")
    scheduler_flow.serve(name=name, interval=timedelta(seconds=seconds), parameters=params)


def scheduler_parameters(
    cfg: RunConfig,
    cluster: Path,
    policy: str = "jct",
    speed: Path | None = None,
    launch: bool = True,
    executor: str = "local",
    partition: str | None = None,
) -> dict[str, Any]:
    """scheduler_flow's parameters for a round of `schedule-cluster` (JSON: a deployment stores them)."""
    paths = state(cfg)
    return {
        "db_path": str(paths.db),
        "runs_dir": str(paths.runs),  # the jobs' run folders: the state folder's, wherever --db is
        "cluster_path": str(cluster.resolve()),
        "policy": policy,
        "speed_table": str(speed.resolve()) if speed else None,
        "launch": launch,
        "executor": executor,
        "slurm_partition": partition,
        "train": cfg.train.model_dump(mode="json"),  # the launch knobs (timeout, restarts) of every job's runner
    }
