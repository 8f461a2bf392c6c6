"""`scheduler_flow`: one round of the multi-job scheduler over the DuckDB queue, its decision an artifact.

Tasks: read the state (queued jobs; running ones placed back on their recorded allocations), decide
(planner/scheduler, prices from the planner's search or a measured table), apply: every start,
resize, stop and rejection is a job state transition, and each acts on real ranks — a start runs
the job's elastic runner (flows/job.py → train_flow), a resize asks its ranks to checkpoint and exit
so the runner re-plans and resumes on the new allocation, a cancelled job's ranks are stopped.
Before deciding, a running job whose runner process is gone is put back in the queue.
A round holds the DuckDB lease `scheduler` (storage/lease.py) from reconciling to applying: a
second round meanwhile does nothing, and a round scheduled before the latest one ended (missed
while `schedule-cluster` was down, started late by Prefect) is collapsed into it.
`launch=False` decides and records only (what a dry run or a cluster this machine is not needs).
"""

from __future__ import annotations

import sys

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from flows.outcomes import SchedulerOutcome
from planner.errors import MeshplanError
from planner.inputs import read_input
from planner.scheduler import DEFAULT_POLICY, PlannerSpeed, Policy, TableSpeed
from planner.scheduler.trace import parse_lookup
from planner.specs.cluster import ClusterSpec, parse_cluster_toml
from planner.specs.config import SEARCH_BUDGET_S, TrainConfig
from rundir import StateDir
from tasks.scheduler import (
    alloc_text,
    apply_round,
    decide_round,
    give_lease,
    read_state,
    reconcile_runners,
    take_lease,
)
from tasks.slurm import read_slurm_cluster

# what starts a job's elastic runner (flows/job.py): the tasks are given it, since no task names a flow
RUNNER = [sys.executable, "-m", "flows.job"]


def _read(path: str, what: str) -> str:
    return read_input(path, what, "cluster")


@flow(name="scheduler")
def scheduler_flow(
    db_path: str,
    cluster_path: str,
    policy: str = DEFAULT_POLICY,
    time_budget_s: float = SEARCH_BUDGET_S,
    speed_table: str | None = None,
    policy_options: dict[str, float] | None = None,
    launch: bool = True,
    runs_dir: str | None = None,
    train: TrainConfig | None = None,
    executor: str = "local",
    slurm_partition: str | None = None,
) -> SchedulerOutcome:
    """One round (its SchedulerOutcome: flows/outcomes.py). `speed_table`: measured iteration times (sim_lookup.csv format) instead of the planner's
    prices; `policy_options`: Policy's fields (relaunch_s, min_gain_s, ...); `runs_dir`: where the
    jobs' run folders go (default: `runs/` next to the database); `train`: the `[train]` section whole,
    whose launch knobs (timeout, restarts) every job's runner launches with. `executor="slurm"`: the cluster is
    read from Slurm each round (tasks/slurm.py; `cluster_path` gives its kinds' figures and links) and
    each job runs as sbatch jobs in `slurm_partition`."""
    spec = parse_cluster_toml(_read(cluster_path, "--cluster"), cluster_path)
    runner_args: list[str] = []
    if executor == "slurm":
        spec = read_slurm_cluster(spec, slurm_partition)
        runner_args = ["--executor", "slurm"] + (["--partition", slurm_partition] if slurm_partition else [])
    elif executor != "local":
        raise MeshplanError("--executor", executor, "use local (this machine's ranks) or slurm (sbatch)")
    pol = Policy(policy, **(policy_options or {}))
    holder, why = take_lease(db_path, flow_run.scheduled_start_time)
    if holder is None:  # one round at a time; a missed round is collapsed into the one that ran since
        return SchedulerOutcome(actions=[], rejections=[], waiting=[], applied=[], requeued=[], skipped=why)
    try:
        return _round(db_path, cluster_path, spec, pol, policy, time_budget_s, speed_table, launch, runs_dir,
                      train or TrainConfig(), runner_args)  # fmt: skip
    finally:
        give_lease(db_path, holder)


def _round(
    db_path: str,
    cluster_path: str,
    spec: ClusterSpec,
    pol: Policy,
    policy: str,
    time_budget_s: float,
    speed_table: str | None,
    launch: bool,
    runs_dir: str | None,
    train: TrainConfig,
    runner_args: list[str],
) -> SchedulerOutcome:
    """The round itself, under the lease: reconcile runners first, then read, decide, apply."""
    planner_speed = PlannerSpeed.from_cluster(spec, time_budget_s=time_budget_s)
    speed = TableSpeed(parse_lookup(_read(speed_table, "--speed"), speed_table)) if speed_table else planner_speed
    requeued = reconcile_runners(db_path) if launch else []
    cl, queue, running = read_state(db_path, spec, speed)
    d = decide_round(cl, queue, running, pol, speed)
    runs = str(StateDir.of_db(db_path, runs_dir).runs)
    done = apply_round(RUNNER, db_path, d, cluster_path, runs, launch, train, runner_args)
    lines = [
        f"# Scheduler round ({policy})",
        "",
        "| job | action | allocation | s/iter | plan | why |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {a.job_id} | {a.kind} | {alloc_text(a.placement.alloc)} | {a.iter_time_s:.3g} | {a.plan} | {a.reason} |"
        for a in d.actions
    ]
    lines += [f"| {r.job_id} | reject | - | - | - | {r.reason} |" for r in d.rejections]
    lines += [
        f"| {x['job_id']} | stop | - | - | - | cancelled: its ranks were asked to exit |"
        for x in done
        if x["action"] == "stop"
    ]
    lines += [f"| {j} | requeue | - | - | - | its runner is gone: resumes from its checkpoint |" for j in requeued]
    lines += ["", f"waiting: {', '.join(d.waiting) or 'none'}; planner searches this round: {d.speed_queries}"]
    create_markdown_artifact("\n".join(lines), key="scheduler-round", description="one scheduling round")
    return SchedulerOutcome(
        actions=[(a.job_id, a.kind, alloc_text(a.placement.alloc)) for a in d.actions],
        rejections=[(r.job_id, r.reason) for r in d.rejections],
        waiting=list(d.waiting),
        applied=done,
        requeued=requeued,
    )
