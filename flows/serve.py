"""Serving flows: `serve_plan_flow` (placements vs baselines, cached) and `serve_flow` (ranks + replay).

serve_plan_flow parses the workload and cluster, reads the serving figures fitted on earlier serving
runs (per device kind, pooled over runs: storage/serve.load_serving) into the cost model, runs the
cached placement task (meshplan's search and the two baselines, each scored by the simulator) and
publishes the comparison as a Markdown artifact. serve_flow starts the placement on torch ranks behind the HTTP front end, replays a trace
(or serves for a while), records every request into DuckDB and publishes measured vs simulated
latencies, the simulator calibrated with the ranks' own stage times; the run's serving figures
(front end, reply, hand-off, tp scaling: planner/serve/calibrate.fit_serving) are stored per device
kind for the next serve-plan.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.outcomes import ServeOutcome
from planner.errors import MeshplanError
from planner.inputs import read_input
from planner.serve.cost import ServeCost
from planner.serve.placement import Placement, check_placement
from planner.serve.workload import parse_trace_csv, parse_workload_toml
from planner.specs.cluster import ClusterSpec, parse_cluster_toml
from planner.validation import parse
from storage.serve import load_serving, serve_requests
from tasks.serve import plan_placements, run_serving

_KINDS = {"--trace": "trace", "--replay": "replay", "--placement": "placement", "--workload": "workload"}


def read_file(path: str | Path, what: str) -> str:
    """The text of the file given as `what` (planner.inputs: exists, bounded, UTF-8)."""
    return read_input(path, what, _KINDS.get(what, what.lstrip("-")))


def load_cluster(path: str) -> ClusterSpec:
    return parse_cluster_toml(read_file(path, "--cluster"), path)


def load_placement(path: str | Path, cluster: ClusterSpec) -> Placement:
    """The placement file, parsed once and checked against the cluster it is served or simulated on:
    one line naming the field for a malformed file, a device kind or id the cluster lacks, or
    weights that do not fit."""
    text = read_file(path, "--placement")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise MeshplanError(
            "--placement", str(path), f"not valid JSON ({exc}); write it with serve-plan --out"
        ) from None
    pl = parse(Placement, data, str(path))
    kinds = sorted({n.device_kind for n in cluster.nodes})
    for i, g in enumerate(pl.groups):
        if g.kind not in kinds:
            raise MeshplanError(
                f"groups[{i}].kind",
                g.kind,
                f"cluster {cluster.name!r} has {', '.join(kinds)} devices only; the placement was made for another "
                "cluster: run serve-plan --cluster with this one",
            )
    check_placement(pl, ServeCost(cluster, pl.dtype))
    return pl


def placement_table(placements: dict[str, Placement]) -> list[str]:
    """Markdown: meshplan's groups, then each method's predicted attainment and search time."""
    best = placements["meshplan"]
    lines = ["| group | devices | kind | pp × tp | models |", "|---|---|---|---|---|"]
    for i, g in enumerate(best.groups):
        devs = f"{g.devices[0]}–{g.devices[-1]}" if len(g.devices) > 1 else str(g.devices[0])
        lines.append(f"| {i} | {devs} | {g.kind} | {g.pp} × {g.tp} | {', '.join(g.models) or '-'} |")
    lines += ["", "| placement | SLO attainment | groups | search s |", "|---|---|---|---|"]
    for name, pl in placements.items():
        lines.append(f"| {name} | {100 * (pl.attainment or 0):.2f} % | {len(pl.groups)} | {pl.search_s:.2f} |")
    return lines


def serving_lines(db_path: str | None, cluster: ClusterSpec) -> list[str]:
    """One line per device kind of `cluster` with serving figures fitted on earlier serving runs."""
    kinds = {n.device_kind for n in cluster.nodes}
    found = load_serving(db_path) if db_path else {}
    return [
        f"serving figures for {k} (fitted on {runs} serving run(s), {reqs} requests): front end "
        f"{1e3 * f.front_s:.2f} ms, reply {1e3 * f.reply_s:.2f} ms, hand-off {1e3 * f.handoff_s:.2f} ms, "
        f"tp serial share {f.tp_serial:.2f}"
        for k, (f, runs, reqs) in found.items()
        if k in kinds
    ]


@flow(name="serve-plan")
def serve_plan_flow(
    workload_path: str, cluster_path: str, out: str | None = None, db_path: str | None = None
) -> dict[str, Placement]:
    """`db_path`: the store whose serving runs' figures (per device kind) the cost model takes."""
    workload = parse_workload_toml(read_file(workload_path, "--workload"), workload_path)
    cluster = load_cluster(cluster_path)
    kinds = {n.device_kind for n in cluster.nodes}
    serving = {k: f for k, (f, _, _) in (load_serving(db_path) if db_path else {}).items() if k in kinds}
    placements = plan_placements(workload, cluster, serving)
    if out:
        Path(out).write_text(placements["meshplan"].model_dump_json(indent=2))
    create_markdown_artifact(
        "\n".join(["# Serving placement", "", *placement_table(placements), "", *serving_lines(db_path, cluster)]),
        key="serve-placement",
        description="meshplan's placement vs selective replication and one model per group",
    )
    return placements


