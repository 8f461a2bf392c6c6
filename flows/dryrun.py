"""`dry_run_flow`: prove a plan launches before spending GPU hours on it.

`meshplan train --plan plan.json --dry-run` runs this: the plan's exact layout (ranks, per-stage
meshes, stage splits, schedule, batch shares and micro-batch counts) for a few steps on local CPU
ranks (gloo, torchrun through launcher.launch, one thread per rank), with the model scaled down
(planner/specs/dryrun.py). Ranks beyond the local cores run slowly but correctly.

1. The plan is checked against the runtime contract (planner/runtime.py) for the REAL model first:
   a layout the runtime refuses fails here with its reason, before anything is launched.
2. The scaled plan and model go into the run folder; the run is recorded like any other (`runs`,
   telemetry ingested into `step_metrics`), its id prefixed `dry-`.
3. The ranks' telemetry is checked against the rank map (planner/report/dryrun.py): every step on
   every rank, each rank in its slot. The flow fails with what went wrong otherwise.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.outcomes import DryRunOutcome
from flows.requests import TrainRequest
from flows.train import launch_for, new_run_id, read_plan_file, request_model, request_plan, run_launch
from planner.report.dryrun import dry_run_report
from planner.runtime import check_launchable
from planner.specs.dryrun import dry_run_model, dry_run_plan
from planner.specs.model import ModelSpec, get_model
from planner.specs.plan import Plan, check_plan_against
from planner.specs.runspec import RunSpec
from storage.runs import step_metrics
from tasks.train import close_run

# what a dry run's ranks do whatever the request's options: synthetic data, from scratch, one
# checkpoint after the last step
DRY_RUN_OPTIONS = {"data": "synthetic", "checkpoint_every": 0, "resume": "none"}


def check_real_plan(plan: Plan, model: ModelSpec | None = None) -> ModelSpec:
    """The plan's model, once the plan covers its layers and the runtime contract accepts the layout for
    it (planner/runtime.py): a MeshplanError with the first reason otherwise, before anything launches."""
    real = model or get_model(plan.model)
    check_plan_against(plan, real.num_layers, 1 + max(d for s in plan.stages for d in s.device_ids))
    check_launchable(plan, model=real)
    return real


def refuse_unlaunchable(plan_path: str | Path) -> None:
    """`check_real_plan` of a plan file (the CLI's early answer)."""
    check_real_plan(read_plan_file(str(plan_path)))


@flow(name="dry-run", log_prints=True)
def dry_run_flow(db_path: str, request: TrainRequest, run_id: str | None = None) -> DryRunOutcome:
    """Dry-run the request's plan (file or stored id) for `request.spec.steps` steps, through
    train_flow's own parts (flows/train.py: `launch_for`, `run_launch`) with the plan and model scaled
    down; returns the report (planner/report/dryrun.py) with run_id, run_dir and wall_s.

    Of the request: the plan, its model (`request_model`), `timeout_s`, `runs_dir`, `show_progress`,
    and the spec's `steps` and `collective_timeout_s`; the ranks run synthetic data from scratch, one
    checkpoint after the last step (the layout's save path runs too)."""
    plan = request_plan(db_path, request)
    real = check_real_plan(plan, request_model(request, plan))
    tiny = dry_run_model(real, plan)
    dry = dry_run_plan(plan, tiny)
    check_launchable(dry, dry.num_devices, tiny)  # scaling keeps the layout launchable (planner/specs/dryrun.py)
    steps = request.spec.steps
    spec = RunSpec(steps=steps, collective_timeout_s=request.spec.collective_timeout_s, **DRY_RUN_OPTIONS)
    r = request.model_copy(update={"spec": spec, "nproc_per_node": None, "nnodes": 1, "replan": False})
    # CPU ranks whatever the plan's devices: this machine's GPUs are not counted
    launch = launch_for(db_path, r, dry, tiny, run_id or new_run_id(plan, "dry-"), check_machine=False)
    print(f"dry run {launch.run_id}: {dry.num_devices} CPU ranks, {steps} steps of plan {plan.fingerprint()}")
    out = run_launch(db_path, r, dry, tiny, launch)  # a failed launch raises its error (torchrun's log tail)
    run_id = launch.run_id
    report = dry_run_report(plan, tiny, step_metrics(db_path, run_id).to_dicts(), steps, out.losses)
    text = "\n".join(report.lines())
    create_markdown_artifact(key="dry-run-report", markdown=f"```\n{text}\n```", description=f"dry run {run_id}")
    if not report.ok:
        close_run(db_path, run_id, "failed", "; ".join(report.problems))
        raise RuntimeError(f"dry run {run_id} launched but did not run the plan's layout:\n{text}")
    print(text)
    return DryRunOutcome(
        **report.as_dict(), lines=report.lines(), run_id=run_id, run_dir=out.run_dir, wall_s=out.launch_wall_s
    )
