"""The job queue (tables `jobs`, `job_events`): submit, move between states, list, cancel.

Every state change and its event row are written in one transaction; a transition the state
machine does not allow raises MeshplanError naming the job, its state and the target. A job also
carries its training options typed (`options`: a RunOptions as JSON, migration 0019; `job_options`
reads it), its run folder once launched and the allocation it was admitted with (`base_allocation`),
which the elastic runner (flows/job.py) and the scheduler read.
A job's model is a preset name (`model`), or dimensions: a ModelSpec stored whole (`model_json`,
migration 0012; NULL on a preset's row) and named by its `name` in `model`.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import polars as pl

import rundir
from planner.errors import MeshplanError
from planner.specs.model import PRESETS, ModelSpec
from planner.specs.runspec import RunOptions
from planner.validation import parse
from storage.db import connect, query

STATES = ("queued", "running", "resizing", "finished", "failed", "cancelled")
ALLOWED = {
    "queued": {"running", "failed", "cancelled"},
    "running": {"resizing", "finished", "failed", "queued", "cancelled"},  # queued: preempted
    "resizing": {"running", "failed", "queued", "cancelled"},
    "finished": set(),
    "failed": set(),
    "cancelled": set(),
}


def submit_job(
    db_path: str | Path,
    model: str | ModelSpec,
    global_batch: int,
    iterations: int,
    *,
    job_id: str | None = None,
    seq: int | None = None,
    priority: int = 0,
    deadline_s: float | None = None,
    gpu_kinds: tuple[str, ...] = (),
    train: RunOptions | dict[str, Any] | None = None,
) -> str:
    """Queue a job; returns its id. Resubmitting an existing id is an error, not a duplicate.

    `model`: a preset (or speed-table) name, or a ModelSpec — stored with its dimensions unless it is
    exactly the preset of its name. `train`: the job's training options (RunOptions; a dict is read
    over RunOptions' defaults), validated here once and stored whole; their steps are `iterations`."""
    if global_batch <= 0 or iterations <= 0:
        raise MeshplanError("global_batch/iterations", (global_batch, iterations), "both must be positive")
    if isinstance(train, RunOptions):  # typed already (the CLI's, merged over [train]): its steps are the job's
        options = train.model_copy(update={"steps": iterations})
    else:  # a dict (a test, a script): read over RunOptions' defaults, checked once here
        options = parse(RunOptions, {**(train or {}), "steps": iterations}, "job train options")
    name, model_json = _model_columns(model)
    job_id = job_id or uuid.uuid4().hex[:12]
    problem = rundir.id_problem(job_id)  # the id names the job's run folder: it must stay inside runs/
    if problem:
        raise MeshplanError("job_id", job_id, problem)
    with connect(db_path) as con:
        con.execute("BEGIN TRANSACTION")
        if con.execute("SELECT 1 FROM jobs WHERE job_id = ?", [job_id]).fetchall():
            con.execute("ROLLBACK")
            raise MeshplanError("job_id", job_id, "already submitted; pick another id or cancel that job")
        con.execute(
            "INSERT INTO jobs (job_id, model, global_batch, iterations, seq, priority, deadline_s, gpu_kinds,"
            " state, allocation, submitted_at, updated_at, model_json, options)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'queued', NULL, now(), now(), ?, ?)",
            [
                job_id,
                name,
                global_batch,
                iterations,
                seq,
                priority,
                deadline_s,
                ";".join(gpu_kinds),
                model_json,
                options.model_dump_json(),
            ],
        )
        con.execute("INSERT INTO job_events VALUES (?, 0, NULL, 'queued', NULL, 'submitted', now())", [job_id])
        con.execute("COMMIT")
    return job_id


def _model_columns(model: str | ModelSpec) -> tuple[str, str | None]:
    """(model, model_json) of a job's row: a preset's dimensions are its name's, anything else is stored."""
    if isinstance(model, str):
        return model, None
    return model.name, None if PRESETS.get(model.name) == model else model.model_dump_json()


