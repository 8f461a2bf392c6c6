"""Stage 4 flow: launch real distributed training from a plan, ingest its telemetry, compare to the plan.

1. The plan comes from a JSON file or from the database (`plans`, written by the search stage).
2. It is copied into the run folder (`<state>/runs/<run_id>/plan.json`) — the ranks read that copy.
3. torchrun runs worker.train on `nproc_per_node` × `nnodes` ranks (resuming the run folder's latest
   checkpoint if there is one, or `resume=<checkpoint or run folder>` from another plan).
4. Telemetry is ingested whether the run succeeded or not (a crashed run's steps are still data),
   the run is closed, and predicted vs measured step time is published as a markdown artifact.
With several nodes, run the flow on every node (each with its node_rank) against a run folder on
shared storage; every node's database then holds all ranks' telemetry. Nodes that are all this
machine (`local_nodes`: a CPU "cluster" of simulated nodes) are launched by one flow, one runner each.
"""

from __future__ import annotations

import dataclasses
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

import rundir
from flows.outcomes import TrainOutcome
from flows.replan import decisions_markdown, load_cluster, monitor_config
from flows.requests import TrainRequest
from launcher.control import read_control
from launcher.host import local_capacity
from launcher.launch import Launch, log_tail
from launcher.slurm import sbatch_script
from planner.errors import MeshplanError
from planner.inputs import parse_json, read_input
from planner.runtime import machine_problem, rank_plan
from planner.specs.dataset import check_fits, is_prepared
from planner.specs.model import PRESETS, ModelSpec, get_model
from planner.specs.plan import Plan, check_plan_against, parse_plan_json
from planner.specs.runspec import RunSpec
from planner.validation import parse
from rundir import StateDir
from storage.dataset import read_manifest
from storage.hf import check_weights
from storage.pricing import machine_calibration
from storage.runs import eval_metrics, finish_run, load_run, resume_records
from tasks.replan import supervise_training
from tasks.train import (
    close_run,
    ingest_telemetry,
    launch_training,
    load_stored_plan,
    open_generation,
    record_events,
    record_run,
)


def read_plan_file(plan_path: str) -> Plan:
    text = read_input(plan_path, "--plan", "plan", "e.g. from `meshplan plan --out`")
    return parse_plan_json(text, origin=Path(plan_path).name)


def request_model(r: TrainRequest, plan: Plan) -> ModelSpec:
    """The model the ranks build: `model_json`'s dimensions, else the preset `model` or the plan's.

    Dimensions must be the plan's model's (the fingerprint the search recorded), and a plan made for
    a custom model needs its dimensions: a plan is priced for one model, and the ranks would
    otherwise build another (or fail to find a preset of that name on every rank)."""
    recorded = plan.provenance.model_fingerprint
    run = r.spec
    if run.model_json is None:
        name = run.model or plan.model
        if not run.model and name not in PRESETS:
            raise MeshplanError(
                "model_json",
                None,
                f"the plan was made for a custom model ({name!r}); pass its ModelSpec JSON file "
                "(meshplan train: --model custom --layers N --hidden H --heads A ... or --model FILE.toml)",
            )
        spec = get_model(name)
        if recorded and not run.model and spec.fingerprint() != recorded:  # a model file named like a preset
            raise MeshplanError(
                "model_json", None, f"the plan's model {name!r} is not the preset's dimensions; pass its ModelSpec JSON"
            )
        return spec
    spec = _read_spec(Path(run.model_json))
    if recorded and spec.fingerprint() != recorded:
        raise MeshplanError(
            "model_json",
            run.model_json,
            f"these dimensions (fingerprint {spec.fingerprint()}) are not the plan's model's ({recorded}); "
            f"pass the model the plan was made for ({plan.model})",
        )
    return spec


def _read_spec(path: Path) -> ModelSpec:
    data = parse_json(read_input(path, "model_json", "model"), path.name, "pass a ModelSpec JSON file")
    return parse(ModelSpec, data, path.name)


def measured_step_time_s(summary: list[dict[str, Any]]) -> float | None:
    """Median over steps of the slowest rank's step time, skipping the first (warm-up) step if possible."""
    times = [r["step_time_s"] for r in sorted(summary, key=lambda r: r["step"])]
    steady = times[1:] or times
    return statistics.median(steady) if steady else None


