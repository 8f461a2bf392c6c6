"""`job_flow`: one queued job's elastic life — train_flow segments on the allocations the scheduler gives it.

The scheduler's apply step starts it (`python -m flows.job DB JOB CLUSTER`) when it admits a job.
Each loop reads the job's row, plans for its current allocation (planner.search on that many
devices of its kind, relabelled onto ranks 0..n−1) and runs train_flow on that plan in the job's
run folder, resuming from the folder's latest checkpoint. When the ranks exit:
- with every step done → `finished`;
- because they were asked to (control.json `checkpoint_exit`, exit.json written): the scheduler
  moved the job to `resizing` with a new allocation (or cancelled it), so the next loop re-plans
  for it and the relaunch reshards the checkpoint through DCP, resuming at the exact step the
  exit saved — nothing lost, nothing repeated;
- because the ranks refused or diverged (a MeshplanError: a non-finite loss, a checkpoint that
  cannot be loaded): `failed` at once with that one line; a relaunch would meet it again;
- because a rank or node died: the job goes running → resizing → running and resumes from its
  latest verified checkpoint (the steps since that checkpoint are trained again, on the
  allocation then recorded), at most `max_failures` times, then `failed`. When one node's runner
  of a several-node allocation is lost (launcher.launch.NodeFailed), the allocation recorded is
  the surviving nodes', so the relaunch is re-planned for them and reshards the checkpoint.
Every transition is a job_events row, its reason naming the allocation, plan and step. A runner
that is stopped (SIGTERM, Ctrl-C) puts its job back in the queue: re-admitted, it resumes from its
latest checkpoint in the same run folder.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from prefect import flow

import rundir
from flows.outcomes import JobOutcome, JobSegment
from flows.requests import TrainRequest, request_fields
from flows.train import train_flow
from launcher.control import exit_path, read_control, read_exit
from launcher.launch import NodeFailed
from launcher.slurm import SlurmPreempted
from planner.errors import MeshplanError
from planner.inputs import read_input
from planner.scheduler import Allocation
from planner.specs.cluster import ClusterSpec, parse_cluster_toml
from planner.specs.config import SEARCH_BUDGET_S, TrainConfig
from planner.specs.runspec import RunOptions
from planner.validation import parse
from rundir import StateDir
from storage.jobs import get_job, job_model, job_options, set_job_run, transition
from tasks.scheduler import RUNNER_TAG, alloc_text, checkpoint_step, live_runners, parse_alloc, plan_for_allocation
from tasks.slurm import slurm_resources


def read_cluster(cluster_path: str) -> ClusterSpec:
    text = read_input(cluster_path, "--cluster", "cluster", "the scheduler's cluster TOML")
    return parse_cluster_toml(text, Path(cluster_path).name)


@flow(name="job", log_prints=True)
def job_flow(
    db_path: str,
    job_id: str,
    cluster_path: str,
    runs_dir: str | None = None,
    train: TrainConfig | None = None,
    max_failures: int = 1,
    time_budget_s: float = SEARCH_BUDGET_S,
    executor: str = "local",
    slurm_partition: str | None = None,
) -> JobOutcome:
    """Run the job to its end; returns its JobOutcome (flows/outcomes.py): one segment per launch.
    `train`: the scheduler's `[train]` section whole (its launch knobs: timeout, restarts; the job's
    own training options are the ones stored with it at submission). `executor="slurm"`: each
    launch is an sbatch job on the allocation's kind and node count."""
    spec = read_cluster(cluster_path)
    row = get_job(db_path, job_id)
    if live_runners(db_path, job_id):  # a second runner of one job would fight the first over its ranks
        raise MeshplanError(f"job {job_id}", "runner", "another runner of this job is alive; this one exits")
    try:
        options = job_options(row)  # typed at submission (storage.jobs.submit_job): read, not re-checked
    except MeshplanError as exc:
        _fail(db_path, job_id, str(exc))
        raise
    run_dir = StateDir.of_db(db_path, runs_dir).job(job_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    set_job_run(db_path, job_id, run_dir=str(run_dir))
    model = job_model(row)
    if model is not None:  # a custom model: its dimensions travel to the ranks in the run folder
        rundir.model_path(run_dir).write_text(model.model_dump_json(indent=2))
    segments: list[JobSegment] = []
    try:
        slurm = (executor, slurm_partition)
        launch = train or TrainConfig()
        _run(db_path, job_id, spec, run_dir, options, launch, segments, max_failures, time_budget_s, slurm)
    except (KeyboardInterrupt, SystemExit):  # the runner was stopped: its ranks are down (run_logged)
        if get_job(db_path, job_id)["state"] in ("running", "resizing"):
            step = checkpoint_step(run_dir)
            transition(db_path, job_id, "queued", f"runner stopped; re-admission resumes from step {step}")
        raise
    final = get_job(db_path, job_id)["state"]
    return JobOutcome(job_id=job_id, state=final, run_dir=str(run_dir), segments=segments)


def _run(
    db_path: str,
    job_id: str,
    spec: ClusterSpec,
    run_dir: Path,
    options: RunOptions,
    train: TrainConfig,
    segments: list[JobSegment],
    max_failures: int,
    time_budget_s: float,
    slurm: tuple[str, str | None] = ("local", None),
) -> None:
    """The launch loop of job_flow; appends one record per launch to `segments`."""
    failures = 0
    while True:
        # read before the row: an order written after this is newer and the launch obeys it; one
        # written before is already in the row (request_resize writes the state first)
        seen = (read_control(run_dir) or {}).get("version", 0)
        row = get_job(db_path, job_id)
        if row["state"] not in ("running", "resizing"):
            break  # cancelled (its ranks were asked to exit), or failed
        alloc = row["allocation"]
        try:
            plan = plan_for_allocation(spec, row, alloc, time_budget_s)
        except MeshplanError as exc:  # nothing to launch: the job fails with the reason on record
            _fail(db_path, job_id, f"cannot plan on {alloc}: {exc}")
            raise
        start = checkpoint_step(run_dir)
        if row["state"] == "resizing":
            transition(
                db_path,
                job_id,
                "running",
                f"resharded onto {alloc} from the checkpoint at step {start}; plan {plan.fingerprint()[:8]} "
                f"pp={plan.pp} dp={plan.dp} tp={plan.stages[0].tp}",
                alloc,
            )
        plan_path = rundir.segment_plan_path(run_dir, len(segments))
        plan_path.parent.mkdir(exist_ok=True)
        plan_path.write_text(plan.to_json())
        exit_path(run_dir).unlink(missing_ok=True)  # an exit.json after this launch is this launch's
        request = _request(options, train, plan_path, parse_alloc(alloc), row, run_dir, seen, *slurm)
        error, survivors, preempted = None, None, False
        try:
            train_flow(db_path, request, job_id)
        except MeshplanError as exc:  # the ranks refused or diverged: a relaunch would meet the same line
            segments.append(_segment(alloc, plan, start, checkpoint_step(run_dir), "error"))
            print(f"job {job_id}: {alloc} steps {start}..{segments[-1].to_step} (stopped: {exc})")
            _fail(db_path, job_id, str(exc))
            break
        except Exception as exc:  # the ranks died (or timed out): fall back to the latest checkpoint
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            survivors = _surviving(parse_alloc(alloc), exc)
            preempted = isinstance(exc, SlurmPreempted)
        ex = read_exit(run_dir)
        end = checkpoint_step(run_dir)
        segments.append(_segment(alloc, plan, start, end, "error" if error else ("requested" if ex else "done")))
        print(f"job {job_id}: {alloc} steps {start}..{end} ({segments[-1].exit})")
        if error is None and ex is None:
            state = get_job(db_path, job_id)["state"]
            if state == "resizing":  # the order came after the last step: there is nothing left to move
                transition(db_path, job_id, "running", "finished before the resize took effect", alloc)
            if state in ("running", "resizing"):  # not cancelled meanwhile
                transition(db_path, job_id, "finished", f"{end} steps on {len(segments)} launch(es)")
            break
        if error is None:
            continue  # asked to exit: a resize (state resizing) or a stop (cancelled); the row says which
        failures += 0 if preempted else 1  # a preemption is Slurm's choice, not the job's failure
        state = get_job(db_path, job_id)["state"]
        if state not in ("running", "resizing"):
            break
        if failures > max_failures:
            transition(db_path, job_id, "failed", f"{error}; {failures} failed launch(es)")
            break
        if state == "running" and survivors is not None:  # a node is lost: re-plan on the nodes left
            lost = f"node {survivors[1]} of {alloc} lost ({error})"
            transition(
                db_path, job_id, "resizing", f"{lost}; re-planning on {survivors[0]} from step {end}", survivors[0]
            )
        elif state == "running":
            transition(db_path, job_id, "resizing", f"{error}; resuming from the latest checkpoint (step {end})", alloc)


def _segment(alloc: str, plan: Any, start: int, end: int, exit: str) -> JobSegment:
    return JobSegment(allocation=alloc, plan_fingerprint=plan.fingerprint(), from_step=start, to_step=end, exit=exit)


def _surviving(alloc: Allocation, exc: BaseException) -> tuple[str, int] | None:
    """(the allocation without the node whose runner was lost, that node's rank), or None: not a lost
    node of a several-node launch (a lost rank, a timeout: the job resumes on its allocation)."""
    if not isinstance(exc, NodeFailed) or alloc.num_nodes < 2:
        return None
    left = Allocation(alloc.kind, alloc.count - alloc.per_node, alloc.num_nodes - 1)
    return alloc_text(left), exc.node_rank


def _request(
    options: RunOptions,
    train: TrainConfig,
    plan_path: Path,
    alloc: Allocation,
    row: dict[str, Any],
    run_dir: Path,
    seen: int,
    executor: str = "local",
    partition: str | None = None,
) -> TrainRequest:
    """This launch's TrainRequest: the job's stored options (its ranks' RunSpec) and the scheduler's
    `[train]` launch knobs (timeout, restarts) on this segment's plan.

    Locally, one runner per node of the allocation, its nodes this machine's (a simulated cluster);
    through Slurm, one sbatch job on that many nodes of the kind, never requeued by Slurm itself (a
    lost node is this loop's to re-plan around)."""
    slurm: dict[str, Any] = {}
    if executor == "slurm":
        res = slurm_resources(alloc.kind, alloc.per_node, partition)
        slurm = {"executor": "slurm", "slurm": {"partition": partition, **res, "requeue": False}}
    spec = {
        **options.model_dump(),  # every option, steps = the job's iterations (stored so at submission)
        "resume": "auto",
        "model_json": str(rundir.model_path(run_dir)) if row.get("model_json") else None,
    }
    return parse(
        TrainRequest,
        request_fields(
            train,
            spec,
            plan_path=str(plan_path),
            # one runner per node of the allocation; its nodes are this machine's (a simulated cluster)
            nproc_per_node=alloc.per_node,
            nnodes=alloc.num_nodes,
            local_nodes=alloc.num_nodes > 1 and executor == "local",
            runs_dir=str(run_dir.parent),
            control_from_version=seen,
            **slurm,
        ),
        f"job {row['job_id']} launch",
    )


def _fail(db_path: str, job_id: str, reason: str) -> None:
    if get_job(db_path, job_id)["state"] in ("queued", "running", "resizing"):
        transition(db_path, job_id, "failed", reason)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m flows.job", description="run one queued job elastically")
    p.add_argument("db_path")
    p.add_argument("job_id")
    p.add_argument("cluster_path")
    p.add_argument("--runs-dir", default=None)
    p.add_argument("--train", default="{}", help="the scheduler's [train] section as JSON (TrainConfig)")
    p.add_argument("--executor", choices=("local", "slurm"), default="local")
    p.add_argument("--partition", default=None, help="Slurm partition (executor slurm)")
    args = p.parse_args(argv)
    # this process is the job's runner (tasks.scheduler.live_runners finds it by the tag); its ranks are not
    os.environ.pop(RUNNER_TAG, None)
    # SIGTERM must end the flow run (Crashed) and stop an ephemeral Prefect server (Prefect otherwise leaves both running)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    train = TrainConfig.model_validate_json(args.train)  # tasks/scheduler.start_runner wrote it from a TrainConfig
    job_flow(
        args.db_path, args.job_id, args.cluster_path, args.runs_dir, train,
        executor=args.executor, slurm_partition=args.partition,
    )  # fmt: skip


if __name__ == "__main__":
    main()
