"""`meshplan serve-plan`, `serve-simulate`, `serve`: many models on one cluster with model parallelism.

serve-plan searches a placement (planner/serve: groups, pp × tp each, models hosted) and prints it
beside selective replication and one model per group, with vLLM engine arguments per group;
serve-simulate replays Gamma arrivals (or a trace CSV) on a placement file in the simulator;
serve starts a placement on torch ranks behind HTTP on 127.0.0.1 and records every request in DuckDB.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from cli.app import app, check_output, db_path, load_settings, prefect_env, state

# the options serve-simulate and serve share
PlacementOption = Annotated[Path, typer.Option("--placement", help="placement JSON (meshplan serve-plan --out)")]
ClusterOption = Annotated[Path, typer.Option("--cluster", help="cluster TOML (the devices the groups stand for)")]


def vllm_args(pl) -> list[str]:
    """One `vllm serve` line per (group, model): vLLM takes one model per engine, the group's layout."""
    out = []
    for i, g in enumerate(pl.groups):
        for name in g.models:
            m = next(x for x in pl.models if x.name == name)
            ref = m.preset or m.name
            out.append(
                f"group {i}: vllm serve {ref} --tensor-parallel-size {g.tp} --pipeline-parallel-size {g.pp} "
                f"--dtype {'float16' if pl.dtype == 'fp16' else 'bfloat16' if pl.dtype == 'bf16' else 'float32'}"
            )
    return out


@app.command("serve-plan")
def serve_plan(
    workload: Annotated[Path, typer.Option("--workload", help="workload TOML (models, rates, CVs, SLOs)")],
    cluster: ClusterOption,
    out: Annotated[Path | None, typer.Option("--out", help="write meshplan's placement here (JSON)")] = None,
) -> None:
    """Search a placement and compare it with selective replication and one model per group."""
    from planner.inputs import read_input
    from planner.serve.workload import parse_workload_toml
    from planner.specs.cluster import parse_cluster_toml

    cfg = load_settings()
    check_output(out, "--out", workload, cluster, db_path(cfg))
    # in milliseconds, before Prefect's server starts (the flow reads them again): one line for a bad
    # file; imports no Prefect (prefect_env must come first)
    parse_workload_toml(read_input(workload, "--workload", "workload"), str(workload))
    parse_cluster_toml(read_input(cluster, "--cluster", "cluster"), str(cluster))
    prefect_env(cfg)
    from flows.serve import load_cluster, placement_table, serve_plan_flow, serving_lines

    db = str(db_path(cfg))
    placements = serve_plan_flow(str(workload), str(cluster), str(out) if out else None, db)
    for line in placement_table(placements):
        typer.echo(line)
    for line in serving_lines(db, load_cluster(str(cluster))):  # what earlier serving runs measured
        typer.echo(line)
    typer.echo("")
    for line in vllm_args(placements["meshplan"]):
        typer.echo(line)
    if out:
        typer.echo(f"placement: {out}")


@app.command("serve-simulate")
def serve_simulate(
    placement: PlacementOption,
    cluster: ClusterOption,
    trace: Annotated[Path | None, typer.Option("--trace", help="CSV model,arrival_s (default: Gamma arrivals)")] = None,
    duration_s: Annotated[float, typer.Option("--duration-s", help="Gamma trace length, seconds")] = 60.0,
    plot: Annotated[Path | None, typer.Option("--plot", help="attainment vs rate and CV, group utilisation")] = None,
) -> None:
    """Per-model SLO attainment, p50/p99 latency and goodput of a placement in the simulator."""
    from flows.serve import load_cluster, load_placement, read_file
    from planner.errors import MeshplanError
    from planner.limits import MAX_REQUESTS, MAX_TRACE_S
    from planner.serve.cost import ServeCost
    from planner.serve.placement import simulate_placement
    from planner.serve.workload import Workload, make_trace, parse_trace_csv

    if not 0 < duration_s <= MAX_TRACE_S:
        raise MeshplanError("--duration-s", duration_s, f"must be 0..{MAX_TRACE_S:g} seconds (a day)")
    check_output(plot, "--plot", placement, cluster, trace)
    spec = load_cluster(str(cluster))
    pl = load_placement(placement, spec)
    cost = ServeCost(spec, pl.dtype)
    names = [m.name for m in pl.models]
    w = Workload(name="sim", models=pl.models, duration_s=duration_s, max_batch=pl.max_batch, dtype=pl.dtype)
    expected = sum(m.rate for m in pl.models) * duration_s
    if trace is None and expected > MAX_REQUESTS:  # the Gamma trace drawn here must fit the simulator
        raise MeshplanError(
            "--duration-s", duration_s, f"{expected:.3g} requests at the placement's rates; at most {MAX_REQUESTS:,}"
        )
    tr = parse_trace_csv(read_file(trace, "--trace"), names, str(trace)) if trace else make_trace(w)
    r = simulate_placement(pl, cost, tr)
    typer.echo(
        f"{'model':<16} {'requests':>8} {'attain':>8} {'p50 ms':>9} {'p99 ms':>9} {'goodput/s':>10} {'dropped':>8}"
    )
    for row in r.per_model(names):
        typer.echo(
            f"{row['model']:<16} {row['requests']:>8} {100 * row['attainment']:>7.2f}% {1e3 * row['p50_s']:>9.1f} "
            f"{1e3 * row['p99_s']:>9.1f} {row['goodput_rps']:>10.2f} {row['dropped']:>8}"
        )
    for i, busy in enumerate(r.group_busy_s):
        typer.echo(f"group {i} utilisation {100 * busy / tr.duration_s:.1f}%")
    if plot:
        _plot(pl, cost, w, r, tr.duration_s, plot)
        typer.echo(f"plot: {plot}")


