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

from datetime import UTC, datetime
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact

import rundir
from flows.outcomes import DryRunOutcome
from launcher.launch import Launch
from planner.errors import MeshplanError
from planner.inputs import read_input
from planner.report.dryrun import dry_run_report
from planner.runtime import check_launchable
from planner.specs.dryrun import dry_run_model, dry_run_plan
from planner.specs.model import ModelSpec, get_model
from planner.specs.plan import Plan, check_plan_against, parse_plan_json
from planner.specs.runspec import RunSpec
from rundir import StateDir
from storage.runs import step_metrics
from tasks.train import close_run, ingest_telemetry, launch_training, load_stored_plan, open_generation, record_run


def read_plan_file(plan_path: str) -> Plan:
    text = read_input(plan_path, "--plan", "plan", "e.g. from `meshplan plan --out`")
    return parse_plan_json(text, origin=Path(plan_path).name)


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
def dry_run_flow(
    db_path: str,
    plan_path: str | None = None,
    plan_id: str | None = None,
    model: ModelSpec | None = None,
    steps: int = 2,
    run_id: str | None = None,
    runs_dir: str | None = None,
    timeout_s: float = 600.0,
    collective_timeout_s: float = 120.0,
    show_progress: bool = False,
) -> DryRunOutcome:
    """Dry-run a plan (file or stored id) for `steps` steps; returns the report (planner/report/dryrun.py)
    with run_id, run_dir and wall_s. `model` is the plan's model (default: its preset)."""
    if (plan_path is None) == (plan_id is None):
        raise MeshplanError(
            "--plan/--plan-id", plan_path or plan_id, "give exactly one: a plan file or a stored plan id"
        )
    if steps < 1:
        raise MeshplanError("--steps", steps, "a dry run takes at least one step")
    plan = read_plan_file(plan_path) if plan_path else load_stored_plan(db_path, plan_id)
    real = check_real_plan(plan, model)
    tiny = dry_run_model(real, plan)
    dry = dry_run_plan(plan, tiny)
    check_launchable(dry, dry.num_devices, tiny)  # scaling keeps the layout launchable (planner/specs/dryrun.py)

    run_id = run_id or f"dry-{plan.fingerprint()[:8]}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    run_dir = StateDir.of_db(db_path, runs_dir).run(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.plan_path(run_dir).write_text(dry.to_json())
    rundir.model_path(run_dir).write_text(tiny.model_dump_json(indent=2))
    record_run(db_path, run_id, dry, steps, str(run_dir))
    generation = open_generation(db_path, run_id, str(run_dir))  # every launch of a run folder is fenced
    launch = Launch(
        plan_path=str(rundir.plan_path(run_dir)),
        run_dir=str(run_dir),
        run_id=run_id,
        spec=RunSpec(
            steps=steps,
            model_json=str(rundir.model_path(run_dir)),
            data="synthetic",
            checkpoint_every=0,  # one checkpoint, after the last step: the layout's save path runs too
            resume="none",
            collective_timeout_s=collective_timeout_s,
        ),
        nproc_per_node=dry.num_devices,
        generation=generation,
    )
    print(f"dry run {run_id}: {dry.num_devices} CPU ranks, {steps} steps of plan {plan.fingerprint()}")
    state = launch_training(launch, timeout_s, show_progress, return_state=True)
    ingest_telemetry(db_path, run_id, str(run_dir))
    launched = state.is_completed()
    summary = close_run(
        db_path, run_id, "completed" if launched else "failed", None if launched else str(state.message)
    )
    if not launched:
        state.result()  # re-raises the launch error (torchrun's exit code and its log's tail)
    report = dry_run_report(plan, tiny, step_metrics(db_path, run_id).to_dicts(), steps, [r["loss"] for r in summary])
    text = "\n".join(report.lines())
    create_markdown_artifact(key="dry-run-report", markdown=f"```\n{text}\n```", description=f"dry run {run_id}")
    if not report.ok:
        close_run(db_path, run_id, "failed", "; ".join(report.problems))
        raise RuntimeError(f"dry run {run_id} launched but did not run the plan's layout:\n{text}")
    print(text)
    wall_s = state.result()["wall_s"]
    return DryRunOutcome(**report.as_dict(), lines=report.lines(), run_id=run_id, run_dir=str(run_dir), wall_s=wall_s)
