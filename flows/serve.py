"""Serving flows: `serve_plan_flow` (placements vs baselines, cached) and `serve_flow` (ranks + replay).

serve_plan_flow parses the workload and cluster, runs the cached placement task (meshplan's search
and the two baselines, each scored by the simulator) and publishes the comparison as a Markdown
artifact. serve_flow starts the placement on torch ranks behind the HTTP front end, replays a trace
(or serves for a while), records every request into DuckDB and publishes measured vs simulated
latencies, the simulator calibrated with the ranks' own stage times.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from planner.inputs import read_input
from planner.serve.placement import Placement
from planner.serve.workload import parse_workload_toml
from planner.specs.cluster import ClusterSpec, parse_cluster_toml
from storage.serve import serve_requests
from tasks.serve import group_stats, measured_stats, plan_placements, run_serving

_KINDS = {"--trace": "trace", "--replay": "replay", "--placement": "placement", "--workload": "workload"}


def read_file(path: str | Path, what: str) -> str:
    """The text of the file given as `what` (planner.inputs: exists, bounded, UTF-8)."""
    return read_input(path, what, _KINDS.get(what, what.lstrip("-")))


def load_cluster(path: str) -> ClusterSpec:
    return parse_cluster_toml(read_file(path, "--cluster"), path)


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


@flow(name="serve-plan")
def serve_plan_flow(workload_path: str, cluster_path: str, out: str | None = None) -> dict[str, Placement]:
    workload = parse_workload_toml(read_file(workload_path, "--workload"), workload_path)
    cluster = load_cluster(cluster_path)
    placements = plan_placements(workload, cluster)
    if out:
        Path(out).write_text(placements["meshplan"].model_dump_json(indent=2))
    create_markdown_artifact(
        "\n".join(["# Serving placement", "", *placement_table(placements)]),
        key="serve-placement",
        description="meshplan's placement vs selective replication and one model per group",
    )
    return placements


@flow(name="serve")
def serve_flow(
    placement_path: str,
    cluster_path: str,
    db_path: str,
    run_dir: str,
    run_id: str,
    replay: str | None = None,
    port: int = 0,
    serve_s: float | None = None,
) -> dict:
    cluster = load_cluster(cluster_path)
    trace_csv = read_file(replay, "--replay") if replay else None
    out = run_serving(placement_path, cluster, db_path, run_dir, run_id, trace_csv, port, serve_s=serve_s)
    if replay:
        from planner.serve.workload import parse_trace_csv

        pl = Placement.model_validate_json(read_file(placement_path, "--placement"))
        names = [m.name for m in pl.models]
        duration = parse_trace_csv(trace_csv or "", names, "--replay").duration_s
        rows = serve_requests(db_path, run_id)
        out["measured"] = measured_stats(rows, names, duration)
        out["groups"] = group_stats(rows, pl)
        lines = [
            "# Serving replay: measured vs simulated",
            "",
            "| model | p50 measured | p50 simulated | p99 measured | p99 simulated | attainment |",
            "|---|---|---|---|---|---|",
        ]
        for m, s in zip(out["measured"], out["simulated"], strict=True):
            lines.append(
                f"| {m['model']} | {m['p50_s'] * 1e3:.1f} ms | {s['p50_s'] * 1e3:.1f} ms | {m['p99_s'] * 1e3:.1f} ms | "
                f"{s['p99_s'] * 1e3:.1f} ms | {100 * m['attainment']:.1f} % |"
            )
        lines += [
            "",
            "| group | pp × tp | models | requests | served | dropped | p50 | p99 |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for g in out["groups"]:
            lines.append(
                f"| {g['group']} | {g['pp']} × {g['tp']} | {', '.join(g['models'])} | {g['requests']} | {g['ok']} | "
                f"{g['dropped']} | {g['p50_s'] * 1e3:.1f} ms | {g['p99_s'] * 1e3:.1f} ms |"
            )
        create_markdown_artifact("\n".join(lines), key="serve-replay", description="measured vs simulated latency")
    return out
