"""Prefect tasks of the cluster scheduler: read the queue, decide one round, apply what it chose.

Applying a round: a start moves the job to running and starts its elastic runner (a process of its
own, so the round ends while the job trains; the flow passes the command that starts it, so no task
names a flow); a resize moves it to resizing with the
new allocation and asks its ranks to checkpoint and exit (control.json `checkpoint_exit`), after
which the runner re-plans for the new allocation and relaunches train_flow resuming through DCP; a
cancelled job that still has ranks is asked to exit the same way.

Policies: reading the queue and deciding must see the latest rows — NO_CACHE (the planner's prices
are cached inside PlannerSpeed for the round). Applying is a sequence of state transitions, each
atomic in DuckDB, and process starts; it is not retried (a retry would try a transition already
made and be refused, or start a second runner).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

import rundir
from launcher.control import read_control, write_control
from launcher.group import labelled
from launcher.launch import start_logged
from planner.errors import MeshplanError
from planner.replan.options import relabel_for_runtime
from planner.runtime import check_launchable, node_ranks
from planner.scheduler import (
    ClusterState,
    Decision,
    Job,
    PlannerSpeed,
    Policy,
    RunningJob,
    SpeedSource,
    decide,
)
from planner.scheduler.trace import cluster_from_spec
from planner.scheduler.types import alloc_text, parse_alloc
from planner.specs.cluster import ClusterSpec
from planner.specs.config import SEARCH_BUDGET_S, TrainConfig
from planner.specs.plan import Plan
from storage import lease
from storage.jobs import get_job, job_model, list_jobs, set_job_run, transition

LEASE = "scheduler"  # the lease a round holds (storage/lease.py)
LEASE_S = 900.0  # a round that holds it longer (a hung process on another host) loses it


@task(name="take-lease", cache_policy=NO_CACHE, retries=0)
def take_lease(db_path: str, scheduled_at: Any) -> tuple[str | None, str]:
    """(holder, "") when this round may run, or (None, why not): another live round holds the
    lease, or this round was scheduled before the latest round ended (a missed round Prefect starts
    late: the round that ran since did its work, so the missed ones collapse into it)."""
    last = lease.last_end(db_path, LEASE)
    when = lease.naive_utc(scheduled_at) if scheduled_at is not None else None
    if last is not None and when is not None and when < last:
        return None, f"collapsed: scheduled at {when:%H:%M:%S} UTC, before the round that ended at {last:%H:%M:%S}"
    holder = lease.new_holder()
    other = lease.acquire(db_path, LEASE, holder, LEASE_S)
    if other is not None:
        return None, f"another round holds the scheduler lease ({other})"
    return holder, ""


def give_lease(db_path: str, holder: str) -> None:
    lease.release(db_path, LEASE, holder)


def job_from_row(row: dict) -> Job:
    kinds = tuple(k for k in (row["gpu_kinds"] or "").split(";") if k)
    submitted = row.get("submitted_at")  # the policy ages waiting jobs from it (decide_round's now_s: time.time())
    return Job(
        row["job_id"],
        row["model"],
        row["global_batch"],
        row["iterations"],
        submitted.timestamp() if submitted is not None else 0.0,
        row["seq"],
        row["priority"],
        row["deadline_s"],
        kinds,
        spec=job_model(row),
    )


checkpoint_step = rundir.latest_checkpoint_step  # the run folder's module owns the layout


@task(name="read-queue", cache_policy=NO_CACHE)
def read_state(db_path: str, spec: ClusterSpec, speed: SpeedSource) -> tuple[ClusterState, list[Job], list[RunningJob]]:
    """Queued jobs, and running ones placed back on the cluster from their recorded allocation.

    A resizing job holds its new allocation but is not offered to the round (its switch is under
    way); a running job's progress is its latest checkpoint's step."""
    cl = cluster_from_spec(spec)
    # one read, one snapshot: a runner can take its job resizing → running between two reads, and a
    # job read once per state would then hold its allocation twice
    rows = list(list_jobs(db_path).iter_rows(named=True))
    queue = [job_from_row(r) for r in rows if r["state"] == "queued"]
    running = []
    for state in ("resizing", "running"):
        for r in (r for r in rows if r["state"] == state):
            job, alloc = job_from_row(r), parse_alloc(r["allocation"])
            place = cl.place(alloc)
            price = speed.price(job, alloc)
            assert place is not None and price is not None, f"{state} job {job.job_id} no longer fits {alloc}"
            cl.take(place)
            if state == "running":
                base = parse_alloc(r["base_allocation"]) if r.get("base_allocation") else alloc
                done = float(checkpoint_step(r.get("run_dir")))
                running.append(RunningJob(job, place, price.iter_time_s, done, base=base, plan=price.plan))
    return cl, queue, running


@task(name="decide-round", cache_policy=NO_CACHE)
def decide_round(
    cl: ClusterState, queue: list[Job], running: list[RunningJob], policy: Policy, speed: SpeedSource
) -> Decision:
    return decide(cl, queue, running, policy, speed, time.time())


def request_resize(db_path: str, job_id: str, run_dir: str | None, alloc: str, reason: str) -> None:
    """running → resizing onto `alloc`, then ask the ranks to checkpoint and exit at their next step.

    The state is written first: the runner, seeing its ranks exit, reads the allocation to re-plan
    for; if they had already exited (between two launches) the runner plans for it anyway."""
    transition(db_path, job_id, "resizing", reason, alloc)
    if run_dir:
        write_control(run_dir, "checkpoint_exit", at_step=0, reason=f"resize to {alloc}")


def request_stop(run_dir: str) -> bool:
    """Ask a cancelled job's ranks to checkpoint and exit, once; True when asked now."""
    msg = read_control(run_dir)
    if msg is not None and msg.get("reason") == "stop":
        return False
    write_control(run_dir, "checkpoint_exit", at_step=0, reason="stop")
    return True


