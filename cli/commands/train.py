"""`meshplan train`: launch torchrun training from a plan file or a stored plan, then report the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.app import app, check_id, db_path, load_settings, need_space, prefect_env, state
from cli.commands.model_options import model_option_flags
from cli.commands.run_options import run_option_flags, train_overrides
from planner.limits import MAX_RANKS, MAX_SECONDS, MAX_SLOWDOWN, MAX_STEPS

if TYPE_CHECKING:
    from planner.specs.config import RunConfig
    from planner.specs.model import ModelSpec


@app.command()
@run_option_flags()  # every other RunOptions field (lr, seed, grad_clip_norm, ...) is a generated flag
@model_option_flags()  # --model and a custom model's dimensions (cli/commands/model_options.py)
def train(
    plan: Annotated[Path | None, typer.Option("--plan", help="plan JSON file")] = None,
    plan_id: Annotated[str | None, typer.Option("--plan-id", help="id of a plan stored in the database")] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, max=MAX_STEPS, help="total optimizer steps (config train.steps)")
    ] = None,
    nproc_per_node: Annotated[
        int | None,
        typer.Option(
            "--nproc-per-node", min=1, max=MAX_RANKS, help="ranks on this node (default: the plan's devices ÷ --nnodes)"
        ),
    ] = None,
    nnodes: Annotated[int, typer.Option("--nnodes", min=1, max=MAX_RANKS, help="number of nodes")] = 1,
    node_rank: Annotated[
        int, typer.Option("--node-rank", min=0, max=MAX_RANKS, help="this node's index (0..nnodes-1)")
    ] = 0,
    rdzv_endpoint: Annotated[str | None, typer.Option("--rdzv-endpoint", help="HOST:PORT of node 0")] = None,
    data: Annotated[str | None, typer.Option("--data", help="synthetic | text (config train.data)")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="reuse a run id to resume its checkpoint")] = None,
    resume: Annotated[
        str, typer.Option("--resume", help="auto | none | a checkpoint or run folder (may be another plan's)")
    ] = "auto",
    fresh_start: Annotated[
        bool,
        typer.Option("--fresh-start", help="train from step 0 when every checkpoint of the run is unreadable"),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
    replan: Annotated[
        bool | None,
        typer.Option("--replan/--no-replan", help="watch for stragglers and re-plan live (default: one node)"),
    ] = None,
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help="cluster TOML for re-planning (default: CPU ranks)")
    ] = None,
    slow_rank: Annotated[
        int, typer.Option("--slow-rank", min=-1, max=MAX_RANKS, help="fault injection: rank to slow down")
    ] = -1,
    slow_factor: Annotated[
        float, typer.Option("--slow-factor", max=MAX_SLOWDOWN, help="fault injection: compute slowdown (2 = 2x)")
    ] = 1.0,
    slow_from_step: Annotated[
        int, typer.Option("--slow-from-step", min=0, max=MAX_STEPS, help="fault injection: first slow step")
    ] = 0,
    slow_link_rank: Annotated[
        int, typer.Option("--slow-link-rank", min=-1, max=MAX_RANKS, help="fault injection: rank whose sends lag")
    ] = -1,
    slow_link_s_per_mib: Annotated[
        float, typer.Option("--slow-link-s-per-mib", min=0, max=MAX_SECONDS, help="extra s per MiB sent")
    ] = 0.0,
    slow_link_s_per_msg: Annotated[
        float, typer.Option("--slow-link-s-per-msg", min=0, max=MAX_SECONDS, help="extra s per message")
    ] = 0.0,
    slow_link_from_step: Annotated[
        int,
        typer.Option("--slow-link-from-step", min=0, max=MAX_STEPS, help="fault injection: first step with slow sends"),
    ] = 0,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="run the plan's exact layout on local CPU ranks, model scaled down (default 2 steps)"
        ),
    ] = False,
    executor: Annotated[
        str, typer.Option("--executor", help="local: torchrun here | slurm: one sbatch job, one task a node")
    ] = "local",
    partition: Annotated[str | None, typer.Option("--partition", help="slurm: sbatch --partition")] = None,
    account: Annotated[str | None, typer.Option("--account", help="slurm: sbatch --account")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", help="slurm: sbatch --time, e.g. 01:00:00")] = None,
    nodelist: Annotated[str | None, typer.Option("--nodelist", help="slurm: sbatch --nodelist")] = None,
    constraint: Annotated[
        str | None, typer.Option("--constraint", help="slurm: sbatch --constraint (a node feature)")
    ] = None,
    gres: Annotated[str | None, typer.Option("--gres", help="slurm: sbatch --gres, e.g. gpu:a100:8")] = None,
    requeue: Annotated[
        bool | None, typer.Option("--requeue/--no-requeue", help="slurm: sbatch --requeue (default: the cluster's)")
    ] = None,
    model_spec: ModelSpec | None = None,
    run_options: dict[str, Any] | None = None,
) -> None:
    """Train under a plan with torchrun; telemetry goes to the database, predicted vs measured is reported.

    A plan made for a custom model trains it when given its dimensions again (`--model custom
    --layers ...` or `--model FILE.toml`, as for `meshplan plan`); they must be the plan's model's.
    --dry-run proves a plan launches before GPU hours are spent on it (flows/dryrun.py); with
    --executor slurm it prints the batch script instead (launcher/slurm.py), for submitting by hand."""
    extra, flags = train_overrides(run_options or {})  # the generated flags, as `--set train.<name>=`
    for field, value in (
        ("steps", steps),
        ("nproc_per_node", nproc_per_node),
        ("data", data),
        ("rdzv_endpoint", rdzv_endpoint),
    ):
        if value is not None:
            extra.append(f"train.{field}={json.dumps(value)}")
            flags[f"train.{field}"] = "--" + field.replace("_", "-")
    check_id("--run-id", run_id)
    cfg = load_settings(extra, flags)
    need_space(cfg)  # before a row, a folder or a rank: a full state folder is one line
    prefect_env(cfg)

    from planner.errors import MeshplanError

    if (plan is None) == (plan_id is None):
        raise MeshplanError("--plan/--plan-id", str(plan or plan_id), "give exactly one: --plan FILE or --plan-id ID")
    if plan is not None and not plan.is_file():
        raise MeshplanError("--plan", str(plan), "no such file; pass a plan JSON file")

    if executor not in ("local", "slurm"):
        raise MeshplanError("--executor", executor, "use local (torchrun here) or slurm (sbatch)")
    if dry_run and executor == "local":
        _dry_run(cfg, plan, plan_id, steps, run_id, as_json)
        return

    from flows.requests import TrainRequest, request_fields
    from flows.train import train_flow
    from planner.specs.faults import FaultSpec
    from planner.validation import parse

    faults = parse(
        FaultSpec,
        {
            "slow_rank": slow_rank,
            "slow_factor": slow_factor,
            "slow_from_step": slow_from_step,
            "link_rank": slow_link_rank,
            "link_s_per_mib": slow_link_s_per_mib,
            "link_s_per_msg": slow_link_s_per_msg,
            "link_from_step": slow_link_from_step,
        },
        "fault injection",
    )
    model_json = _model_file(cfg, plan, model_spec)
    request = parse(
        TrainRequest,
        request_fields(  # every [train] option reaches the ranks' RunSpec (planner/specs/runspec.py)
            cfg.train,
            {"resume": resume, "fresh_start": fresh_start, "faults": faults, "model_json": model_json},
            plan_path=str(plan) if plan else None,
            plan_id=plan_id,
            nnodes=nnodes,
            node_rank=node_rank,
            runs_dir=str(state(cfg).runs),
            replan=nnodes == 1 if replan is None else replan,
            replan_config=cfg.replan,
            cluster_path=str(cluster) if cluster else None,
            show_progress=not as_json,
            executor=executor,
            slurm={  # SlurmOptions (planner/specs/slurm.py), carried whole to launcher/slurm.py's script
                "partition": partition,
                "account": account,
                "time_limit": time_limit,
                "nodelist": nodelist,
                "constraint": constraint,
                "gres": gres,
                "requeue": requeue,
            },
        ),
        "train",
    )
    if plan is not None:  # at once, before Prefect's server starts (train_flow checks again, a stored plan too)
        from flows.train import check_launch_inputs
        from planner.inputs import read_input
        from planner.specs.plan import parse_plan_json

        check_launch_inputs(request, parse_plan_json(read_input(plan, "--plan", "plan"), plan.name).num_devices)
    if executor == "slurm" and request.replan and replan is None:
        request = request.model_copy(update={"replan": False})  # Slurm runs the nodes; no live monitor here
    if dry_run:  # --executor slurm: the batch script, the run folder made, nothing submitted
        from flows.train import write_batch_script

        script = write_batch_script(str(db_path(cfg)), request, run_id)
        typer.echo(script.read_text(), nl=False)
        typer.echo(f"# written to {script}; submit it with: sbatch {script}", err=True)
        return
    out = train_flow(str(db_path(cfg)), request, run_id)
    if as_json:
        typer.echo(out.model_dump_json(indent=2))
        return
    print_outcome(out)


def print_outcome(out) -> None:
    """The run's summary lines, with every fault the ranks survived: a handled fault is still news."""
    measured, predicted = out.measured_step_time_s, out.predicted_step_time_s
    on = f" (slurm job {out.slurm_job_id})" if out.slurm_job_id else ""
    typer.echo(f"run {out.run_id}{on} {out.status}: {len(out.losses)} steps in {out.run_dir}")
    for e in out.events:
        typer.echo(f"{e['kind']}: {e['message']}")
    if measured is not None:
        typer.echo(
            f"step time measured {measured * 1e3:.1f} ms"
            + (f", predicted {predicted * 1e3:.1f} ms" if predicted else "")
        )
    for d in out.decisions:
        typer.echo(
            f"re-plan at step {d['step']}: {d['chosen_action']}{' (switched)' if d['acted'] else ''} — {d['reason']}"
        )
    losses = [v for v in out.losses if v is not None]
    if losses:
        typer.echo(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if out.val_losses:
        typer.echo("validation: " + ", ".join(f"step {s} val_loss {v:.4f}" for s, v in out.val_losses))


def _dry_run(cfg, plan: Path | None, plan_id: str | None, steps: int | None, run_id: str | None, as_json: bool) -> None:
    from flows.dryrun import dry_run_flow, refuse_unlaunchable
    from flows.requests import TrainRequest
    from planner.specs.runspec import RunSpec

    if plan is not None:
        refuse_unlaunchable(plan)  # at once, before Prefect starts: the flow checks again (a stored plan too)
    t = cfg.train
    request = TrainRequest(
        plan_path=str(plan) if plan else None,
        plan_id=plan_id,
        # a few steps prove the layout; train.steps is for training
        spec=RunSpec(steps=steps or 2, collective_timeout_s=t.collective_timeout_s),
        runs_dir=str(state(cfg).runs),
        timeout_s=t.timeout_s,
        show_progress=not as_json,
    )
    try:
        out = dry_run_flow(db_path=str(db_path(cfg)), request=request, run_id=run_id)
    except RuntimeError as exc:  # the ranks failed: the launch problem and its reason (torchrun's log tail)
        typer.echo(f"dry run failed: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(out.model_dump_json(indent=2))
        return
    typer.echo(f"dry run {out.run_id} passed in {out.wall_s:.1f} s ({out.run_dir}):")
    for line in out.lines:
        typer.echo(f"  {line}")


def _model_file(cfg: RunConfig, plan: Path | None, spec: ModelSpec | None) -> str | None:
    """The ModelSpec JSON the ranks build, written to the state folder, when --model names dimensions
    (None: the plan's preset). Checked against a plan file's model now, naming --model."""
    from cli.commands.model_options import model_for_plan
    from planner.specs.model import PRESETS
    from planner.specs.plan import parse_plan_json

    if spec is None:
        return None
    if plan is not None:
        from planner.inputs import read_input

        model_for_plan(parse_plan_json(read_input(plan, "--plan", "plan"), origin=plan.name), spec)
    if PRESETS.get(spec.name) == spec:
        return None
    path = state(cfg).model_file(spec.fingerprint())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(spec.model_dump_json(indent=2))
    return str(path)
