"""Prefect tasks of stage 4 (train): record the run, launch torchrun, ingest telemetry.

Policies (DESIGN.md, Prefect): launching is a side effect that must not be repeated blindly — NO_CACHE and no
retries (a failed run is resumed on purpose, from its checkpoint, by launching again); the
launcher's own outer timeout kills the whole process group. Database writes are NO_CACHE
idempotent upserts, so their short retries (a briefly locked file) are safe.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from launcher.control import TelemetryTail
from launcher.launch import Launch, log_tail, run_local_nodes, run_logged, torchrun_command
from launcher.progress import StepProgress
from planner.errors import MeshplanError
from planner.specs.plan import Plan
from storage.plans import load_plan
from storage.runs import finish_run, ingest_step_metrics, run_steps, start_run


@task(name="load-stored-plan", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def load_stored_plan(db_path: str, plan_id: str) -> Plan:
    """A plan saved by the search stage (storage.plans, table `plans`)."""
    try:
        plan = load_plan(db_path, plan_id)
    except LookupError:
        plan = None
    if plan is None:
        raise MeshplanError("--plan-id", plan_id, "no such plan in the database; list them with `meshplan db`")
    return plan


@task(name="record-run", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def record_run(db_path: str, run_id: str, plan: Plan, steps: int, run_dir: str) -> None:
    start_run(db_path, run_id, plan, steps, run_dir)


@task(name="launch-training", retries=0, cache_policy=NO_CACHE)
def launch_training(
    launch: Launch, timeout_s: float, show_progress: bool = False, poll_s: float = 0.5
) -> dict[str, Any]:
    """Run torchrun to completion; {returncode, wall_s}. A non-zero exit raises with the log's tail.

    While it runs, the ranks' telemetry is polled every `poll_s` for the progress display
    (launcher/progress.py); the whole process group is killed past `timeout_s` or when interrupted.
    """
    log = Path(launch.run_dir) / "torchrun.log"
    tail = TelemetryTail(launch.run_dir)
    tail.read_new()  # rows of earlier launches of this run folder are not this job's
    with StepProgress(launch.steps, enabled=show_progress) as progress:
        poll = lambda: progress.update(tail.read_new())  # noqa: E731
        if launch.local_nodes and launch.nnodes > 1:  # every node here: one runner each (NodeFailed names a lost one)
            rc, wall_s = 0, run_local_nodes(launch, timeout_s, on_poll=poll, poll_s=poll_s)
        else:
            rc, wall_s = run_logged(torchrun_command(launch), log, timeout_s, on_poll=poll, poll_s=poll_s)
        progress.update(tail.read_new())
    if rc != 0:
        raise RuntimeError(f"torchrun exited {rc} ({log}):\n{log_tail(log)}")
    return {"returncode": rc, "wall_s": wall_s, "launch": dataclasses.asdict(launch)}


@task(name="ingest-telemetry", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def ingest_telemetry(db_path: str, run_id: str, run_dir: str) -> int:
    return ingest_step_metrics(db_path, run_id, run_dir)


@task(name="finish-run", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def close_run(db_path: str, run_id: str, status: str, message: str | None = None) -> list[dict[str, Any]]:
    """Mark the run finished; returns its per-step summary rows (view run_steps)."""
    finish_run(db_path, run_id, status, message)
    return run_steps(db_path, run_id).to_dicts()
