"""`meshplan compare`: two plans priced side by side on one cluster, as `meshplan estimate` prices each.

Both go through the same path as estimate (storage.pricing.pricing_inputs: the stored profiles for
the model, else roofline estimates, and a discovered CPU machine's calibration; planner.cost.estimate
with the plan's dtype), so the difference shown is the plans'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.app import app, db_path, load_settings
from cli.commands.calibrate import RuntimeOpt, price_for_runtime, runtime_name
from cli.commands.model_options import model_for_plan, model_option_flags

if TYPE_CHECKING:
    from planner.specs.model import ModelSpec

GIB = 2**30
# (label, CostBreakdown field, seconds?) rows of the table; times print in ms
_TERMS = (
    ("step", "step_time_s"),
    ("compute", "compute_s"),
    ("bubble", "bubble_s"),
    ("pp p2p", "pp_comm_s"),
    ("tp comm", "tp_comm_s"),
    ("dp comm", "dp_comm_s"),
    ("optimizer", "optimizer_s"),
)


@app.command()
@model_option_flags()
def compare(
    plan_a: Annotated[Path, typer.Argument(help="first plan JSON file")],
    plan_b: Annotated[Path, typer.Argument(help="second plan JSON file")],
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help="cluster TOML file (default: this machine, as discovered)")
    ] = None,
    model_spec: ModelSpec | None = None,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
    runtime: RuntimeOpt = None,
) -> None:
    """Price two plans on the same cluster and show their step-time terms and memory side by side."""
    from flows.queries import pricing_inputs
    from planner.inputs import read_input
    from planner.specs.plan import parse_plan_json

    given = model_spec
    cfg = load_settings()
    path = db_path(cfg)
    rt = runtime_name(runtime, cfg)
    plans = []
    for arg, f in (("plan_a", plan_a), ("plan_b", plan_b)):
        text = read_input(f, arg, "plan", "e.g. from `meshplan plan --out`")
        plans.append((f, parse_plan_json(text, origin=f.name)))
    same_work(plans[0][1], plans[1][1], plan_b.name)
    priced: list[dict[str, Any]] = []
    for f, p in plans:
        m = model_for_plan(p, given)
        inputs = pricing_inputs(path, m, cluster)  # as estimate prices it (calibrated on a discovered CPU machine)
        spec, source = inputs.cluster, inputs.profile_source
        c, figures = price_for_runtime(path, p, m, inputs, rt)
        priced.append({"file": str(f), "plan": p, "model": m.name, "profiles": source, "cost": c, "figures": figures})
    a, b = (x["cost"] for x in priced)
    speedup = a.step_time_s / b.step_time_s if b.step_time_s > 0 else None
    if as_json:
        doc = {
            "cluster": spec.name,
            "plans": [
                {
                    "file": x["file"],
                    "fingerprint": x["plan"].fingerprint(),
                    "model": x["model"],
                    "profiles": x["profiles"],
                    "runtime": rt,
                    "runtime_figures": x["figures"],
                    **x["cost"].model_dump(mode="json"),
                }
                for x in priced
            ],
            "speedup_b_over_a": speedup,
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    _print(priced, spec.name, speedup)
    typer.echo(f"runtime: {rt} ({priced[0]['figures']})")


def same_work(a: Any, b: Any, where: str) -> None:
    """Refuse plans that do different work per step: a speed-up between a 13B model's plan and a
    tiny one's, or between batches of 8 and 512, compares the jobs, not the plans."""
    from planner.errors import MeshplanError

    fa, fb = a.provenance.model_fingerprint, b.provenance.model_fingerprint
    if a.model != b.model or (fa and fb and fa != fb):
        raise MeshplanError(
            f"{where}: model", b.model, f"plan_a is for {a.model}; compare two plans for the same model"
        )
    for field in ("global_batch_size", "seq_len"):
        va, vb = getattr(a, field), getattr(b, field)
        if va != vb:
            raise MeshplanError(
                f"{where}: {field}", vb, f"plan_a has {field}={va}; compare plans for the same batch and sequence"
            )


def _print(priced: list[dict[str, Any]], cluster: str, speedup: float | None) -> None:
    from cli.commands.tables import Col, console, print_table

    a, b = (x["cost"] for x in priced)
    cols = [Col("", keep=9), Col("a", keep=9, right=True), Col("b", keep=9, right=True), Col("b/a", keep=8, right=True)]
    rows = []
    for label, field in _TERMS:
        va, vb = getattr(a, field), getattr(b, field)
        rows.append([f"{label} ms", f"{va * 1e3:.4g}", f"{vb * 1e3:.4g}", f"{vb / va:.2f}" if va else "-"])
    rows.append(
        [
            "tokens/s",
            f"{a.tokens_per_s:,.0f}",
            f"{b.tokens_per_s:,.0f}",
            f"{b.tokens_per_s / a.tokens_per_s:.2f}" if a.tokens_per_s else "-",
        ]
    )
    rows.append(["MFU", f"{a.mfu:.1%}", f"{b.mfu:.1%}", ""])
    pa, pb = max(a.peak_memory_bytes) / GIB, max(b.peak_memory_bytes) / GIB
    rows.append(["peak GiB", f"{pa:.2f}", f"{pb:.2f}", f"{pb / pa:.2f}" if pa else "-"])
    rows.append(["fits", "yes" if a.feasible else "NO", "yes" if b.feasible else "NO", ""])
    con = console()
    print_table(f"on {cluster}", cols, rows, con=con, full="--json")
    for tag, x in zip("ab", priced, strict=True):
        con.print(f"{tag}: {Path(x['file']).name} ({x['plan'].fingerprint()[:8]})", highlight=False)
        con.print(f"   {x['model']}, bottleneck {x['cost'].bottleneck}; profiles: {x['profiles']}")
    if speedup is not None:
        con.print(speed_sentence(speedup), highlight=False)


def speed_sentence(speedup: float) -> str:
    """b against a in words: a ratio above 1 always, so "0.87× slower" (which reads as faster) is never said."""
    if round(speedup, 2) == 1.0:
        return "b and a take the same time per step"
    if speedup > 1:
        return f"b is {speedup:.2f}× faster than a per step (a step of b takes {1 / speedup:.0%} of a's)"
    return f"b is {1 / speedup:.2f}× slower than a per step (a step of b takes {1 / speedup:.0%} of a's)"