RUNNER_TAG = "MESHPLAN_RUNNER"  # in a runner's environment: runner_label, the job it runs (runner_alive reads it)


def runner_label(db_path: str | Path, job_id: str) -> str:
    """The tag's value for a runner of `job_id` in the store at `db_path`: job ids are unique in one
    store only, so two state folders each with a job "j" never take each other's runner for theirs."""
    return f"{job_id}@{Path(db_path).resolve()}"


def start_runner(
    runner: list[str],
    db_path: str,
    job_id: str,
    cluster_path: str,
    runs_dir: str,
    train: TrainConfig,
    runner_args: list[str] | None = None,
) -> int:
    """Start the job's elastic runner in a session of its own; its pid. `runner` is the command that
    starts one (the flow's: flows/scheduler.py), given `DB JOB CLUSTER --runs-dir D --train JSON` (the
    `[train]` section whole, off its defaults: the launch knobs every launch of the job uses).

    The runner's environment carries `MESHPLAN_RUNNER=<job id>`, which `runner_alive` looks for. It
    reports to this process's Prefect API when there is one (a served scheduler, the test harness), so
    its flow runs show next to the round that started it."""
    from prefect.settings import PREFECT_API_URL

    log = rundir.job_log(rundir.StateDir.of_db(db_path, runs_dir).job(job_id))
    paths = [str(Path(p).resolve()) for p in (db_path, cluster_path, runs_dir)]  # the runner's cwd may differ
    cmd = [*runner, paths[0], job_id, paths[1], "--runs-dir", paths[2]]
    cmd += ["--train", train.model_dump_json(exclude_defaults=True), *(runner_args or [])]
    env = {RUNNER_TAG: runner_label(db_path, job_id)}
    api = PREFECT_API_URL.value()
    if api:  # reported there while it answers; a server that went away is retried once, not for minutes
        env["PREFECT_API_URL"] = api
        env["PREFECT_CLIENT_MAX_RETRIES"] = "1"
    return start_logged(cmd, log, env, detached=True).pid  # the job outlives the round (its row tracks it)


