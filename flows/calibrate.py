"""`meshplan calibrate`'s work: fit a runtime's few figures (planner.cost.runtimes) per device kind on
measured runs, and store them with their provenance (storage.calibrations).

The runs come from a CSV in the development set's columns (planner.measure.runs_file), or from
meshplan's own completed runs (their telemetry), priced as `estimate` prices them (storage.pricing).
A plain function, not a Prefect flow: it is seconds of arithmetic on what is already stored. A
rejected file stores nothing (every row is parsed before the first fit), and neither does a fit that
cannot be shown to help (calibrate_runtime: too few runs, or a cross-validated error no better than
the prior's).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from planner.cost.runtimes import (
    MIN_RUNS_JOINT,
    PRIOR_FIGURES,
    REG,
    Figures,
    device_kind_of,
    fit_terms,
    golden,
    price_under,
    profile_named,
    slots,
)
from planner.errors import MeshplanError
from planner.inputs import read_input
from planner.measure.profiles import ProfileTable
from planner.measure.runs_file import read_runs
from planner.specs.model import ModelSpec, get_model
from planner.specs.plan import parse_plan_json
from storage.calibrations import completed_run_steps, save_figures
from storage.pricing import PricingInputs, pricing_inputs

# Fewer distinct runs of a device kind than this and calibration says so and stores nothing: a fit on
# one or two runs cannot be checked (no held-out run) and flips plans on noise.
MIN_RUNS = 3
# A run whose error under the fit is beyond both of these is named as an outlier (kept in the fit:
# naming it lets the user check its units or its configuration).
OUTLIER_ABS = 0.25
OUTLIER_MEDIANS = 3.0
# Cross-validation: leave-one-out up to this many runs, else this many folds.
LOO_MAX_RUNS = 12


def calibrate_runtime(db: str | Path, runtime: str, runs_csv: Path | None, cluster: Path | None) -> list[dict]:
    """Fit and store `runtime`'s figures for every device kind the runs ran on; one dict per stored
    calibration (id, device_kind, runtime, kernel_scale, microbatch_s, runs, mape_before/after,
    mape_cv, notes, source).

    Calibration that cannot hurt: rows without a time are skipped (named); duplicate runs (one
    configuration measured twice) count once at their median; a device kind with fewer than MIN_RUNS
    distinct runs is not fitted; a fit is stored only when its cross-validated error (leave-one-out,
    each run priced by figures fitted on the others) beats the prior's on the same runs; runs far off
    under the fit are named. When nothing is stored the reasons are one MeshplanError line."""
    groups: dict[str, list] = {}
    notes: list[str] = []
    if runs_csv is not None:
        read = read_runs(read_input(runs_csv, "--runs", "runs"))  # a bad row raises here: nothing is stored
        if read.skipped:
            notes.append(read.skipped_note())
        for r in read.runs:
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
    refusals: list[str] = []
    for kind, raw in sorted(groups.items()):
        cases, dup = dedupe(raw)
        kind_notes = [dup] if dup else []
        label = f"{kind}/{runtime}"
        if len(cases) < MIN_RUNS:
            refusals.append(
                f"{label}: {len(cases)} distinct run{'s' if len(cases) != 1 else ''}, calibration needs at least {MIN_RUNS}"
            )
            continue
        fig, before, after = fit_runs(cases, runtime, kind != "cpu")
        cv, errors = cross_validated(cases, runtime, kind != "cpu")
        if cv >= before:
            refusals.append(
                f"{label}: fit not kept, its leave-one-out MAPE {cv:.1f}% is no better than the prior's {before:.1f}%"
                f" on {len(cases)} runs (in-sample {after:.1f}%)"
            )
            continue
        odd = outliers(cases, errors)
        if odd:
            kind_notes.append(f"{label}: outliers (named, kept): {odd}")
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
                "mape_cv": cv,
                "notes": notes + kind_notes,
                "source": source,
            }
        )
    if not out:
        why = "; ".join([*refusals, *notes]) or "no runs"
        raise MeshplanError("calibrate", source, f"{why}: nothing stored")
    for o in out:
        o["notes"] = o["notes"] + [f"not stored: {r}" for r in refusals]
    return out


def dedupe(cases: list[tuple[str, Any, Any, Any, float]]) -> tuple[list[tuple[str, Any, Any, Any, float]], str]:
    """One case per configuration (plan, model and cluster alike), at the median of its measured
    steps, and a note naming the merged run ids ('' when every run is distinct)."""
    by: dict[str, list] = {}
    for c in cases:
        _, plan, model, inp, _ = c
        # the cluster's name is the run's id in a runs file: not part of the configuration
        unnamed = plan.model_copy(update={"cluster": ""}).to_json()
        key = f"{unnamed}|{model.model_dump_json()}|{inp.cluster.model_copy(update={'name': ''}).model_dump_json()}"
        by.setdefault(key, []).append(c)
    out, merged = [], []
    for same in by.values():
        if len(same) > 1:
            merged.append("=".join(c[0] for c in same))
        rid, plan, model, inp, _ = same[0]
        out.append((rid, plan, model, inp, statistics.median(c[4] for c in same)))
    note = f"duplicates counted once (median step): {', '.join(merged)}" if merged else ""
    return out, note


def _folds(n: int) -> list[list[int]]:
    if n <= LOO_MAX_RUNS:
        return [[i] for i in range(n)]
    return [list(range(k, n, LOO_MAX_RUNS)) for k in range(LOO_MAX_RUNS)]


def cross_validated(cases: list, runtime: str, gpu: bool) -> tuple[float, list[float]]:
    """(MAPE of each run priced by figures fitted on the other runs, the per-run errors): leave-one-out
    up to LOO_MAX_RUNS runs, else LOO_MAX_RUNS folds."""
    prof = profile_named(runtime)
    errors = [0.0] * len(cases)
    for fold in _folds(len(cases)):
        held = set(fold)
        fig, _, _ = fit_runs([c for i, c in enumerate(cases) if i not in held], runtime, gpu)
        for i in fold:
            _, plan, model, inp, measured = cases[i]
            p = _price(plan, model, inp, prof, fig, runtime).step_time_s
            errors[i] = p / measured - 1
    return 100 * sum(abs(e) for e in errors) / len(errors), errors


def outliers(cases: list, errors: list[float]) -> str:
    """The runs whose held-out error is beyond OUTLIER_ABS and OUTLIER_MEDIANS × the median |error|."""
    med = statistics.median(abs(e) for e in errors)
    bar = max(OUTLIER_ABS, OUTLIER_MEDIANS * med)
    return ", ".join(f"{c[0]} ({100 * e:+.0f}%)" for c, e in zip(cases, errors, strict=True) if abs(e) > bar)


def _price(plan: Any, model: Any, inp: Any, prof: Any, fig: Figures, runtime: str) -> Any:
    return price_under(
        plan,
        model,
        inp.cluster,
        prof,
        fig,
        restack=runtime != "meshplan",
        profiles=inp.profiles,
        calibration=inp.calibration,
    )


def _mape(pairs: list[tuple[float, float]]) -> float:
    return 100 * sum(abs(p / m - 1) for p, m in pairs) / max(1, len(pairs))


def fit_runs(cases: list[tuple[str, Any, Any, Any, float]], runtime: str, gpu: bool) -> tuple[Any, float, float]:
    """Figures fitted on cases (run_id, plan, model, pricing inputs, measured s) for one device kind:
    kernel_scale and the per-micro-batch cost jointly on GPUs (their compute is shape-based; from 3
    runs, regularised toward the runtime's priors), the per-micro-batch cost alone on CPU ranks
    (their compute is measured: only fixed costs are left), never below 0 (a cost); returns
    (figures, MAPE before, after)."""
    prof = profile_named(runtime)

    def priced(fig: Any) -> list[tuple[float, int, float]]:
        return [
            (_price(plan, model, inp, prof, fig, runtime).step_time_s, slots(plan), m)
            for _, plan, model, inp, m in cases
        ]

    before = _mape([(p, m) for p, _, m in priced(PRIOR_FIGURES)])
    n = len(cases)
    if gpu:
        # kernel_scale and the per-micro-batch cost jointly, regularised toward the runtime's priors
        scale, mb, _ = fit_terms(
            lambda sc: priced(Figures(sc, 0.0)),
            fit_microbatch=n >= MIN_RUNS_JOINT,
            prior=(prof.microbatch_s, 0.0),
            reg=REG,
        )
    else:
        base = priced(Figures(1.0, 0.0))

        def loss(x: float) -> float:
            return sum(math.log((p + k * x) / m) ** 2 for p, k, m in base)

        # a fixed cost is ≥ 0: a run faster than its price leaves the per-micro-batch cost at 0
        mb = golden(loss, 0.0, max(m for _, _, m in base), iters=40)
        scale, mb = 1.0, (mb if loss(mb) < loss(0.0) else 0.0)
    ids = [c[0] for c in cases]
    fig = Figures(scale, mb, n, f"fitted on {n} runs: {', '.join(ids[:5])}{' …' if n > 5 else ''}")
    after = _mape([(p, m) for p, _, m in priced(fig)])
    return fig, before, after