def report_markdown(
    run_id: str, plan: Plan, summary: list[dict[str, Any]], status: str, events: list[dict[str, Any]] = ()
) -> str:
    measured = measured_step_time_s(summary)
    predicted = plan.predicted.step_time_s if plan.predicted is not None else None
    ratio = f"{measured / predicted:.2f}×" if measured and predicted else "n/a"
    fmt = lambda v: f"{v * 1e3:.1f} ms" if v is not None else "n/a"  # noqa: E731
    lines = [
        f"# Training run `{run_id}` — {status}",
        f"plan `{plan.fingerprint()}`: pp={plan.pp} dp={plan.dp} tp={plan.stages[0].tp} schedule={plan.schedule} "
        f"global batch {plan.global_batch_size} (shares {list(plan.batch_shares)}), model {plan.model}",
        "",
        "| step time | value |",
        "|---|---|",
        f"| predicted | {fmt(predicted)} |",
        f"| measured (median, slowest rank) | {fmt(measured)} |",
        f"| measured / predicted | {ratio} |",
        "",
        *(["## Faults handled", *(f"- {e['kind']}: {e['message']}" for e in events), ""] if events else []),
        "| step | step time | max compute | max comm wait | loss | tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in summary:
        loss = f"{r['loss']:.4f}" if r["loss"] is not None else "-"
        tps = f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] is not None else "-"
        lines.append(
            f"| {r['step']} | {fmt(r['step_time_s'])} | {fmt(r['max_compute_s'])} | "
            f"{fmt(r['max_comm_wait_s'])} | {loss} | {tps} |"
        )
    return "\n".join(lines)


def check_launch_inputs(r: TrainRequest, world_size: int) -> None:
    """What the ranks would refuse only after the run row and folder exist, refused first: a node
    rank beyond the nodes, a fault on a rank the plan does not have, a checkpoint that is not there."""
    if r.node_rank >= r.nnodes:
        raise MeshplanError("--node-rank", r.node_rank, f"the launch has {r.nnodes} node(s): 0..{r.nnodes - 1}")
    faults = r.spec.faults
    for name, flag in (("slow_rank", "--slow-rank"), ("link_rank", "--slow-link-rank"), ("kill_rank", "kill_rank")):
        rank = getattr(faults, name)
        if rank >= world_size:
            raise MeshplanError(flag, rank, f"the plan has {world_size} rank(s): 0..{world_size - 1}")
    resume = r.spec.resume
    if resume not in ("auto", "none", "fresh-start") and not Path(resume).exists():
        raise MeshplanError(
            "--resume", resume, "no such checkpoint or run folder; pass one, or auto (this run's) or none"
        )


def check_run_files(run: RunSpec, spec: ModelSpec, plan: Plan) -> RunSpec:
    """The files a run reads (`--data DIR`, `--init hf:DIR`) checked against the model before any rank
    starts, as absolute paths (the ranks may start elsewhere): the manifest, the tokenizer's vocabulary
    against the model's, a validation split when `--eval-every` asks for one, the weights' config and
    every tensor's shape."""
    update: dict[str, str] = {}
    if is_prepared(run.data):
        folder = Path(run.data).expanduser().resolve()
        manifest = read_manifest(folder)
        check_fits(manifest, spec.vocab_size)
        if manifest.train.tokens <= plan.seq_len + 1:
            raise MeshplanError(
                "--data", run.data, f"holds {manifest.train.tokens} training tokens, fewer than one sequence"
            )
        if run.eval_every and manifest.val.tokens <= plan.seq_len + 1:
            raise MeshplanError(
                "--eval-every",
                run.eval_every,
                f"{run.data} has no validation split of one sequence; prepare it with --val-fraction",
            )
        update["data"] = str(folder)
    elif run.eval_every:
        raise MeshplanError(
            "--eval-every", run.eval_every, "validation reads a prepared --data folder's held-out split"
        )
    if run.init:
        update["init"] = check_weights(run.init, spec)
    return run.model_copy(update=update)


def request_plan(db_path: str, r: TrainRequest) -> Plan:
    """The plan a request names: a plan file or a stored plan id, exactly one."""
    if (r.plan_path is None) == (r.plan_id is None):
        raise MeshplanError(
            "--plan/--plan-id", r.plan_path or r.plan_id, "give exactly one: a plan file or a stored plan id"
        )
    return read_plan_file(r.plan_path) if r.plan_path else load_stored_plan(db_path, r.plan_id)


