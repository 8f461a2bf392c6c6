"""Serving requests (table `serve_requests`), written by the request front end, read by reports; the
serving run folder's rank files (calib_rankR.json, stage_rankR.json) read into the simulator's
calibration; and each run's fitted serving figures per device kind (table `serve_calibrations`),
pooled per kind for the next serve-plan."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import polars as pl

import rundir
from planner.serve.calibrate import measured_samples
from planner.serve.cost import KindServing
from planner.serve.placement import Placement
from planner.serve.simulate import Measured
from storage.db import connect

COLUMNS = ("run_id", "request_id", "model", "grp", "phase", "arrival_s", "latency_s", "status", "slo_s")


def record_requests(db_path: str | Path, rows: list[dict]) -> int:
    """Insert (or replace, by run id and request id) request rows; returns how many. One statement
    for the whole batch (a frame): a row-by-row executemany took minutes for 10,000 rows."""
    if not rows:
        return 0
    frame = pl.DataFrame(
        {c: [r.get(c) for r in rows] for c in COLUMNS},
        schema={
            "run_id": pl.String,
            "request_id": pl.Int64,
            "model": pl.String,
            "grp": pl.Int32,
            "phase": pl.String,
            "arrival_s": pl.Float64,
            "latency_s": pl.Float64,
            "status": pl.String,
            "slo_s": pl.Float64,
        },
    )
    cols = ", ".join(COLUMNS)
    with connect(db_path) as con:
        con.register("serve_rows", frame)
        con.execute(f"INSERT OR REPLACE INTO serve_requests ({cols}) SELECT {cols} FROM serve_rows")
        con.unregister("serve_rows")
    return len(rows)


def serve_requests(db_path: str | Path, run_id: str | None = None) -> pl.DataFrame:
    with connect(db_path) as con:
        sql = f"SELECT {', '.join(COLUMNS)} FROM serve_requests"
        if run_id is None:
            return con.sql(sql + " ORDER BY run_id, request_id").pl()
        return con.sql(sql + " WHERE run_id = ? ORDER BY request_id", params=[run_id]).pl()


def read_calibration(run_dir: Path, pl: Placement) -> dict[tuple[str, str, int, int, int], tuple[float, ...]]:
    """Per (device kind, model, pp, tp, batch 1): the mean service seconds of each stage over the requests the
    ranks served (stage_rank*.json; calib_rank*.json, timed at start-up, where a stage served none).
    Only tp rank 0 of a stage writes these files, keyed by (group, stage); groups of one layout
    of one device kind hosting the same model pool their figures (the cost model's key has no group)."""
    served: dict[tuple[str, str, int, int], dict[int, list[float]]] = {}
    started: dict[tuple[str, str, int, int], dict[int, list[float]]] = {}
    for files, into in ((rundir.serve_calib_files(run_dir), started), (rundir.serve_stage_log_files(run_dir), served)):
        for f in files:
            d = json.loads(f.read_text())
            g = pl.groups[d["group"]]
            times = list(d.get("stage_s", {}).items())
            times += [(r["model"], r["compute_s"]) for r in d.get("requests", [])]
            for name, t in times:
                into.setdefault((g.kind, name, g.pp, g.tp), {}).setdefault(d["stage"], []).append(t)
    out = {}
    for key, per in started.items():
        mine = served.get(key, {})
        out[(*key, 1)] = tuple(statistics.fmean(mine.get(s) or per[s]) for s in range(key[2]))
    return out


def read_measured(run_dir: Path, pl: Placement, rows: list[dict], t0: float) -> dict[int, Measured]:
    """Per group, the simulator's per-request samples (planner/serve/calibrate.py) from its ranks'
    stage_rank*.json and the router's rows of the replay (`rows`, phase "serve"; `t0`: the router's
    clock at the trace's time 0)."""
    logs: dict[int, dict[int, list[dict]]] = {}
    for f in rundir.serve_stage_log_files(run_dir):
        d = json.loads(f.read_text())
        logs.setdefault(d["group"], {})[d["stage"]] = d["requests"]
    names = [m.name for m in pl.models]
    out = {}
    for gi, by_stage in logs.items():
        if len(by_stage) != pl.groups[gi].pp or not all("t_fwd" in e for log in by_stage.values() for e in log):
            continue  # an older rank's log (no time stamps): the group keeps its mean stage times
        mine = [r for r in rows if r["grp"] == gi and r["phase"] == "serve" and r["status"] == "ok"]
        out[gi] = measured_samples([by_stage[s] for s in range(pl.groups[gi].pp)], mine, names, t0)
    return out


def save_serving(db_path: str | Path, run_id: str, figures: dict[str, KindServing], requests: dict[str, int]) -> int:
    """One row per device kind of a serving run's fitted figures (planner/serve/calibrate.fit_serving),
    with the requests they were measured on (a kind with none is not stored); returns the rows written."""
    rows = [(k, f) for k, f in sorted(figures.items()) if requests.get(k, 0) > 0]
    with connect(db_path) as con:
        for kind, f in rows:
            con.execute(
                "INSERT OR REPLACE INTO serve_calibrations (run_id, device_kind, front_s, reply_s, handoff_s,"
                " tp_serial, requests) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [run_id, kind, f.front_s, f.reply_s, f.handoff_s, f.tp_serial, int(requests[kind])],
            )
    return len(rows)


def load_serving(db_path: str | Path) -> dict[str, tuple[KindServing, int, int]]:
    """Per device kind, every serving run's figures pooled (means weighted by each run's requests):
    (figures, runs, requests). Empty when the store does not exist yet."""
    if not Path(db_path).exists():
        return {}
    with connect(db_path) as con:
        rows = con.execute(
            "SELECT device_kind, sum(front_s * requests) / sum(requests), sum(reply_s * requests) / sum(requests),"
            " sum(handoff_s * requests) / sum(requests), sum(tp_serial * requests) / sum(requests), count(*),"
            " sum(requests) FROM serve_calibrations GROUP BY device_kind ORDER BY device_kind"
        ).fetchall()
    return {k: (KindServing(fr, rp, ho, ts), int(n), int(r)) for k, fr, rp, ho, ts, n, r in rows}
