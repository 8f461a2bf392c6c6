"""`meshplan calibrate`: fit a runtime's few figures on measured runs; and `--runtime` pricing for
`plan`, `estimate`, `compare` and `export` (planner.cost.runtimes).

`meshplan calibrate --runs runs.csv [--runtime NAME]` reads measured runs in the development set's
columns (planner.measure.runs_file), fits kernel_scale (and with 6+ runs the per-micro-batch cost)
per GPU kind for the runtime, and stores them with their provenance (storage.calibrations). Without
`--runs` it fits on meshplan's own completed runs, from their telemetry, priced as `estimate` prices
them (storage.pricing); flows/calibrate.py does the fitting, and stores a fit only when it helps
(at least 3 distinct runs, a leave-one-out error below the prior's; otherwise one line says why and
nothing is stored). `--show` lists what is in force.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.app import app, db_path, load_settings

RuntimeOpt = Annotated[
    str | None,
    typer.Option(
        "--runtime",
        help="meshplan | torchtitan | megatron | deepspeed | composer: price for this runtime "
        "(default: search.runtime in the config, meshplan)",
    ),
]


def runtime_name(cli: str | None, cfg: Any = None) -> str:
    """The runtime asked for: the flag, else the config's search.runtime; checked by name."""
    from planner.cost.runtimes import profile_named

    name = cli or (cfg.search.runtime if cfg is not None else "meshplan")
    return profile_named(name).name


@app.command()
def calibrate(
    runs: Annotated[
        Path | None, typer.Option("--runs", help="measured runs CSV (the development set's columns)")
    ] = None,
    runtime: RuntimeOpt = None,
    cluster: Annotated[
        Path | None,
        typer.Option(
            "--cluster", help="cluster TOML meshplan's own runs ran on (default: this machine, as discovered)"
        ),
    ] = None,
    show: Annotated[bool, typer.Option("--show", help="list the calibrations in force")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
) -> None:
    """Fit a runtime's figures (kernel quality, per-micro-batch cost) per device kind on measured runs."""
    from flows.calibrate import calibrate_runtime
    from flows.queries import calibrations

    cfg = load_settings()
    path = db_path(cfg)
    if show:
        rows = calibrations(path)
        if as_json:
            typer.echo(json.dumps(rows, indent=2, default=str))
            return
        if not rows:
            typer.echo("no calibrations stored: every runtime prices on its prior figures")
        for r in rows:
            mb = "prior" if r["microbatch_s"] is None else f"{1e3 * r['microbatch_s']:.2f} ms"
            typer.echo(
                f"calibrated: {r['runs']} runs, {r['device_kind']}/{r['runtime']}: kernel_scale {r['kernel_scale']:.3f},"
                f" per micro-batch {mb}; MAPE {r['mape_before']:.1f}% -> {r['mape_after']:.1f}%;"
                f" {r['source']}; {r['created_at']}"
            )
        return
    out = calibrate_runtime(path, runtime_name(runtime, cfg), runs, cluster)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    for o in out:
        typer.echo(
            f"calibrated: {o['runs']} runs, {o['device_kind']}/{o['runtime']}: kernel_scale {o['kernel_scale']:.3f},"
            f" per micro-batch {1e3 * (o['microbatch_s'] or 0):.2f} ms; MAPE prior {o['mape_before']:.1f}% ->"
            f" fitted {o['mape_after']:.1f}% (leave-one-out {o['mape_cv']:.1f}%) ({o['source']})"
        )
    for note in dict.fromkeys(n for o in out for n in o["notes"]):
        typer.echo(f"note: {note}")


# flows.queries' runtime pricing, for the command modules: imported when called, so `meshplan --help`
# loads no DuckDB or numpy


def price_for_runtime(path: Path, plan: Any, model: Any, inputs: Any, runtime: str) -> tuple[Any, str]:
    from flows.queries import price_for_runtime as f

    return f(path, plan, model, inputs, runtime)


def runtime_pricing(path: Path, cluster: Any, runtime: str) -> Any:
    from flows.queries import runtime_pricing as f

    return f(path, cluster, runtime)
