"""`meshplan calibrate`: fit a runtime's few figures on measured runs; and `--runtime` pricing for
`plan`, `estimate`, `compare` and `export` (planner.cost.runtimes).

`meshplan calibrate --runs runs.csv [--runtime NAME]` reads measured runs in the development set's
columns (planner.measure.runs_file), fits kernel_scale (and with 6+ runs the per-micro-batch cost)
per GPU kind for the runtime, and stores them with their provenance (storage.calibrations). Without
`--runs` it fits on meshplan's own completed runs, from their telemetry, priced as `estimate` prices
them (storage.pricing). `--show` lists what is in force. A rejected file stores nothing.
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


def _mape(pairs: list[tuple[float, float]]) -> float:
    return 100 * sum(abs(p / m - 1) for p, m in pairs) / max(1, len(pairs))


def fit_runs(cases: list[tuple[str, Any, Any, Any, float]], runtime: str, gpu: bool) -> tuple[Any, float, float]:
    """Figures fitted on cases (run_id, plan, model, pricing inputs, measured s) for one device kind:
    kernel_scale on GPUs (their compute is shape-based), the per-micro-batch cost alone on CPU ranks
    (their compute is measured: only fixed costs are left); returns (figures, MAPE before, after)."""
    from planner.cost.runtimes import (
        MIN_RUNS_FOR_MICROBATCH,
        PRIOR_FIGURES,
        Figures,
        fit_figures,
        golden,
        price_under,
        profile_named,
        slots,
    )

    prof = profile_named(runtime)

    def priced(fig: Any) -> list[tuple[float, int, float]]:
        out = []
        for _, plan, model, inp, measured in cases:
            c = price_under(
                plan,
                model,
                inp.cluster,
                prof,
                fig,
                restack=runtime != "meshplan",
                profiles=inp.profiles,
                calibration=inp.calibration,
            )
            out.append((c.step_time_s, slots(plan), measured))
        return out

    before = _mape([(p, m) for p, _, m in priced(PRIOR_FIGURES)])
    n = len(cases)
    if gpu:
        scale, mb = fit_figures(lambda sc: priced(Figures(sc, 0.0)), fit_microbatch=n >= MIN_RUNS_FOR_MICROBATCH)
    else:
        import math

        base = priced(Figures(1.0, 0.0))

        def loss(x: float) -> float:
            return sum(math.log(max(1e-9, p + k * x) / m) ** 2 for p, k, m in base)

        lo = min(0.0, max(-p / k for p, k, _ in base) * 0.999)  # a calibrated CPU model may run slow: x < 0
        scale, mb = 1.0, golden(loss, lo, max(m for _, _, m in base), iters=40)
    ids = [c[0] for c in cases]
    fig = Figures(scale, mb, n, f"fitted on {n} runs: {', '.join(ids[:5])}{' …' if n > 5 else ''}")
    after = _mape([(p, m) for p, _, m in priced(fig)])
    return fig, before, after


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
    from planner.errors import MeshplanError
    from storage.calibrations import list_figures, save_figures

    cfg = load_settings()
    path = db_path(cfg)
    if show:
        rows = list_figures(path)
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
    name = runtime_name(runtime, cfg)
    groups: dict[str, list] = {}
    if runs is not None:
        from planner.measure.runs_file import parse_runs
        from storage.pricing import PricingInputs

        if not runs.is_file():
            raise MeshplanError("--runs", str(runs), "no such file; pass a CSV of measured runs")
        for r in parse_runs(runs.read_text()):  # a bad row raises here: nothing is stored
            from planner.measure.profiles import ProfileTable

            inp = PricingInputs(r.cluster, ProfileTable(()), "estimates", None, r.plan.dtype, None)
            groups.setdefault(r.device_kind, []).append((r.run_id, r.plan, r.model, inp, r.measured_s))
        source = str(runs)
    else:
        from planner.specs.model import ModelSpec, get_model
        from planner.specs.plan import parse_plan_json
        from storage.calibrations import completed_run_steps
        from storage.pricing import pricing_inputs

        done = completed_run_steps(path)
        if not done:
            raise MeshplanError("--runs", "(none)", "no completed meshplan run to calibrate on; pass --runs runs.csv")
        for d in done:
            plan = parse_plan_json(d["plan_json"], origin=d["run_id"])
            try:
                model = get_model(d["model"])
            except MeshplanError:
                model = (
                    ModelSpec.model_validate_json(d["model"]) if d["model"].startswith("{") else get_model(d["model"])
                )
            inp = pricing_inputs(path, model, cluster)
            groups.setdefault(device_kind_of(inp.cluster), []).append((d["run_id"], plan, model, inp, d["step_s"]))
        source = "meshplan runs (telemetry)"
    out = []
    for kind, cases in sorted(groups.items()):
        fig, before, after = fit_runs(cases, name, kind != "cpu")
        cid = save_figures(path, kind, name, fig, [c[0] for c in cases], source, before, after)
        out.append(
            {
                "id": cid,
                "device_kind": kind,
                "runtime": name,
                "kernel_scale": fig.kernel_scale,
                "microbatch_s": fig.microbatch_s,
                "runs": fig.runs,
                "mape_before": before,
                "mape_after": after,
                "source": source,
            }
        )
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    for o in out:
        typer.echo(
            f"calibrated: {o['runs']} runs, {o['device_kind']}/{o['runtime']}: kernel_scale {o['kernel_scale']:.3f},"
            f" per micro-batch {1e3 * (o['microbatch_s'] or 0):.2f} ms; MAPE {o['mape_before']:.1f}% ->"
            f" {o['mape_after']:.1f}% ({o['source']})"
        )


# storage.pricing's runtime pricing, for the command modules: imported when called, so `meshplan --help`
# loads no DuckDB or numpy


def device_kind_of(cluster: Any) -> str:
    from storage.pricing import device_kind_of as f

    return f(cluster)


def price_for_runtime(path: Path, plan: Any, model: Any, inputs: Any, runtime: str) -> tuple[Any, str]:
    from storage.pricing import price_for_runtime as f

    return f(path, plan, model, inputs, runtime)


def rerank_for_runtime(path: Path, res: Any, model: Any, inputs: Any, runtime: str) -> tuple[Any, str]:
    from storage.pricing import rerank_for_runtime as f

    return f(path, res, model, inputs, runtime)
