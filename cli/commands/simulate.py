"""`meshplan simulate`: replay a job trace on a cluster under one policy (or all), no ranks launched.

Speed comes from `--speed` (a measured table in the trace's sim_lookup.csv format) or, without it,
from meshplan's own cost model (`planner.search`, jobs naming model presets). Prints the summary
and saves a plot: GPU utilisation by kind over time and a Gantt of the jobs (matplotlib, Agg).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.app import app, check_output
from planner.limits import MAX_SECONDS


def _cluster(path: Path):
    from planner.inputs import read_input
    from planner.scheduler.trace import cluster_from_csv, cluster_from_spec
    from planner.specs.cluster import parse_cluster_toml

    text = read_input(path, "--cluster", "cluster")
    if path.suffix == ".csv":
        return cluster_from_csv(text, str(path)), None
    spec = parse_cluster_toml(text, str(path))
    return cluster_from_spec(spec), spec


@app.command()
def simulate(
    trace: Annotated[Path, typer.Option("--trace", help="jobs CSV (Arena/Philly or meshplan format)")],
    cluster: Annotated[Path, typer.Option("--cluster", help="cluster TOML (or the trace's cluster.csv)")],
    policy: Annotated[
        str,
        typer.Option(
            "--policy", help="srtf (default), jct, throughput, deadline, fairness, fcfs, gavel, crius, sia or all"
        ),
    ] = "srtf",
    speed: Annotated[
        Path | None, typer.Option("--speed", help="measured iteration times (sim_lookup.csv format)")
    ] = None,
    plot: Annotated[Path, typer.Option("--plot", help="where to save the plot (PNG or SVG)")] = Path("simulate.png"),
    round_s: Annotated[
        float, typer.Option("--round-s", min=0.001, max=MAX_SECONDS, help="scheduling round, seconds")
    ] = 300.0,
) -> None:
    """Replay a trace round by round and report JCT, queueing, makespan and utilisation per policy."""
    from planner.errors import MeshplanError
    from planner.scheduler import POLICIES, PlannerSpeed, Policy, TableSpeed
    from planner.scheduler.simulate import simulate as run_sim
    from planner.scheduler.trace import parse_jobs, parse_lookup

    check_output(plot, "--plot", trace, cluster, speed)
    cl, spec = _cluster(cluster)
    from planner.inputs import read_input

    jobs = parse_jobs(read_input(trace, "--trace", "jobs"), set(cl.kinds), str(trace))
    names = list(POLICIES) if policy == "all" else [policy]
    rows = parse_lookup(read_input(speed, "--speed", "speed"), str(speed)) if speed else None
    if rows is None and spec is None:
        raise MeshplanError(
            "--speed", None, "a cluster.csv has no device specs to price with: pass --speed or a cluster TOML"
        )
    results = []
    for name in names:
        source = TableSpeed(rows) if rows is not None else PlannerSpeed.from_cluster(spec)
        r = run_sim(jobs, cl, Policy(name), source, round_s=round_s)
        results.append(r)
        typer.echo(
            f"{name:<11} avg JCT {r.avg_jct_s / 3600:.2f} h  p99 {r.p99_jct_s / 3600:.2f} h  queue {r.avg_queue_s / 3600:.2f} h"
            f"  makespan {r.makespan_s / 86400:.2f} d  finished {r.finished}  rejected {r.rejected}  resizes {r.resizes}"
        )
        for o in r.jobs:
            if o.rejected:
                typer.echo(f"  rejected {o.job_id}: {o.rejected}")
    save_plot(results[0], plot)
    typer.echo(f"plot ({results[0].policy}): {plot}")


def save_plot(r, path: Path, max_jobs: int = 200) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    t0 = r.times_s[0] if r.times_s else 0.0
    hours = [(t - t0) / 3600 for t in r.times_s]
    for k in r.kinds:
        ax1.plot(hours, [b / r.kind_totals[k] for b in r.busy[k]], label=k, lw=0.8)
    ax1.set_ylabel("GPUs busy (fraction)")
    ax1.set_title(f"policy {r.policy}: utilisation by GPU kind")
    ax1.legend(loc="upper right")
    colours = {k: f"C{i}" for i, k in enumerate(r.kinds)}
    shown = sorted((o for o in r.jobs if o.segments), key=lambda o: o.submit_s)[:max_jobs]
    for y, o in enumerate(shown):
        for s, e, k, _ in o.segments:
            ax2.barh(y, (e - s) / 3600, left=(s - t0) / 3600, color=colours[k], height=0.8)
    ax2.set_ylabel(f"job (first {len(shown)} by arrival)")
    ax2.set_xlabel("hours since the first arrival")
    ax2.set_title("Gantt: colour = GPU kind")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
