"""Prefect tasks of stage 4 (train): record the run, launch torchrun, ingest telemetry.

Policies (DESIGN.md, Prefect): launching is a side effect that must not be repeated blindly — NO_CACHE and no
retries (a failed run is resumed on purpose, from its checkpoint, by launching again); the
launcher's own outer timeout kills the whole process group. Database writes are NO_CACHE
idempotent upserts, so their short retries (a briefly locked file) are safe.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

import rundir
from launcher.control import TelemetryTail, begin_generation
from launcher.group import RUN_TAG, stop_labelled
from launcher.launch import (
    Launch,
    NodeFailed,
    launch_env,
    log_tail,
    run_label,
    run_local_nodes,
    run_logged,
    torchrun_command,
)
from launcher.progress import StepProgress
from launcher.slurm import SlurmPreempted, job_log, lost_node_rank, run_slurm
from planner.errors import MeshplanError
from planner.specs.plan import Plan
from planner.specs.slurm import SlurmOptions
from storage.plans import load_plan
from storage.runs import (
    events_of,
    finish_run,
    ingest_eval_metrics,
    ingest_step_metrics,
    record_run_events,
    resume_records,
    run_steps,
    set_run_executor,
    set_run_generation,
    start_run,
)


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


@task(name="open-generation", retries=0, cache_policy=NO_CACHE)
def open_generation(db_path: str, run_id: str, run_dir: str) -> int:
    """Fence off every earlier launch of the run folder; returns this launch's generation.

    In this order: the new number goes into control.json (an older rank that reads it at a step or
    checkpoint boundary exits, publishing nothing), every process labelled with the run folder is
    stopped and seen gone (a SIGKILLed runner's orphaned agent and ranks included), and the number
    is recorded on the run's row — all before this launch's first rank starts, so the checkpoint it
    resumes from can no longer change under it."""
    generation = begin_generation(run_dir)
    stopped = stop_labelled(RUN_TAG, run_label(run_dir))
    set_run_generation(db_path, run_id, generation)
    if stopped:
        print(f"run {run_id}: generation {generation} stopped {stopped} process(es) of earlier generations")
    return generation


@task(name="launch-training", retries=0, cache_policy=NO_CACHE)
def launch_training(
    launch: Launch,
    timeout_s: float,
    show_progress: bool = False,
    poll_s: float = 0.5,
    slurm: SlurmOptions | None = None,
    db_path: str | None = None,
) -> dict[str, Any]:
    """Run torchrun to completion; {returncode, wall_s}. A non-zero exit raises with the log's tail.

    While it runs, the ranks' telemetry is polled every `poll_s` for the progress display
    (launcher/progress.py); the whole process group is killed past `timeout_s` or when interrupted.
    `slurm`: run it as one sbatch job instead (launcher/slurm.py), its job id logged in this task run
    and stored on the run row (`db_path`); timeout and interruption `scancel` it.
    """
    log = rundir.node_log(launch.run_dir)
    tail = TelemetryTail(launch.run_dir)
    tail.read_new()  # rows of earlier launches of this run folder are not this job's
    first_record = len(resume_records(launch.run_dir))
    with StepProgress(launch.spec.steps, enabled=show_progress) as progress:
        poll = lambda: progress.update(tail.read_new())  # noqa: E731
        if slurm is not None:

            def submitted(job_id: str) -> None:
                get_run_logger().info(f"run {launch.run_id}: slurm job {job_id} submitted ({launch.nnodes} node(s))")
                if db_path is not None:
                    set_run_executor(db_path, launch.run_id, "slurm", job_id)

            res = run_slurm(launch, slurm, timeout_s, on_submit=submitted, on_poll=poll, poll_s=poll_s)
            progress.update(tail.read_new())
            if res.returncode != 0:
                out = job_log(launch.run_dir, res.job_id)
                if res.state == "NODE_FAIL":  # a node of the allocation went down: name it, as run_local_nodes does
                    raise NodeFailed(lost_node_rank(res.job_id), res.returncode, out)
                if res.state == "PREEMPTED":  # Slurm took the nodes back (a job launched with --no-requeue)
                    raise SlurmPreempted(f"slurm job {res.job_id} was preempted ({out})")
                raise RuntimeError(
                    f"slurm job {res.job_id} ended {res.state}, exit {res.returncode} ({out}):\n{log_tail(out)}"
                )
            return {
                "returncode": 0,
                "wall_s": res.wall_s,
                "launch": dataclasses.asdict(launch),
                "slurm_job_id": res.job_id,
            }
        if launch.local_nodes and launch.nnodes > 1:  # every node here: one runner each (NodeFailed names a lost one)
            rc, wall_s = 0, run_local_nodes(launch, timeout_s, on_poll=poll, poll_s=poll_s)
        else:
            cmd, env = torchrun_command(launch), launch_env(launch)
            rc, wall_s = run_logged(cmd, log, timeout_s, on_poll=poll, poll_s=poll_s, extra_env=env)
        progress.update(tail.read_new())
    if rc != 0:
        stopped = next((r for r in resume_records(launch.run_dir)[first_record:] if r.get("field")), None)
        if stopped is not None:  # the ranks refused or diverged: their one line, not torchrun's traceback
            raise MeshplanError(stopped["field"], stopped.get("value"), stopped.get("fix", ""))
        raise RuntimeError(f"torchrun exited {rc} ({log}):\n{log_tail(log)}")
    return {"returncode": rc, "wall_s": wall_s, "launch": dataclasses.asdict(launch)}


@task(name="ingest-telemetry", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def ingest_telemetry(db_path: str, run_id: str, run_dir: str) -> int:
    """Step metrics and validation losses of the run folder into DuckDB; the (rank, step) rows stored."""
    ingest_eval_metrics(db_path, run_id, run_dir)
    return ingest_step_metrics(db_path, run_id, run_dir)


@task(name="finish-run", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def close_run(db_path: str, run_id: str, status: str, message: str | None = None) -> list[dict[str, Any]]:
    """Mark the run finished; returns its per-step summary rows (view run_steps)."""
    finish_run(db_path, run_id, status, message)
    return run_steps(db_path, run_id).to_dicts()


@task(name="record-run-events", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def record_events(db_path: str, run_id: str, run_dir: str, first_record: int) -> list[dict[str, Any]]:
    """The restarts, checkpoint fallbacks and resumes of this launch (resume.jsonl lines from
    `first_record` on), stored on the run (table run_events); a refusal is returned as kind "error"."""
    records = resume_records(run_dir)[first_record:]
    events = events_of(records, first_record)
    record_run_events(db_path, run_id, events)
    errors = [
        {"kind": "error", "message": r["error"], **{k: r[k] for k in ("field", "value", "fix") if k in r}}
        for r in records
        if r.get("error")
    ]
    return events + errors[:1]