def new_run_id(plan: Plan, prefix: str = "") -> str:
    """A run's id when none is given: the plan's fingerprint and the time."""
    return f"{prefix}{plan.fingerprint()[:8]}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


def prepare_launch(
    db_path: str, request: TrainRequest, run_id: str | None = None, check_files: bool = True
) -> tuple[Plan, ModelSpec, Launch]:
    """Check the request against its plan and model, make the run folder with the plan the ranks read,
    and build the launch: what `train_flow` runs, and what `--executor slurm --dry-run` prints (which
    does not check `--data`/`--init` folders: the batch script reads them on the cluster's nodes)."""
    plan = request_plan(db_path, request)
    spec = request_model(request, plan)
    if any(d >= plan.num_devices for s in plan.stages for d in s.device_ids):
        # a plan on some devices of a bigger (discovered) cluster, e.g. [0, 2, 3] of 4: its ranks are
        # 0..n-1 in the runtime's rank map whatever the ids, so it launches on n ranks
        plan = rank_plan(plan)
    return plan, spec, launch_for(db_path, request, plan, spec, run_id, check_files=check_files)


def launch_for(
    db_path: str,
    request: TrainRequest,
    plan: Plan,
    spec: ModelSpec,
    run_id: str | None = None,
    check_files: bool = True,
    check_machine: bool = True,
) -> Launch:
    """The launch of `plan` on `spec` as `request` asks: checked (its files, its nodes, this machine
    unless `check_machine` is off: a dry run's CPU ranks), then the run folder made with the plan,
    the model and the RunSpec the ranks read. `train_flow` and `dry_run_flow` (its scaled plan and
    model) both launch through it."""
    r = request
    run_spec = check_run_files(r.spec, spec, plan) if check_files else r.spec
    check_plan_against(plan, spec.num_layers, plan.num_devices)  # fail before launching
    nproc = r.nproc_per_node or max(1, plan.num_devices // r.nnodes)  # None: the plan's devices per node
    if nproc * r.nnodes != plan.num_devices:
        n = plan.num_devices
        shapes = [f"--nnodes {k} --nproc-per-node {n // k}" for k in range(1, n + 1) if n % k == 0][:4]
        raise MeshplanError(
            "--nproc-per-node" if r.nproc_per_node else "--nnodes",
            r.nproc_per_node or r.nnodes,
            f"the plan uses {n} devices, so nnodes × nproc_per_node must be {n}: pass {' or '.join(shapes)}"
            f" (or re-plan with `meshplan plan` for {r.nnodes} node(s) of {nproc})",
        )
    if r.executor == "local" and check_machine:  # a plan this machine cannot hold is refused before any rank starts
        ranks_here = nproc * (r.nnodes if r.local_nodes else 1)
        why = machine_problem(plan, spec, ranks_here, *local_capacity())
        if why:
            raise MeshplanError(
                "--plan",
                r.plan_path or r.plan_id,
                f"{why}; check its layout on this machine with `meshplan train --dry-run` (the model scaled down)",
            )
    check_launch_inputs(r, plan.num_devices)  # refused here: no run row, no run folder
    run_id = run_id or new_run_id(plan)
    run_dir = StateDir.of_db(db_path, r.runs_dir).run(run_id)  # the id checked: it cannot leave runs/
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.plan_path(run_dir).write_text(plan.to_json())
    by_name = run_spec.model or plan.model  # what the ranks build without a model file
    if r.spec.model_json:
        model_json: str | None = str(Path(r.spec.model_json).resolve())  # the ranks may start elsewhere
    elif by_name in PRESETS and get_model(by_name).fingerprint() == spec.fingerprint():
        model_json = None
    else:  # dimensions no preset has (a dry run's scaled model): the ranks read the run folder's copy
        rundir.model_path(run_dir).write_text(spec.model_dump_json(indent=2))
        model_json = str(rundir.model_path(run_dir))
    if not rundir.model_path(run_dir).exists():  # a job's runner wrote its custom model there already
        rundir.model_path(run_dir).write_text(spec.model_dump_json(indent=2))  # what export-weights rebuilds
    rundir.spec_path(run_dir).write_text(run_spec.model_dump_json(indent=2))

    return Launch(
        plan_path=str(rundir.plan_path(run_dir)),
        run_dir=str(run_dir),
        run_id=run_id,
        spec=run_spec.model_copy(update={"model_json": model_json}),
        nproc_per_node=nproc,
        nnodes=r.nnodes,
        node_rank=r.node_rank,
        rdzv_endpoint=r.rdzv_endpoint,
        local_nodes=r.local_nodes,
        max_restarts=r.max_restarts,
        # a message an earlier launch of this run folder already obeyed (a checkpoint_exit that
        # ended it for a resize) is not this launch's order; a caller that read the job's state
        # passes the version it had seen before, so a newer order is obeyed (flows/job.py)
        control_from_version=(read_control(run_dir) or {}).get("version", 0)
        if r.control_from_version is None
        else r.control_from_version,
    )


def write_batch_script(db_path: str, request: TrainRequest, run_id: str | None = None) -> Path:
    """`meshplan train --executor slurm --dry-run`: make the run folder and write the sbatch script a
    submission would use (launcher/slurm.py) into it, submitting nothing; the script's path."""
    _, _, launch = prepare_launch(db_path, request, run_id, check_files=False)
    script = rundir.sbatch_path(Path(launch.run_dir))
    script.write_text(sbatch_script(launch, request.slurm))
    return script


@flow(name="train", log_prints=True)
def train_flow(db_path: str, request: TrainRequest, run_id: str | None = None) -> TrainOutcome:
    """Train under a plan (`request`: flows/requests.py); `run_id` names the run folder (reuse one to
    resume its checkpoint; None = the plan's fingerprint and the time).

    `request.replan` runs the job under the straggler monitor (launcher/supervise.py): decisions go to
    `replan_decisions` and the `replan-report` artifact, and are acted on (rebalance in place,
    relayout by checkpoint → relaunch), with `request.replan_config`'s settings. `request.spec.faults` are
    injected into the ranks (planner/specs/faults.py). `show_progress` shows steps done / total, loss,
    step time, tokens/s and ETA while the job runs (launcher/progress.py): a rich bar on a terminal,
    else a line on stdout every few steps. `control_from_version`: control.json messages up to this
    version are not this launch's (default: every message already in the run folder).
    """
    plan, spec, launch = prepare_launch(db_path, request, run_id)
    return run_launch(db_path, request, plan, spec, launch)


def run_launch(db_path: str, r: TrainRequest, plan: Plan, spec: ModelSpec, launch: Launch) -> TrainOutcome:
    """Record the run, fence its earlier launches, launch (supervised or not), ingest its telemetry and
    close its row — closed `killed`/`failed` when interrupted, never left running. `train_flow` and
    `dry_run_flow` run every launch through it."""
    run_id, run_dir = launch.run_id, Path(launch.run_dir)
    record_run(db_path, run_id, plan, r.spec.steps, str(run_dir))
    try:
        return _launch_and_close(db_path, r, plan, spec, launch, run_id, run_dir)
    except BaseException as exc:  # interrupted, killed by SIGTERM, the disk full: the row is closed, never left running
        close_interrupted(db_path, run_id, exc)
        raise


def close_interrupted(db_path: str, run_id: str, exc: BaseException) -> None:
    """Close a run row still `running` after its launch ended by `exc`: `killed` when the command was
    interrupted (Ctrl-C, SIGTERM), else `failed` with the exception's first line. Never raises: a full
    disk may refuse this write too, and the original error is what the user must see."""
    try:
        row = load_run(db_path, run_id)
        if row is None or row["status"] != "running":
            return
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            finish_run(db_path, run_id, "killed", "interrupted (Ctrl-C or SIGTERM); its processes were stopped")
        else:
            finish_run(
                db_path,
                run_id,
                "failed",
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:2000],
            )
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


