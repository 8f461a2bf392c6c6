"""`meshplan plan` (search ranked plans) and `meshplan estimate` (price a hand-written plan)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.app import app, db_path, load_settings, prefect_env


def _cluster(path: Path | None, db: Path, snapshot: str | None = None) -> Any:
    """The cluster file's spec, or this machine as `meshplan discover` recorded it."""
    if path is None:
        from storage.hardware import resolve_cluster

        return resolve_cluster(db, snapshot)
    from storage.files import read_cluster_file

    return read_cluster_file(path)


def _print_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    cols = ["rank", "layout", "step_s", "tokens_per_s", "mfu", "memory", "bottleneck"]
    cols += [c for c in rows[0] if c.startswith("vs_")] if rows else []
    for c in cols:
        t.add_column(c.replace("_", " "))
    for r in rows:
        t.add_row(*[("-" if r.get(c) is None else str(r[c])) for c in cols])
    Console().print(t)


@app.command()
def plan(
    model: Annotated[str | None, typer.Option("--model", help="model preset name (default: config `model`)")] = None,
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help="cluster TOML file (default: this machine, as discovered)")
    ] = None,
    snapshot: Annotated[
        str | None, typer.Option("--snapshot", help="a discovered hardware snapshot's fingerprint")
    ] = None,
    global_batch: Annotated[int | None, typer.Option("--global-batch", help="samples per optimizer step")] = None,
    seq: Annotated[int | None, typer.Option("--seq", help="sequence length (default: the model's)")] = None,
    top: Annotated[int | None, typer.Option("--top", help="how many plans to rank")] = None,
    budget: Annotated[float | None, typer.Option("--budget", help="search time budget in seconds")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="write the best plan as JSON here")] = None,
    flow: Annotated[bool, typer.Option("--flow", help="run as a Prefect flow (artifacts in the UI)")] = False,
    store: Annotated[bool, typer.Option(help="save the ranked plans in the database")] = True,
) -> None:
    """Search parallel plans; rank them by predicted step time against two baselines."""
    extra = [f"model={json.dumps(model)}"] if model else []
    for name, v in (("global_batch", global_batch), ("seq", seq), ("top_k", top), ("time_budget_s", budget)):
        if v is not None:
            extra.append(f"search.{name}={v}")
    cfg = load_settings(extra)
    path = db_path(cfg)
    spec = _cluster(cluster, path, snapshot)
    if flow:
        prefect_env(cfg)
        from flows.plan import plan_flow

        summary = plan_flow(
            str(path),
            cfg.model,
            str(cluster) if cluster else None,
            cfg.search.global_batch,
            cfg.search.seq,
            cfg.search.top_k,
            cfg.search.time_budget_s,
            snapshot,
        )
        typer.echo(json.dumps(summary, indent=2) if as_json else f"plan flow: {summary}")
        raise typer.Exit(0 if summary["feasible"] else 1)

    from planner.errors import MeshplanError
    from planner.report.ranking import ranking_rows
    from planner.search import NoFeasiblePlan, search
    from planner.specs.model import get_model
    from storage.plans import load_profiles_or_empty, save_plans

    m = get_model(cfg.model)
    table, source = load_profiles_or_empty(path, m)
    s = cfg.search
    res = search(
        m, spec, table, global_batch=s.global_batch, seq=s.seq or None, top_k=s.top_k, time_budget_s=s.time_budget_s
    )
    if isinstance(res, NoFeasiblePlan):
        if as_json:
            typer.echo(json.dumps({"feasible": False, "reasons": list(res.reasons)}, indent=2))
            raise typer.Exit(1)
        raise MeshplanError("--model", m.name, "no feasible plan: " + "; ".join(res.reasons))
    if store:
        save_plans(path, res.plans, res.baselines)
    if out is not None:
        out.write_text(res.best.to_json())
    rows = ranking_rows(res)
    if as_json:
        doc = {
            "feasible": True,
            "profiles": source,
            "ranking": rows,
            "stats": {k: getattr(res.stats, k) for k in res.stats.__dataclass_fields__},
            "plans": [json.loads(p.to_json()) for p in res.plans],
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    st = res.stats
    _print_table(rows, f"{m.name} on {spec.name}: {spec.num_devices} devices, batch {s.global_batch}")
    typer.echo(
        f"profiles: {source}; search: {st.shapes} shapes, {st.candidates} candidates, {st.pruned} pruned, "
        f"{st.wall_s:.2f} s{' (time budget reached)' if st.timed_out else ''}"
    )
    if out is not None:
        typer.echo(f"best plan written to {out}")


@app.command()
def estimate(
    plan_file: Annotated[Path, typer.Option("--plan", help="plan JSON file (see tests/data/plan_v1.json)")],
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help="cluster TOML file (default: this machine, as discovered)")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="model preset (default: the plan's)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
) -> None:
    """Price a plan: step-time breakdown, tokens/s, MFU, memory per stage, feasibility."""
    from planner.cost import estimate as price
    from planner.errors import MeshplanError
    from planner.specs.model import PRESETS, get_model
    from planner.specs.plan import parse_plan_json
    from storage.plans import load_profiles_or_empty

    if not plan_file.is_file():
        raise MeshplanError(
            "--plan", str(plan_file), "no such file; pass a plan JSON file (e.g. from `meshplan plan --out`)"
        )
    p = parse_plan_json(plan_file.read_text(), origin=plan_file.name)
    name = model or p.model
    if model and p.model in PRESETS and p.model != model:
        raise MeshplanError("--model", model, f"the plan was written for {p.model}; pass --model {p.model}")
    m = get_model(name)
    path = db_path(load_settings())
    spec = _cluster(cluster, path)
    table, source = load_profiles_or_empty(path, m)
    c = price(p, m, spec, table)
    if as_json:
        typer.echo(json.dumps({"plan": p.fingerprint(), "profiles": source, **c.model_dump(mode="json")}, indent=2))
        raise typer.Exit(0 if c.feasible else 1)
    from rich.console import Console
    from rich.table import Table

    gib = 2**30
    con = Console()
    con.print(f"[bold]{m.name}[/] on {spec.name}: plan {p.fingerprint()} — {'fits' if c.feasible else 'DOES NOT FIT'}")
    t = Table(title=f"step {c.step_time_s:.4g} s · {c.tokens_per_s:,.0f} tokens/s · MFU {c.mfu:.1%} · {c.bottleneck}")
    for col in ("compute", "bubble", "pp p2p", "tp comm", "dp comm", "optimizer"):
        t.add_column(col)
    t.add_row(*(f"{v:.4g} s" for v in (c.compute_s, c.bubble_s, c.pp_comm_s, c.tp_comm_s, c.dp_comm_s, c.optimizer_s)))
    con.print(t)
    mem = Table(title="memory per stage")
    for col in ("stage", "layers", "peak", "capacity", "fits"):
        mem.add_column(col)
    for j, s in enumerate(p.stages[: p.pp]):
        peak, cap = c.peak_memory_bytes[j], c.memory_capacity_bytes[j]
        mem.add_row(
            str(j),
            f"{s.layer_start}-{s.layer_end - 1}",
            f"{peak / gib:.2f} GiB",
            f"{cap / gib:.1f} GiB",
            "yes" if peak <= cap else "NO",
        )
    con.print(mem)
    con.print(f"profiles: {source}" + "".join(f"\nnote: {n}" for n in c.notes))
    if not c.feasible:
        raise typer.Exit(1)