def job_model(row: dict[str, Any]) -> ModelSpec | None:
    """The ModelSpec a job row stores (a custom or model-file job), or None: its `model` is a preset
    (or a speed table's key) by name."""
    text = row.get("model_json")
    return ModelSpec.model_validate_json(text) if text else None


def job_options(row: dict[str, Any]) -> RunOptions:
    """The training options a job row stores (steps: its iterations). A row from before migration
    0019 has only the flags given at submission (`train_json`), read over RunOptions' defaults."""
    if row.get("options"):
        return RunOptions.model_validate_json(row["options"])
    legacy = {k: v for k, v in json.loads(row.get("train_json") or "{}").items() if k in RunOptions.model_fields}
    return parse(RunOptions, {**legacy, "steps": row["iterations"]}, f"job {row['job_id']} train options")


def transition(
    db_path: str | Path, job_id: str, to_state: str, reason: str = "", allocation: str | None = None
) -> None:
    """Move a job to `to_state` and record the event, atomically."""
    if to_state not in STATES:
        raise MeshplanError("state", to_state, f"choose one of {', '.join(STATES)}")
    with connect(db_path) as con:
        con.execute("BEGIN TRANSACTION")
        row = con.execute("SELECT state FROM jobs WHERE job_id = ?", [job_id]).fetchall()
        if not row:
            con.execute("ROLLBACK")
            raise MeshplanError("job_id", job_id, "no such job; see `meshplan jobs`")
        state = row[0][0]
        if to_state not in ALLOWED[state]:
            con.execute("ROLLBACK")
            raise MeshplanError(f"job {job_id} state", state, f"cannot go to {to_state} from {state}")
        n = con.execute("SELECT coalesce(max(seq) + 1, 0) FROM job_events WHERE job_id = ?", [job_id]).fetchall()[0][0]
        con.execute(
            "UPDATE jobs SET state = ?, allocation = coalesce(?, allocation), updated_at = now() WHERE job_id = ?",
            [to_state, allocation, job_id],
        )
        con.execute(
            "INSERT INTO job_events VALUES (?, ?, ?, ?, ?, ?, now())", [job_id, n, state, to_state, allocation, reason]
        )
        con.execute("COMMIT")


def set_job_run(
    db_path: str | Path,
    job_id: str,
    *,
    run_dir: str | None = None,
    base_allocation: str | None = None,
    runner_pid: int | None = None,
) -> None:
    """Record a job's run folder, the allocation it was admitted with, its runner's pid (None: unchanged)."""
    with connect(db_path) as con:
        con.execute(
            "UPDATE jobs SET run_dir = coalesce(?, run_dir), base_allocation = coalesce(?, base_allocation),"
            " runner_pid = coalesce(?, runner_pid), updated_at = now() WHERE job_id = ?",
            [run_dir, base_allocation, runner_pid, job_id],
        )


def get_job(db_path: str | Path, job_id: str) -> dict[str, Any]:
    """The job's row (its training options: `job_options(row)`)."""
    rows = query(db_path, "SELECT * FROM jobs WHERE job_id = ?", [job_id]).to_dicts()
    if not rows:
        raise MeshplanError("job_id", job_id, "no such job; see `meshplan jobs`")
    return rows[0]


def cancel_job(db_path: str | Path, job_id: str, reason: str = "cancelled by the user") -> None:
    transition(db_path, job_id, "cancelled", reason)


def list_jobs(db_path: str | Path, state: str | None = None) -> pl.DataFrame:
    if state is not None and state not in STATES:
        raise MeshplanError("--state", state, f"not a job state; choose one of {', '.join(STATES)}")
    sql = "SELECT * FROM jobs" + (" WHERE state = ?" if state else "") + " ORDER BY submitted_at, job_id"
    return query(db_path, sql, [state] if state else None)


def job_events(db_path: str | Path, job_id: str | None = None) -> pl.DataFrame:
    sql = "SELECT * FROM job_events" + (" WHERE job_id = ?" if job_id else "") + " ORDER BY job_id, seq"
    return query(db_path, sql, [job_id] if job_id else None)