@task(name="apply-round", cache_policy=NO_CACHE, retries=0)
def apply_round(
    runner: list[str],
    db_path: str,
    d: Decision,
    cluster_path: str,
    runs_dir: str,
    launch: bool = True,
    train: TrainConfig | None = None,
    runner_args: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Record every choice as a transition and act on it; returns what was done, one dict per job.
    `runner`: the command that starts a job's runner (start_runner)."""
    done: list[dict[str, Any]] = []
    for r in d.rejections:
        transition(db_path, r.job_id, "failed", f"rejected: {r.reason}")
        done.append({"job_id": r.job_id, "action": "reject", "reason": r.reason})
    rows = {r["job_id"]: r for r in list_jobs(db_path).iter_rows(named=True)}
    for a in d.actions:
        alloc = alloc_text(a.placement.alloc)
        if a.kind == "start":
            if get_job(db_path, a.job_id)["state"] != "queued" or live_runners(db_path, a.job_id):
                continue  # admitted already (a round that died after admitting it): never a second runner
            transition(db_path, a.job_id, "running", f"{a.reason}; plan {a.plan}", alloc)
            set_job_run(db_path, a.job_id, base_allocation=alloc_text(a.base or a.placement.alloc))
            pid = (
                start_runner(runner, db_path, a.job_id, cluster_path, runs_dir, train or TrainConfig(), runner_args)
                if launch
                else None
            )
            if pid is not None:
                set_job_run(db_path, a.job_id, runner_pid=pid)
            done.append({"job_id": a.job_id, "action": "start", "allocation": alloc, "runner_pid": pid})
        else:  # grow / shrink / move: through resizing (checkpoint, reshard, relaunch) back to running
            request_resize(db_path, a.job_id, rows[a.job_id]["run_dir"], alloc, a.reason)
            done.append({"job_id": a.job_id, "action": a.kind, "allocation": alloc})
    for r in rows.values():
        if r["state"] == "cancelled" and r["run_dir"] and request_stop(r["run_dir"]):
            done.append({"job_id": r["job_id"], "action": "stop"})
    return done


def live_runners(db_path: str | Path, job_id: str) -> set[int]:
    """Live processes started as a runner of `job_id` (the tag in their environment; a runner does not
    pass it on to its children): found even when a round died before it recorded the pid."""
    return labelled(RUNNER_TAG, runner_label(db_path, job_id))


def runner_alive(pid: int | None, db_path: str | Path, job_id: str) -> bool:
    """Is `pid` a live runner of `job_id`: its environment holds the tag start_runner set (Linux /proc)?
    A pid reused by another process, or by a process of another job, is not."""
    if not pid:
        return False
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and f"{RUNNER_TAG}={runner_label(db_path, job_id)}".encode() in env


@task(name="reconcile-runners", cache_policy=NO_CACHE, retries=0)
def reconcile_runners(db_path: str) -> list[str]:
    """Running or resizing jobs whose runner is gone go back to the queue (re-admitted, they resume from
    their latest checkpoint): a scheduler killed between admitting a job and starting its runner, a
    runner killed with SIGKILL or a reboot lose no job. Returns the requeued ids."""
    out = []
    for state in ("running", "resizing"):
        for r in list_jobs(db_path, state).iter_rows(named=True):
            if runner_alive(r["runner_pid"], db_path, r["job_id"]):
                continue
            found = live_runners(db_path, r["job_id"])
            if found:  # started by a round that died before recording it: adopt it
                set_job_run(db_path, r["job_id"], runner_pid=min(found))
            else:
                step = checkpoint_step(r["run_dir"])
                transition(db_path, r["job_id"], "queued", f"its runner is gone; re-admission resumes from step {step}")
                out.append(r["job_id"])
    return out


@task(name="plan-for-allocation", cache_policy=NO_CACHE)
def plan_for_allocation(spec: ClusterSpec, row: dict, alloc: str, time_budget_s: float = SEARCH_BUDGET_S) -> Plan:
    """The job's best launchable plan on `alloc`, on ranks 0..n−1 (planner.search through PlannerSpeed).

    On several nodes, rank r runs on node r // per_node (torchrun's node-major numbering, one runner
    per node): a plan that would split one node's devices across rank blocks is refused."""
    job, a = job_from_row(row), parse_alloc(alloc)
    speed = PlannerSpeed.from_cluster(spec, time_budget_s=time_budget_s)
    if a.kind not in speed.templates:
        raise MeshplanError(f"job {job.job_id} allocation", alloc, f"the cluster has no {a.kind} nodes")
    plan = speed.best_plan(job, a)
    if plan is None:
        raise MeshplanError(f"job {job.job_id} allocation", alloc, f"no plan of {job.model} fits it")
    if a.num_nodes > 1:  # the allocation's cluster numbers its devices node by node
        node_ranks(plan, {d: d // a.per_node for d in range(a.count)}, a.per_node)  # refuses a split node
    plan, _ = relabel_for_runtime(plan)
    check_launchable(plan, a.count, speed.model_of(job))  # the search ranks launchable plans first
    return plan