def _launch_and_close(
    db_path: str, r: TrainRequest, plan: Plan, spec: ModelSpec, launch: Launch, run_id: str, run_dir: Path
) -> TrainOutcome:
    """train_flow after its run row exists: fence, launch (supervised or not), ingest, close the row."""
    # before any rank starts: every earlier launch of this run folder fenced off (tasks/train.py)
    launch = dataclasses.replace(launch, generation=open_generation(db_path, run_id, str(run_dir)))
    first_record = len(resume_records(run_dir))  # lines of earlier launches of this run folder are not this one's
    poll_s = r.replan_config.poll_s
    if r.executor == "slurm" and (r.replan or r.local_nodes):
        raise MeshplanError(
            "--executor", "slurm", "Slurm runs the plan's nodes itself; drop --replan and local nodes (use --no-replan)"
        )
    if r.replan:
        if r.nnodes != 1:
            raise MeshplanError(
                "--replan", r.nnodes, "live re-planning supervises one node's torchrun; use --no-replan"
            )
        cluster, synthetic = load_cluster(r.cluster_path, plan.num_devices)
        # decisions price this machine's CPU ranks with discovery's corrections, as the search does
        calibration = machine_calibration(db_path, spec) if synthetic else None
        state = supervise_training(
            db_path,
            run_id,
            launch,
            plan,
            spec,
            cluster,
            None,
            monitor_config(**r.replan_config.model_dump(exclude={"poll_s"})),
            r.timeout_s,
            True,
            poll_s,
            synthetic,
            r.show_progress,
            calibration,
            return_state=True,
        )
    else:
        slurm = r.slurm if r.executor == "slurm" else None  # whole, to launcher/slurm.py's batch script
        state = launch_training(launch, r.timeout_s, r.show_progress, poll_s, slurm, db_path, return_state=True)
    supervised = state.result(raise_on_failure=False) if r.replan and state.is_completed() else None
    job_failed = supervised is not None and supervised.returncode != 0
    if supervised is not None and supervised.plan.fingerprint() != plan.fingerprint():
        record_run(db_path, run_id, supervised.plan, r.spec.steps, str(run_dir))  # the plan it finished on
    rows = ingest_telemetry(db_path, run_id, str(run_dir))
    events = record_events(db_path, run_id, str(run_dir), first_record)
    stopped = next((e for e in events if e["kind"] == "error"), None)  # the ranks refused or diverged
    refusal = stopped["message"] if stopped else None
    events = [e for e in events if e["kind"] != "error"]
    for e in events:  # WARNING: kept by the Prefect run's log at the CLI's log level, shown live on stderr
        get_run_logger().warning(f"run {run_id}: {e['kind']}: {e['message']}")
    status = "completed" if state.is_completed() and not job_failed else "failed"
    message = f"torchrun exited {supervised.returncode}" if job_failed else str(state.message)[:2000]
    if refusal is not None:
        message = refusal
    summary = close_run(db_path, run_id, status, None if status == "completed" else message)
    create_markdown_artifact(
        key="train-report",
        markdown=report_markdown(run_id, plan, summary, status, events),
        description=f"training run {run_id}: predicted vs measured step time",
    )
    if supervised is not None:
        create_markdown_artifact(
            key="replan-report",
            markdown=decisions_markdown(run_id, supervised.decisions),
            description=f"re-planning decisions of run {run_id}",
        )
    if stopped is not None:  # the ranks refused to start or stopped (diverged): one line, no traceback
        if stopped.get("field"):
            raise MeshplanError(stopped["field"], stopped.get("value"), stopped.get("fix", ""))
        raise MeshplanError("checkpoints", str(rundir.checkpoints_dir(run_dir)), refusal.split(": ", 1)[-1])
    if job_failed:
        log = rundir.node_log(run_dir)
        raise RuntimeError(f"torchrun exited {supervised.returncode} ({log}):\n{log_tail(log)}")
    if status != "completed":
        state.result()  # re-raises the launch error: the flow run fails with it
    measured = measured_step_time_s(summary)
    launched = state.result() if not r.replan else {}
    slurm_job = launched.get("slurm_job_id") if isinstance(launched, dict) else None
    on = f" (slurm job {slurm_job})" if slurm_job else ""
    print(f"run {run_id}{on}: {len(summary)} steps, measured step {measured}, telemetry rows {rows}")
    return TrainOutcome(
        run_id=run_id,
        run_dir=str(run_dir),
        status=status,
        num_telemetry_rows=rows,
        measured_step_time_s=measured,
        predicted_step_time_s=plan.predicted.step_time_s if plan.predicted is not None else None,
        losses=[row["loss"] for row in summary],
        decisions=supervised.decisions if supervised else [],
        final_detections=supervised.final_detections if supervised else [],
        segments=supervised.segments if supervised else [],
        final_plan_json=supervised.plan.to_json() if supervised else plan.to_json(),
        events=events,
        slurm_job_id=slurm_job,
        launch_wall_s=launched.get("wall_s") if isinstance(launched, dict) else None,
        val_losses=[(int(r["step"]), float(r["val_loss"])) for r in eval_metrics(db_path, run_id).to_dicts()],
    )
