"""`meshplan run`: the README's main job — discover, profile, plan and train on this machine."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.app import app, db_path, load_settings, prefect_env, state
from planner.limits import MAX_STEPS


@app.command()
def run(
    model: Annotated[str | None, typer.Option("--model", help="model preset (default: config `model`, tiny)")] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, max=MAX_STEPS, help="training steps (default: config train.steps)")
    ] = None,
    ranks: Annotated[
        int | None, typer.Option("--ranks", min=1, max=64, help="CPU ranks to use when no GPU is present")
    ] = None,
) -> None:
    """Run the whole pipeline on this machine and print a summary of what each stage did."""
    import json

    extra = [f"model={json.dumps(model)}"] if model else []
    extra += [f"train.steps={steps}"] if steps else []
    extra += [f"discover.num_ranks={ranks}"] if ranks else []
    cfg = load_settings(extra, {"model": "--model", "train.steps": "--steps", "discover.num_ranks": "--ranks"})
    prefect_env(cfg)
    from rich.console import Console
    from rich.table import Table

    from flows.pipeline import pipeline_flow

    path = db_path(cfg)
    runs = state(cfg).runs
    s = pipeline_flow(str(path), cfg, str(runs), show_progress=True)
    hw, prof, plan, run_ = s.snapshot, s.profile, s.plan, s.run
    t = Table(title=f"meshplan run: {cfg.model} on this machine ({hw.num_devices} devices)")
    t.add_column("stage")
    t.add_column("result")
    t.add_row("discover", f"snapshot {hw.fingerprint} ({'reused' if hw.reused else 'measured now'})")
    t.add_row("profile", f"{prof.measured} measured, {prof.reused} reused, {prof.estimated} estimated")
    t.add_row(
        "plan",
        f"{plan.best_plan_id}{' (cached search)' if plan.cached else ''}: "
        f"predicted {plan.step_time_s * 1e3:.1f} ms/step",
    )
    measured = run_.measured_step_time_s
    t.add_row(
        "train",
        f"run {run_.run_id} {run_.status}: measured {measured * 1e3:.1f} ms/step"
        if measured
        else f"run {run_.run_id} {run_.status}",
    )
    t.add_row("loss", f"{s.first_loss:.3f} → {s.last_loss:.3f}" if s.first_loss is not None else "-")
    Console().print(t)
    print(
        f"database: {path}\nrun folder: {run_.run_dir}\nplan: meshplan --state-dir {cfg.state.dir} "
        f"db \"select * from plans where fingerprint = '{plan.best_plan_id}'\"\n"
        f"UI: meshplan --state-dir {cfg.state.dir} ui   (then run again to see it there)"
    )
