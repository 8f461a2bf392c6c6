"""`meshplan export`: a plan as a torchtitan job-config fragment or Megatron-LM arguments.

The text goes to stdout (redirect it into a file); what the format cannot express goes to stderr
as warnings (planner/report/export.py), so a pipe carries only the config.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import app
from cli.commands.calibrate import RuntimeOpt, price_for_runtime, runtime_name
from cli.commands.model_options import model_for_plan, model_option_flags

if TYPE_CHECKING:
    from planner.specs.model import ModelSpec

FORMATS = ("torchtitan", "megatron")


@app.command()
@model_option_flags()
def export(
    plan_file: Annotated[Path, typer.Argument(help="plan JSON file (e.g. from `meshplan plan --out`)")],
    fmt: Annotated[str, typer.Option("--format", help="torchtitan | megatron")] = "torchtitan",
    model_spec: ModelSpec | None = None,
    cluster: Annotated[
        Path | None,
        typer.Option("--cluster", help="cluster TOML file to price on (default: this machine, if discovered)"),
    ] = None,
    runtime: RuntimeOpt = None,
) -> None:
    """Print a plan in torchtitan's or Megatron-LM's terms; what they cannot say is warned about on stderr.

    The plan is priced for its target runtime (torchtitan or megatron; --runtime overrides), and that
    price goes to stderr with the runtime that priced it, so a pipe carries only the config."""
    from planner.errors import MeshplanError
    from planner.report.export import to_megatron, to_torchtitan
    from planner.runtime import launch_problems
    from planner.specs.plan import check_plan_against, parse_plan_json

    if fmt not in FORMATS:
        raise MeshplanError("--format", fmt, f"choose one of {', '.join(FORMATS)}")
    from planner.inputs import read_input

    text = read_input(plan_file, "plan", "plan", "e.g. from `meshplan plan --out`")
    p = parse_plan_json(text, origin=plan_file.name)
    given = model_spec
    m, unchecked = None, []
    try:
        m = model_for_plan(p, given)
    except MeshplanError:
        if fmt == "megatron" or given is not None:
            raise
        # torchtitan's fragment needs no model dimensions; say what could not be checked without them
        unchecked = [f"not checked against {p.model}'s heads and layers; pass its --model to check"]
    if m is not None:
        check_plan_against(p, m.num_layers, p.num_devices)
    # the launch contract estimate and the dry run use: a plan our runtime refuses (tp 3 on 40
    # heads, too few micro-batches for its schedule) is refused here too, not handed to another stack
    for problem in launch_problems(p, model=m):
        raise MeshplanError(
            f"{plan_file.name}: {problem.field}", problem.value, f"{problem.fix} (meshplan's runtime refuses this plan)"
        )
    text, warnings = to_torchtitan(p) if fmt == "torchtitan" else to_megatron(p, m)
    typer.echo(text, nl=False)
    for w in [*warnings, *unchecked]:
        typer.echo(f"warning: {w}", err=True)
    _price_for_target(p, given, cluster, runtime or fmt)


def _price_for_target(p, given, cluster: Path | None, runtime: str) -> None:
    """The plan's price under the export's target runtime, on stderr; a plan that cannot be priced
    here (no model dimensions, no cluster and nothing discovered) says so instead."""
    from cli.app import db_path, load_settings
    from flows.queries import pricing_inputs
    from planner.errors import MeshplanError

    cfg = load_settings()
    name = runtime_name(runtime, cfg)
    try:
        m = model_for_plan(p, given)
        inputs = pricing_inputs(db_path(cfg), m, cluster)
        c, figures = price_for_runtime(db_path(cfg), p, m, inputs, name)
    except (MeshplanError, FileNotFoundError) as err:
        typer.echo(f"priced for runtime {name}: not priced ({str(err).splitlines()[0]})", err=True)
        return
    fits = "fits" if c.feasible else "DOES NOT FIT"
    typer.echo(
        f"priced for runtime {name} ({figures}): step {c.step_time_s:.4g} s, {c.tokens_per_s:,.0f} tokens/s, {fits}",
        err=True,
    )
