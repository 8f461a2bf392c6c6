"""`meshplan discover`: measure this machine (or record a cluster file) and show what was found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.app import app, db_path, load_settings, prefect_env, state


@app.command()
def discover(
    cluster: Annotated[Path | None, typer.Option("--cluster", help="cluster TOML file instead of probing")] = None,
    num_ranks: Annotated[
        int | None, typer.Option("--num-ranks", min=1, max=64, help="CPU ranks to probe (no GPU)")
    ] = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="re-measure even if this hardware is stored")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
    executor: Annotated[
        str, typer.Option("--executor", help="local: this machine | slurm: --nodes allocated nodes, one sbatch job")
    ] = "local",
    nodes: Annotated[int, typer.Option("--nodes", help="slurm: nodes to allocate and measure")] = 2,
    partition: Annotated[str | None, typer.Option("--partition", help="slurm: sbatch --partition")] = None,
    nodelist: Annotated[str | None, typer.Option("--nodelist", help="slurm: sbatch --nodelist")] = None,
) -> None:
    """Discover the hardware: probe compute, memory and network (torchrun), or record a cluster file.

    --executor slurm measures --nodes nodes of a Slurm cluster (links between them too) as one batch
    job; the state folder must be on storage the nodes share."""
    extra = []
    if cluster is not None:
        extra.append(f"discover.cluster={json.dumps(str(cluster))}")  # a JSON string is a TOML string
    if num_ranks is not None:
        extra.append(f"discover.num_ranks={num_ranks}")
    if refresh:
        extra.append("discover.refresh=true")
    cfg = load_settings(extra, {"discover.cluster": "--cluster", "discover.num_ranks": "--num-ranks"})
    from planner.errors import MeshplanError

    if executor not in ("local", "slurm"):
        raise MeshplanError("--executor", executor, "use local (this machine) or slurm (sbatch)")
    if executor == "slurm" and (nodes < 1 or cfg.discover.cluster):
        raise MeshplanError("--nodes", nodes, "give 1 or more nodes to measure (and no --cluster file)")
    if cfg.discover.cluster:
        _check_cluster_file(Path(cfg.discover.cluster))
    prefect_env(cfg)

    from flows.discover import discover_flow, slurm_discovery
    from flows.queries import hardware_snapshot

    d, path = cfg.discover, db_path(cfg)
    run_dir = state(cfg).discovery()  # the bench's snapshot and log, kept like any run's (rundir/state.py)
    slurm = slurm_discovery(nodes, partition, nodelist) if executor == "slurm" else {}
    summary = discover_flow(
        db_path=str(path),
        cluster_file=d.cluster or None,
        num_ranks=d.num_ranks,
        refresh=d.refresh,
        message_sizes=list(d.message_sizes),
        repeats=d.repeats,
        matmul_size=d.matmul_size,
        timeout_s=d.timeout_s,
        run_dir=None if d.cluster else str(run_dir),
        **slurm,
    )
    snap = hardware_snapshot(path, summary.fingerprint)
    if as_json:
        print(
            json.dumps(
                {
                    **summary.model_dump(mode="json"),
                    "db": str(path),
                    "cluster": snap.cluster.model_dump(mode="json"),
                    "devices": snap.devices.to_dicts(),
                    "fits": snap.fits.to_dicts(),
                    "unsupported": snap.unsupported.to_dicts(),
                },
                default=str,
            )
        )
        return
    _print_tables(summary, snap, path)


def _check_cluster_file(path: Path) -> None:
    """Fail in milliseconds on a bad file, before Prefect's server starts (the flow's task parses it again)."""
    from planner.inputs import read_input
    from planner.specs.cluster import parse_cluster_toml

    parse_cluster_toml(read_input(path, "--cluster", "cluster", "see examples/clusters/"), origin=path.name)


def _gb(x: Any, scale: float = 1e9, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x / scale)


def _print_tables(summary: Any, snap: Any, path: Path) -> None:
    import polars as pl

    from cli.commands.tables import Col, console, print_table

    con = console()
    devices = snap.devices.group_by("node", "kind", maintain_order=True).agg(
        pl.len().alias("count"),
        pl.col("memory_bytes").first(),
        pl.col("peak_flop_per_s").first(),
        pl.col("measured_flop_per_s").median(),
        pl.col("matmul_dtype").first(),
        pl.col("memory_bandwidth_bytes_per_s").median(),
    )
    cols = [Col("node", keep=9), Col("kind", keep=9), Col("count", keep=8, right=True)]
    cols += [Col("memory GB", keep=6, right=True), Col("planner GFLOP/s", keep=4, right=True)]
    cols += [Col("measured GFLOP/s", keep=7, right=True), Col("dtype", keep=3), Col("mem GB/s", keep=5, right=True)]
    rows = [
        [
            r["node"],
            r["kind"],
            str(r["count"]),
            _gb(r["memory_bytes"]),
            _gb(r["peak_flop_per_s"], fmt="{:,.1f}"),
            _gb(r["measured_flop_per_s"], fmt="{:,.1f}"),
            r["matmul_dtype"] or "-",
            _gb(r["memory_bandwidth_bytes_per_s"]),
        ]
        for r in devices.iter_rows(named=True)
    ]
    print_table(f"devices of {snap.name} ({snap.source})", cols, rows, con=con, full="--json")

    cols = [Col("node", keep=9), Col("class", keep=8), Col("kind", keep=7), Col("α µs", keep=6, right=True)]
    cols += [Col("bandwidth GB/s", keep=6, right=True), Col("measured", keep=5)]
    rows = [
        [
            r["node"],
            r["link_class"],
            r["kind"],
            f"{r['latency_s'] * 1e6:.1f}",
            _gb(r["bandwidth_bytes_per_s"], fmt="{:.3f}"),
            "yes" if r["measured"] else "no",
        ]
        for r in snap.links.iter_rows(named=True)
    ]
    print_table("links (per device, per direction)", cols, rows, con=con, full="--json")
    for r in snap.links.iter_rows(named=True):
        con.print(f"  {r['node']} {r['link_class']}: {r['source'] or 'from the cluster file'}", highlight=False)

    if snap.fits.height:
        cols = [Col("op", keep=9), Col("class", keep=9), Col("α µs", keep=6, right=True)]
        cols += [Col("bandwidth GB/s", keep=6, right=True), Col("r²", keep=4, right=True)]
        cols += [Col("points", keep=3, right=True)]
        rows = [
            [
                r["op"],
                r["link_class"],
                f"{r['alpha_s'] * 1e6:.1f}",
                _gb(r["bandwidth_bytes_per_s"], fmt="{:.3f}"),
                f"{r['r2']:.3f}",
                str(r["num_points"]),
            ]
            for r in snap.fits.iter_rows(named=True)
        ]
        print_table("α–β fits (t = α + bytes / bandwidth)", cols, rows, con=con, full="--json")
    for r in snap.unsupported.iter_rows(named=True):
        con.print(f"unsupported on this backend: {r['op']} ({r['reason']})")
    state = "reused the stored snapshot (pass --refresh to re-measure)" if summary.reused else "recorded"
    con.print(f"hardware {summary.fingerprint}: {state} in {path}")