def _plot(pl, cost, w, r, duration_s: float, path: Path) -> None:
    """Attainment as the workload's rates scale and as its CV varies; each group's utilisation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from planner.serve.placement import simulate_placement
    from planner.serve.workload import make_trace

    factors = [0.25, 0.5, 1, 1.5, 2, 3, 4]
    cvs = [0.5, 1, 2, 4, 6, 8]
    rate_att = [
        simulate_placement(pl, cost, make_trace(w, rates={m.name: m.rate * f for m in w.models})).attainment()
        for f in factors
    ]
    cv_att = [simulate_placement(pl, cost, make_trace(w, cv=c)).attainment() for c in cvs]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 4))
    a1.plot(factors, rate_att, marker="o")
    a1.set_xlabel("rate × workload's")
    a1.set_ylabel("SLO attainment")
    a2.plot(cvs, cv_att, marker="o")
    a2.set_xlabel("CV of inter-arrival times")
    a3.bar(range(len(r.group_busy_s)), [b / duration_s for b in r.group_busy_s])
    a3.set_xlabel("group")
    a3.set_ylabel("first-stage utilisation")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _ms(seconds: float) -> str:
    """Milliseconds, or "-" where no request was served (every one dropped: no latency)."""
    return "-" if math.isnan(seconds) else f"{1e3 * seconds:.1f}ms"


@app.command("serve")
def serve(
    placement: PlacementOption,
    cluster: ClusterOption,
    replay: Annotated[Path | None, typer.Option("--replay", help="CSV model,arrival_s to send, then stop")] = None,
    port: Annotated[int, typer.Option("--port", help="HTTP port on 127.0.0.1 (0: any free one)")] = 8000,
    serve_s: Annotated[float | None, typer.Option("--serve-s", help="stop after this many seconds")] = None,
) -> None:
    """Serve a placement on torch ranks: HTTP POST /models/<name> on 127.0.0.1, latencies into DuckDB."""
    import time

    from flows.serve import load_cluster, load_placement
    from flows.server import check_port_free
    from planner.errors import MeshplanError

    if not 0 <= port < 65536:
        raise MeshplanError("--port", port, "must be in 0..65535")
    if serve_s is not None and not serve_s > 0:
        raise MeshplanError("--serve-s", serve_s, "must be > 0 seconds")
    if port:
        check_port_free("127.0.0.1", port)  # one line naming --port, before any rank starts
    spec = load_cluster(str(cluster))
    pl = load_placement(placement, spec)  # parsed once; one line for a bad file, before any rank starts
    cfg = load_settings()
    prefect_env(cfg)
    from flows.serve import serve_flow

    run_id = f"serve-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = state(cfg).run(run_id)
    out = serve_flow(pl, spec, str(db_path(cfg)), str(run_dir), run_id, str(replay) if replay else None, port, serve_s)
    typer.echo(f"run {run_id}: {out.recorded} requests recorded in {db_path(cfg)} (table serve_requests)")
    for e in out.group_events:  # a group whose ranks died under load, and what was done
        typer.echo(f"group {e['group']} generation {e['generation']}: {e['event']} at {e['at_s']:.1f}s")
    if replay:
        typer.echo(
            f"{'model':<12} {'p50 meas':>9} {'p50 sim':>9} {'p99 meas':>9} {'p99 sim':>9} {'attain':>7} {'dropped':>7}"
        )
        for m, s in zip(out.measured, out.simulated, strict=True):
            typer.echo(
                f"{m['model']:<12} {_ms(m['p50_s']):>9} {_ms(s['p50_s']):>9} {_ms(m['p99_s']):>9} "
                f"{_ms(s['p99_s']):>9} {100 * m['attainment']:>6.1f}% {m['dropped']:>7}"
            )
        for g in out.groups:  # what each group did with the requests routed to it
            typer.echo(
                f"group {g['group']} ({g['pp']} × {g['tp']}: {', '.join(g['models'])}): requests {g['requests']} "
                f"served {g['ok']} dropped {g['dropped']} p50 {_ms(g['p50_s'])} p99 {_ms(g['p99_s'])}"
            )
        nominal, late = out.simulated_nominal[-1], out.arrival_late_s
        typer.echo(
            f"simulated on the trace's own times: p50 {1e3 * nominal['p50_s']:.1f}ms p99 {1e3 * nominal['p99_s']:.1f}ms"
            + (f" (requests reached the server up to {1e3 * late['max']:.0f} ms late)" if late else "")
        )