@flow(name="serve")
def serve_flow(
    placement: Placement,
    cluster: ClusterSpec,
    db_path: str,
    run_dir: str,
    run_id: str,
    replay: str | None = None,
    port: int = 0,
    serve_s: float | None = None,
) -> ServeOutcome:
    """Serve `placement` (parsed and checked once: load_placement) on torch ranks behind HTTP."""
    names = [m.name for m in placement.models]
    trace = parse_trace_csv(read_file(replay, "--replay"), names, "--replay") if replay else None
    run = run_serving(placement, cluster, db_path, run_dir, run_id, trace, port, serve_s=serve_s)
    fields = run.model_dump()  # python mode: a model that served nothing keeps its NaN p50 (JSON would make it None)
    if trace is None:
        return ServeOutcome(**fields)
    rows = serve_requests(db_path, run_id)
    out = ServeOutcome(
        **fields, measured=measured_stats(rows, names, trace.duration_s), groups=group_stats(rows, placement)
    )
    lines = [
        "# Serving replay: measured vs simulated",
        "",
        "| model | p50 measured | p50 simulated | p99 measured | p99 simulated | attainment |",
        "|---|---|---|---|---|---|",
    ]
    for m, s in zip(out.measured, out.simulated, strict=True):
        lines.append(
            f"| {m['model']} | {m['p50_s'] * 1e3:.1f} ms | {s['p50_s'] * 1e3:.1f} ms | {m['p99_s'] * 1e3:.1f} ms | "
            f"{s['p99_s'] * 1e3:.1f} ms | {100 * m['attainment']:.1f} % |"
        )
    lines += [
        "",
        "| group | pp × tp | models | requests | served | dropped | p50 | p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in out.groups:
        lines.append(
            f"| {g['group']} | {g['pp']} × {g['tp']} | {', '.join(g['models'])} | {g['requests']} | {g['ok']} | "
            f"{g['dropped']} | {g['p50_s'] * 1e3:.1f} ms | {g['p99_s'] * 1e3:.1f} ms |"
        )
    create_markdown_artifact("\n".join(lines), key="serve-replay", description="measured vs simulated latency")
    return out


def measured_stats(rows, names: list[str], duration_s: float) -> list[dict]:
    """The simulator's per-model table for measured rows (polars frame of serve_requests)."""
    from planner.serve.simulate import SimResult as _R

    serve = rows.filter(rows["phase"] == "serve")
    lat = np.array([np.nan if v is None else v for v in serve["latency_s"].to_list()], dtype=float)
    model = np.array([names.index(n) for n in serve["model"].to_list()], dtype=np.int64)
    slo = np.zeros(len(names))
    for n, s in zip(serve["model"].to_list(), serve["slo_s"].to_list(), strict=True):
        slo[names.index(n)] = s
    return _R(lat, model, slo, duration_s, []).per_model(names)


def group_stats(rows, pl: Placement) -> list[dict]:
    """Per group of the placement: its layout, the models it hosts, and what it did with the replay's
    requests the router sent it (polars frame of serve_requests): served, dropped at its lead (their
    predicted finish passed the deadline), p50/p99 latency of the served ones."""
    serve = rows.filter(rows["phase"] == "serve")
    out = []
    for gi, g in enumerate(pl.groups):
        mine = serve.filter(serve["grp"] == gi)
        lat = np.array(
            [
                v
                for v, st in zip(mine["latency_s"].to_list(), mine["status"].to_list(), strict=True)
                if st == "ok" and v is not None
            ],
            dtype=float,
        )
        out.append(
            {
                "group": gi,
                "pp": g.pp,
                "tp": g.tp,
                "models": list(g.models),
                "requests": mine.height,
                "ok": int(len(lat)),
                "dropped": int((mine["status"] == "dropped").sum()),
                "p50_s": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
                "p99_s": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
            }
        )
    return out
