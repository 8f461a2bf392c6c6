"""`meshplan calibrate`'s work: fit a runtime's few figures (planner.cost.runtimes) per device kind on
measured runs, and store them with their provenance (storage.calibrations).

The runs come from a CSV in the development set's columns (planner.measure.runs_file), or from
meshplan's own completed runs (their telemetry), priced as `estimate` prices them (storage.pricing).
A plain function, not a Prefect flow: it is seconds of arithmetic on what is already stored. A
rejected file stores nothing (every row is parsed before the first fit).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

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
from planner.errors import MeshplanError
from planner.inputs import read_input
from planner.measure.profiles import ProfileTable
from planner.measure.runs_file import parse_runs
from planner.specs.model import ModelSpec, get_model
from planner.specs.plan import parse_plan_json
from storage.calibrations import completed_run_steps, save_figures
from storage.pricing import PricingInputs, device_kind_of, pricing_inputs


def calibrate_runtime(db: str | Path, runtime: str, runs_csv: Path | None, cluster: Path | None) -> list[dict]:
    """Fit and store `runtime`'s figures for every device kind the runs ran on; one dict per stored
    calibration (id, device_kind, runtime, kernel_scale, microbatch_s, runs, mape_before/after, source)."""
    groups: dict[str, list] = {}
    if runs_csv is not None:
        for r in parse_runs(read_input(runs_csv, "--runs", "runs")):  # a bad row raises here: nothing is stored
            inp = PricingInputs(r.cluster, ProfileTable(()), "estimates", None, r.plan.dtype, None)
            groups.setdefault(r.device_kind, []).append((r.run_id, r.plan, r.model, inp, r.measured_s))
        source = str(runs_csv)
    else:
        done = completed_run_steps(db)
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
            inp = pricing_inputs(db, model, cluster)
            groups.setdefault(device_kind_of(inp.cluster), []).append((d["run_id"], plan, model, inp, d["step_s"]))
        source = "meshplan runs (telemetry)"
    out = []
    for kind, cases in sorted(groups.items()):
        fig, before, after = fit_runs(cases, runtime, kind != "cpu")
        cid = save_figures(db, kind, runtime, fig, [c[0] for c in cases], source, before, after)
        out.append(
            {
                "id": cid,
                "device_kind": kind,
                "runtime": runtime,
                "kernel_scale": fig.kernel_scale,
                "microbatch_s": fig.microbatch_s,
                "runs": fig.runs,
                "mape_before": before,
                "mape_after": after,
                "source": source,
            }
        )
    return out


def _mape(pairs: list[tuple[float, float]]) -> float:
    return 100 * sum(abs(p / m - 1) for p, m in pairs) / max(1, len(pairs))


def fit_runs(cases: list[tuple[str, Any, Any, Any, float]], runtime: str, gpu: bool) -> tuple[Any, float, float]:
    """Figures fitted on cases (run_id, plan, model, pricing inputs, measured s) for one device kind:
    kernel_scale on GPUs (their compute is shape-based), the per-micro-batch cost alone on CPU ranks
    (their compute is measured: only fixed costs are left); returns (figures, MAPE before, after)."""
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
        base = priced(Figures(1.0, 0.0))

        def loss(x: float) -> float:
            return sum(math.log(max(1e-9, p + k * x) / m) ** 2 for p, k, m in base)

        lo = min(0.0, max(-p / k for p, k, _ in base) * 0.999)  # a calibrated CPU model may run slow: x < 0
        scale, mb = 1.0, golden(loss, lo, max(m for _, _, m in base), iters=40)
    ids = [c[0] for c in cases]
    fig = Figures(scale, mb, n, f"fitted on {n} runs: {', '.join(ids[:5])}{' …' if n > 5 else ''}")
    after = _mape([(p, m) for p, _, m in priced(fig)])
    return fig, before, after
