"""`meshplan plan` (search ranked plans) and `meshplan estimate` (price a hand-written plan)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.app import SMALL_WRITE_BYTES, app, check_output, db_path, load_settings, need_space, prefect_env
from cli.commands.calibrate import RuntimeOpt, price_for_runtime, runtime_name, runtime_pricing
from cli.commands.model_options import model_for_plan, model_option_flags
from planner.limits import MAX_GLOBAL_BATCH, MAX_SECONDS, MAX_SEQ, MAX_TOP

if TYPE_CHECKING:
    from planner.specs.model import ModelSpec


def calibration_doc(calibration: Any) -> dict[str, Any] | None:
    """A Calibration (planner.measure.calibrate) as JSON: its measured terms, collectives by op."""
    if calibration is None:
        return None
    doc = dataclasses.asdict(calibration)
    doc["collectives"] = {op: dataclasses.asdict(fit) for op, fit in calibration.collectives}
    return doc


@app.command()
@model_option_flags()
def plan(
    model_spec: ModelSpec | None = None,
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help="cluster TOML file (default: this machine, as discovered)")
    ] = None,
    snapshot: Annotated[
        str | None, typer.Option("--snapshot", help="a discovered hardware snapshot's fingerprint")
    ] = None,
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", min=1, max=MAX_GLOBAL_BATCH, help="samples per optimizer step")
    ] = None,
    seq: Annotated[
        int | None, typer.Option("--seq", min=1, max=MAX_SEQ, help="sequence length (default: the model's)")
    ] = None,
    top: Annotated[int | None, typer.Option("--top", min=1, max=MAX_TOP, help="how many plans to rank")] = None,
    budget: Annotated[
        float | None,
        typer.Option("--budget", min=0.01, max=MAX_SECONDS, help="search time budget in CPU seconds of the search"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="write the best plan as JSON here")] = None,
    flow: Annotated[bool, typer.Option("--flow", help="run as a Prefect flow (artifacts in the UI)")] = False,
    store: Annotated[bool, typer.Option(help="save the ranked plans in the database")] = True,
    runtime: RuntimeOpt = None,
) -> None:
    """Search parallel plans; rank them by predicted step time against two baselines."""
    from planner.specs.model import PRESETS

    given = model_spec
    preset = given is not None and PRESETS.get(given.name) == given
    extra = [f"model={json.dumps(given.name)}"] if preset else []
    for name, v in (("global_batch", global_batch), ("seq", seq), ("top_k", top), ("time_budget_s", budget)):
        if v is not None:
            extra.append(f"search.{name}={v}")
    cfg = load_settings(
        extra,
        {
            "search.global_batch": "--global-batch",
            "search.seq": "--seq",
            "search.top_k": "--top",
            "search.time_budget_s": "--budget",
            "model": "--model",
        },
    )
    path = db_path(cfg)
    check_output(out, "--out", cluster, path)
    need_space(cfg, out, need=SMALL_WRITE_BYTES)  # a full disk is refused before the search, not met writing its result
    if flow:
        prefect_env(cfg)  # before anything imports prefect (the flow); without --flow no Prefect at all
        if given is not None and not preset:
            from planner.errors import MeshplanError

            raise MeshplanError("--model", given.name, "--flow takes a preset; without --flow any model is searched")
        from flows.plan import plan_flow

        summary = plan_flow(
            str(path),
            cfg.model,
            cfg.search.model_copy(update={"runtime": runtime_name(runtime, cfg)}),
            str(cluster) if cluster else None,
            snapshot,
            cfg.profile.dtype,
        )
        typer.echo(summary.model_dump_json(indent=2) if as_json else f"plan flow: {summary}")
        raise typer.Exit(0 if summary.feasible else 1)

    from flows.queries import pricing_inputs, search_now, store_search
    from planner.errors import MeshplanError
    from planner.report.ranking import ranking_rows
    from planner.search import NoFeasiblePlan
    from planner.specs.model import get_model

    m = given if given is not None else get_model(cfg.model)
    # the inputs and the search function plan_flow's tasks use, with the same config: the same ranking
    inputs = pricing_inputs(path, m, cluster, snapshot, cfg.profile.dtype)
    spec, source = inputs.cluster, inputs.profile_source
    s = cfg.search
    # the search prices under the runtime (its kernels, memory, overlap, fixed costs and stored figures)
    rt = runtime_name(runtime, cfg)
    pricing = runtime_pricing(path, spec, rt)
    figures = pricing.label(spec.nodes[0].device_kind)
    res = search_now(m, inputs, s, pricing)
    launch = whole_cluster_launch(inputs)
    if isinstance(res, NoFeasiblePlan):
        reasons = list(res.reasons) + ([f"plans searched on every discovered device ({launch})"] if launch else [])
        if as_json:
            typer.echo(json.dumps({"feasible": False, "reasons": reasons}, indent=2))
            raise typer.Exit(1)
        raise MeshplanError("--model", m.name, "no feasible plan: " + "; ".join(reasons))
    if out is not None:
        out.write_text(res.best.to_json())
    rows = ranking_rows(res, m)
    if as_json:
        key = store_search(path, res) if store else None  # the JSON names the stored search
        doc = {
            "feasible": True,
            "search_key": key,
            "profiles": source,
            "dtype": inputs.dtype,
            "calibration": calibration_doc(inputs.calibration),
            "runtime": rt,
            "runtime_figures": figures,
            "ranking": rows,
            "stats": {k: getattr(res.stats, k) for k in res.stats.__dataclass_fields__},
            "search": res.stats.summary(),
            "plans": [json.loads(p.to_json()) for p in res.plans],
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    st = res.stats
    from cli.commands.tables import print_ranking

    print_ranking(rows, f"{m.name} on {spec.name}: {spec.num_devices} devices, batch {s.global_batch}")
    typer.echo(f"profiles: {source}")
    typer.echo(f"runtime: {rt} ({figures})")
    if inputs.calibration is not None:
        typer.echo(f"calibrated to {inputs.calibration.source}")
    typer.echo(f"search: {st.shapes} shapes, {st.candidates} candidates, {st.pruned} pruned, {st.wall_s:.2f} s")
    typer.echo(st.summary())
    faster = [r for r in rows if r.get("launchable") is False and r["step_time_s"] < rows[0]["step_time_s"]]
    if faster:  # the summary's "best" is the fastest priced plan; say which one can actually run
        typer.echo(f"plan {faster[0]['rank']}* is faster but cannot be launched; plan 1 is the fastest that can")
    if launch:
        typer.echo(f"launch: {launch} (plans use every device of the {spec.num_nodes} discovered nodes)")
    if out is not None:
        typer.echo(f"best plan written to {out}")
    if store:  # after the answer: the user reads the ranking while DuckDB writes it
        sys.stdout.flush()
        store_search(path, res)


def whole_cluster_launch(inputs: Any) -> str | None:
    """`--nnodes N --nproc-per-node R` for a discovered several-node cluster (tasks.searching.whole_cluster:
    its plans use every device), else None."""
    from flows.queries import whole_cluster

    n = whole_cluster(inputs)
    if n is None:
        return None
    nodes = inputs.cluster.num_nodes
    return f"--nnodes {nodes} --nproc-per-node {n // nodes}"


@app.command()
@model_option_flags()
def estimate(
    plan_file: Annotated[Path, typer.Option("--plan", help="plan JSON file (see tests/data/plan_v1.json)")],
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help="cluster TOML file (default: this machine, as discovered)")
    ] = None,
    model_spec: ModelSpec | None = None,
    snapshot: Annotated[
        str | None, typer.Option("--snapshot", help="a discovered hardware snapshot's fingerprint")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
    runtime: RuntimeOpt = None,
) -> None:
    """Price a plan: step-time breakdown, tokens/s, MFU, memory per stage, feasibility.

    Priced as the search prices it (flows.queries.pricing_inputs): on a discovered CPU machine with
    its measured corrections, in the plan's own dtype."""
    from flows.queries import pricing_inputs
    from planner.inputs import read_input
    from planner.specs.plan import check_plan_against, parse_plan_json

    text = read_input(plan_file, "--plan", "plan", "e.g. from `meshplan plan --out`")
    p = parse_plan_json(text, origin=plan_file.name)
    m = model_for_plan(p, model_spec)
    cfg = load_settings()
    inputs = pricing_inputs(db_path(cfg), m, cluster, snapshot)
    spec, source = inputs.cluster, inputs.profile_source
    check_plan_against(p, m.num_layers, spec.num_devices)  # a plan for a bigger cluster: one line
    other = made_for_other_cluster(p, spec)
    rt = runtime_name(runtime, cfg)
    c, figures = price_for_runtime(db_path(cfg), p, m, inputs, rt)
    if as_json:
        doc = {
            "plan": p.fingerprint(),
            "cluster_note": other,
            "profiles": source,
            "calibration": calibration_doc(inputs.calibration),
            "runtime": rt,
            "runtime_figures": figures,
        }
        typer.echo(json.dumps({**doc, **c.model_dump(mode="json")}, indent=2))
        raise typer.Exit(0 if c.feasible else 1)
    from cli.commands.tables import Col, console, print_table

    gib = 2**30
    con = console()
    con.print(f"[bold]{m.name}[/] on {spec.name}: plan {p.fingerprint()} — {'fits' if c.feasible else 'DOES NOT FIT'}")
    terms = ("compute", "bubble", "pp p2p", "tp comm", "dp comm", "optimizer")
    values = (c.compute_s, c.bubble_s, c.pp_comm_s, c.tp_comm_s, c.dp_comm_s, c.optimizer_s)
    title = f"step {c.step_time_s:.4g} s · {c.tokens_per_s:,.0f} tokens/s · MFU {c.mfu:.1%} · {c.bottleneck}"
    print_table(title, [Col(h, keep=9, right=True) for h in terms], [[f"{v:.4g} s" for v in values]], con=con)
    rows = []
    for j, s in enumerate(p.stages[: p.pp]):
        peak, cap = c.peak_memory_bytes[j], c.memory_capacity_bytes[j]
        rows.append(
            [
                str(j),
                f"{s.layer_start}-{s.layer_end - 1}",
                f"{peak / gib:.2f} GiB",
                f"{cap / gib:.1f} GiB",
                "yes" if peak <= cap else "NO",
            ]
        )
    heads = ("stage", "layers", "peak", "capacity", "fits")
    print_table("memory per stage", [Col(h, keep=9, right=h != "fits") for h in heads], rows, con=con)
    con.print(f"runtime: {rt} ({figures})")
    notes = ([other] if other else []) + list(c.notes)
    con.print(f"profiles: {source}" + "".join(f"\nnote: {n}" for n in notes), highlight=False)
    if not c.feasible:
        raise typer.Exit(1)


def made_for_other_cluster(plan, spec) -> str | None:
    """A note when `plan` was searched on another cluster than `spec` (its device ids then name
    this cluster's devices, which may be other kinds); None when it was made here or is hand-written."""
    made = plan.provenance.cluster_fingerprint
    if made and made != spec.fingerprint():
        return (
            f"the plan was made for cluster {plan.cluster!r} (fingerprint {made}), not {spec.name!r} "
            f"({spec.fingerprint()}): priced on this one's devices; re-plan here for a plan made for it"
        )
    if not made and plan.cluster and plan.cluster != spec.name:
        return f"the plan names cluster {plan.cluster!r}, priced here on {spec.name!r}"
    return None
