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
import signal
import sys
from pathlib import Path
from typing import Any

from prefect import flow

import rundir
from flows.outcomes import JobOutcome, JobSegment
from flows.requests import TrainRequest
from flows.train import train_flow
from launcher.control import exit_path, read_control, read_exit
from launcher.launch import NodeFailed
from launcher.slurm import SlurmPreempted
from planner.errors import MeshplanError
from planner.inputs import read_input
from planner.scheduler import Allocation
from planner.specs.cluster import ClusterSpec, parse_cluster_toml
from planner.specs.config import SEARCH_BUDGET_S, ReplanConfig
from planner.specs.runspec import RunOptions
from planner.validation import parse
from storage.jobs import get_job, job_model, set_job_run, transition
from tasks.scheduler import alloc_text, checkpoint_step, parse_alloc, plan_for_allocation
from tasks.slurm import slurm_resources

# train_flow's options a job may set at submission (storage.jobs.submit_job's `train`): the ranks'
# training options (RunOptions; steps are the job's iterations), and poll_s (its replan_config's poll)
TRAIN_KEYS = (*(k for k in RunOptions.model_fields if k != "steps"), "poll_s")


def read_cluster(cluster_path: str) -> ClusterSpec:
    text = read_input(cluster_path, "--cluster", "cluster", "the scheduler's cluster TOML")
    return parse_cluster_toml(text, Path(cluster_path).name)


def _train_options(job_id: str, train: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(train) - set(TRAIN_KEYS))
    if unknown:
        raise MeshplanError(f"job {job_id} train options", unknown, f"known options: {', '.join(TRAIN_KEYS)}")
    parse(TrainRequest, _options(train), f"job {job_id} train options")  # bad values fail the job here, once
    return train


def _options(train: dict[str, Any]) -> dict[str, Any]:
    """A job's train options as TrainRequest fields (poll_s is its replan_config's, the rest its spec's)."""
    options: dict[str, Any] = {"spec": {k: v for k, v in train.items() if k != "poll_s"}}
    if "poll_s" in train:
        options["replan_config"] = ReplanConfig(poll_s=train["poll_s"])
    return options


@flow(name="job", log_prints=True)
def job_flow(
    db_path: str,
    job_id: str,
    cluster_path: str,
    runs_dir: str | None = None,
    timeout_s: float = 900.0,
    max_failures: int = 1,
    time_budget_s: float = SEARCH_BUDGET_S,
    executor: str = "local",
    slurm_partition: str | None = None,
) -> JobOutcome:
    """Run the job to its end; returns its JobOutcome (flows/outcomes.py): one segment per launch.
    `executor="slurm"`: each launch is an sbatch job on the allocation's kind and node count."""
    spec = read_cluster(cluster_path)
    row = get_job(db_path, job_id)
    try:
        train = _train_options(job_id, row["train"])
    except MeshplanError as exc:
        _fail(db_path, job_id, str(exc))
        raise
    run_dir = (Path(runs_dir) if runs_dir else Path(db_path).resolve().parent / "runs") / job_id
    run_dir.mkdir(parents=True, exist_ok=True)
    set_job_run(db_path, job_id, run_dir=str(run_dir))
    model = job_model(row)
    if model is not None:  # a custom model: its dimensions travel to the ranks in the run folder
        rundir.model_path(run_dir).write_text(model.model_dump_json(indent=2))
    segments: list[JobSegment] = []
    try:
        slurm = (executor, slurm_partition)
        _run(db_path, job_id, spec, run_dir, train, segments, timeout_s, max_failures, time_budget_s, slurm)
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
    train: dict[str, Any],
    segments: list[JobSegment],
    timeout_s: float,
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
        request = _request(train, plan_path, parse_alloc(alloc), row, run_dir, timeout_s, seen, *slurm)
        error, survivors, preempted = None, None, False
        try:
            train_flow(db_path, request, job_id)
        except Exception as exc:  # the ranks died (or timed out): fall back to the latest checkpoint
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            survivors = _surviving(parse_alloc(alloc), exc)
            preempted = isinstance(exc, SlurmPreempted)
        ex = read_exit(run_dir)
        end = checkpoint_step(run_dir)
        segments.append(
            JobSegment(
                allocation=alloc,
                plan_fingerprint=plan.fingerprint(),
                from_step=start,
                to_step=end,
                exit="error" if error else ("requested" if ex else "done"),
            )
        )
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


def _surviving(alloc: Allocation, exc: BaseException) -> tuple[str, int] | None:
    """(the allocation without the node whose runner was lost, that node's rank), or None: not a lost
    node of a several-node launch (a lost rank, a timeout: the job resumes on its allocation)."""
    if not isinstance(exc, NodeFailed) or alloc.num_nodes < 2:
        return None
    left = Allocation(alloc.kind, alloc.count - alloc.per_node, alloc.num_nodes - 1)
    return alloc_text(left), exc.node_rank


def _request(
    train: dict[str, Any],
    plan_path: Path,
    alloc: Allocation,
    row: dict[str, Any],
    run_dir: Path,
    timeout_s: float,
    seen: int,
    executor: str = "local",
    partition: str | None = None,
) -> TrainRequest:
    """This launch's TrainRequest: the job's submitted options (checked by _train_options) on this segment's plan.

    Locally, one runner per node of the allocation, its nodes this machine's (a simulated cluster);
    through Slurm, one sbatch job on that many nodes of the kind, never requeued by Slurm itself (a
    lost node is this loop's to re-plan around)."""
    slurm: dict[str, Any] = {}
    if executor == "slurm":
        res = slurm_resources(alloc.kind, alloc.per_node, partition)
        slurm = {"executor": "slurm", "slurm": {"partition": partition, **res, "requeue": False}}
    options = _options(train)
    spec = {
        **options.pop("spec"),
        "steps": int(row["iterations"]),
        "resume": "auto",
        "model_json": str(rundir.model_path(run_dir)) if row.get("model_json") else None,
    }
    return parse(
        TrainRequest,
        {
            **options,
            "spec": spec,
            "plan_path": str(plan_path),
            # one runner per node of the allocation; its nodes are this machine's (a simulated cluster)
            "nproc_per_node": alloc.per_node,
            "nnodes": alloc.num_nodes,
            "local_nodes": alloc.num_nodes > 1 and executor == "local",
            "runs_dir": str(run_dir.parent),
            "timeout_s": timeout_s,
            "control_from_version": seen,
            **slurm,
        },
        f"job {row['job_id']} train options",
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
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--executor", choices=("local", "slurm"), default="local")
    p.add_argument("--partition", default=None, help="Slurm partition (executor slurm)")
    args = p.parse_args(argv)
    # SIGTERM must end the flow run (Crashed) and stop an ephemeral Prefect server (Prefect otherwise leaves both running)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    job_flow(
        args.db_path, args.job_id, args.cluster_path, args.runs_dir, args.timeout_s,
        executor=args.executor, slurm_partition=args.partition,
    )  # fmt: skip


if __name__ == "__main__":
    main()
