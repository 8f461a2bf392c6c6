"""Prefect tasks of serving: plan placements (cached like the training stages), simulate, run ranks.

`plan_placements` and `simulate_workload` are pure functions of their inputs (workload, cluster,
measured profiles): cached on their stable JSON form (tasks/caching.py). `run_serving` starts the
ranks and the front end, replays a trace, records every request into DuckDB: never cached or retried.
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from launcher.launch import job_exited, kill_group, log_tail, start_logged
from planner.inputs import read_input
from planner.serve.calibrate import measured_samples
from planner.serve.cost import ServeCost
from planner.serve.placement import (
    Placement,
    Problem,
    check_placement,
    one_model_per_group,
    replay_placement,
    resolve_slos,
    search,
    selective_replication,
)
from planner.serve.simulate import Measured
from planner.serve.workload import Trace, Workload, make_trace
from planner.specs.cluster import ClusterSpec
from storage.serve import record_requests
from tasks.caching import stable_inputs
from tasks.serve_http import Router


@task(name="serve-placements", cache_policy=stable_inputs())
def plan_placements(workload: Workload, cluster: ClusterSpec) -> dict[str, Placement]:
    """meshplan's placement and the two baselines, each scored by the simulator on the workload's trace."""
    cost = ServeCost(cluster, workload.dtype)
    p = Problem(workload, cost, make_trace(workload), resolve_slos(workload, cost))
    return {
        "meshplan": search(p),
        "selective-replication": selective_replication(p),
        "one-model-per-group": one_model_per_group(p),
    }


def _post(port: int, name: str, timeout_s: float) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", f"/models/{name}", body=b"{}", headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def replay(port: int, trace: Trace, names: list[str], timeout_s: float = 60.0, t0: float | None = None) -> list[int]:
    """Send each request of `trace` at its arrival time (relative to `t0`, time.monotonic(), default
    now); HTTP statuses in order. Each sending thread keeps its connection open (HTTP/1.1 keep-alive):
    a connect, an accept and a server thread per request would load the CPUs the ranks run on just
    when a burst arrives."""
    t0 = time.monotonic() if t0 is None else t0
    local, conns = threading.local(), []

    def post(name: str) -> int:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
            conns.append(conn)
        try:
            conn.request("POST", f"/models/{name}", body=b"{}", headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status
        except (OSError, http.client.HTTPException):
            conn.close()
            local.conn = None
            return _post(port, name, timeout_s)  # once more, on a fresh connection

    futures = []
    try:
        with ThreadPoolExecutor(max_workers=64) as pool:
            for t, m in zip(trace.arrival_s.tolist(), trace.model.tolist(), strict=True):
                wait = t0 + t - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                futures.append(pool.submit(post, names[m]))
            return [f.result() for f in futures]
    finally:
        for conn in conns:
            conn.close()


def read_calibration(run_dir: Path, pl: Placement) -> dict[tuple[str, int, int, int], tuple[float, ...]]:
    """Per (model, pp, tp, batch 1): the mean service seconds of each stage over the requests the
    ranks served (stage_rank*.json; calib_rank*.json, timed at start-up, where a stage served none).
    Only tp rank 0 of a stage writes these files, keyed by (group, stage); groups of one layout
    hosting the same model pool their figures (the cost model's key has no group)."""
    served: dict[tuple[str, int, int], dict[int, list[float]]] = {}
    started: dict[tuple[str, int, int], dict[int, list[float]]] = {}
    for pattern, into in (("calib_rank*.json", started), ("stage_rank*.json", served)):
        for f in sorted(run_dir.glob(pattern)):
            d = json.loads(f.read_text())
            g = pl.groups[d["group"]]
            times = list(d.get("stage_s", {}).items())
            times += [(r["model"], r["compute_s"]) for r in d.get("requests", [])]
            for name, t in times:
                into.setdefault((name, g.pp, g.tp), {}).setdefault(d["stage"], []).append(t)
    out = {}
    for key, per in started.items():
        mine = served.get(key, {})
        out[(*key, 1)] = tuple(statistics.fmean(mine.get(s) or per[s]) for s in range(key[1]))
    return out


def read_measured(run_dir: Path, pl: Placement, rows: list[dict], t0: float) -> dict[int, Measured]:
    """Per group, the simulator's per-request samples (planner/serve/calibrate.py) from its ranks'
    stage_rank*.json and the router's rows of the replay (`rows`, phase "serve"; `t0`: the router's
    clock at the trace's time 0)."""
    logs: dict[int, dict[int, list[dict]]] = {}
    for f in run_dir.glob("stage_rank*.json"):
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


@task(name="serve-run", cache_policy=NO_CACHE, retries=0)
def run_serving(
    placement_path: str,
    cluster: ClusterSpec,
    db_path: str,
    run_dir: str,
    run_id: str,
    trace_csv: str | None = None,
    port: int = 0,
    warmup: int = 3,
    serve_s: float | None = None,
    timeout_s: float = 600.0,
) -> dict:
    """Start the placement's ranks and front end; replay the trace (or serve for `serve_s` seconds,
    forever when None); record every request; compare the measured latencies with the simulator's
    for the same trace, calibrated with the ranks' measured stage times and front-end overhead."""
    from planner.serve.workload import parse_trace_csv

    pl = Placement.model_validate_json(read_input(placement_path, "--placement", "placement"))
    cost = ServeCost(cluster, pl.dtype)
    check_placement(pl, cost)
    names = [m.name for m in pl.models]
    trace = parse_trace_csv(trace_csv, names, "--replay") if trace_csv is not None else None
    slo = dict(zip(names, resolve_slos(_workload(pl), cost).tolist(), strict=True))
    world = sum(g.pp * g.tp for g in pl.groups)
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    router = Router(pl, slo, run_id)
    cmd = [sys.executable, "-m", "worker.agent", "--nproc-per-node", str(world), "--max-restarts", "0"]
    cmd += ["-m", "worker.serve", "--placement", str(Path(placement_path).resolve()), "--router", router.rank_address]
    cmd += ["--out-dir", str(out)]
    log = out / "serve.log"
    proc = start_logged(cmd, log)
    recorded = 0
    timed: list[dict] = []
    try:
        router.accept_ranks(timeout_s=min(timeout_s, 300.0), alive=lambda: proc.poll() is None)
        http_port = router.start_http(port)
        print(f"serving {', '.join(router.served)} on http://127.0.0.1:{http_port}/models/<name>", flush=True)
        router.phase = "warmup"
        for name in router.served:
            for _ in range(warmup):
                _post(http_port, name, 60.0)
        router.phase = "serve"
        if trace is not None:
            t0 = time.monotonic()
            statuses = replay(http_port, trace, names, t0=t0)
        else:
            statuses = []
            end = time.monotonic() + serve_s if serve_s is not None else float("inf")
            while time.monotonic() < end and proc.poll() is None:
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
                recorded += record_requests(db_path, router.take_rows())
        router.stop()
        rc = proc.wait(timeout=60)
        job_exited(proc)
    except BaseException:
        router.stop()
        kill_group(proc)
        raise
    finally:
        last = router.take_rows()
        recorded += record_requests(db_path, last)
        timed.extend(last)
    if rc != 0:
        raise RuntimeError(f"serving ranks exited {rc}; log {log}:\n{log_tail(log)}")
    calib = read_calibration(out, pl)
    result = {
        "run_id": run_id,
        "recorded": recorded,
        "statuses": statuses,
        "calibration": {str(k): v for k, v in calib.items()},
    }
    if trace is not None:
        # the simulator runs the trace as it reached the router (the replay client sends a burst's
        # requests one by one: they arrive a few ms apart, not at once), each request's front end,
        # stage work, hand-offs and the box's speed over time drawn from the ranks' and the router's
        # logs of this replay (service figures: no request's latency or wait); median p50/p99 over
        # seeded runs. "simulated_nominal": the same on the trace's own times.
        # each request's arrival and finish on the router's monotonic clock, beside the ranks' stage logs
        keep = ("request_id", "model", "grp", "phase", "status", "t_arrival", "t_finish")
        (out / "router.json").write_text(json.dumps([{k: r.get(k) for k in keep} for r in timed]))
        measured = read_measured(out, pl, timed, t0)
        ccost = ServeCost(cluster, pl.dtype, calibration=calib)
        rows = sorted((r for r in timed if r["phase"] == "serve"), key=lambda r: r["t_arrival"])
        received = Trace(
            np.array([r["t_arrival"] - t0 for r in rows]),
            np.array([names.index(r["model"]) for r in rows], dtype=np.int64),
            trace.duration_s,
        )
        result["simulated"] = replay_placement(pl, ccost, received, measured)
        result["simulated_nominal"] = replay_placement(pl, ccost, trace, measured)
        if len(received) == len(trace) and len(trace):
            late = received.arrival_s - trace.arrival_s
            result["arrival_late_s"] = {"p50": float(np.median(late)), "max": float(late.max())}
    return result


def _workload(pl: Placement) -> Workload:
    return Workload(name="placement", models=pl.models, max_batch=pl.max_batch, dtype=pl.dtype)


def measured_stats(rows, names: list[str], duration_s: float) -> list[dict]:
    """The simulator's per-model table for measured rows (polars frame of serve_requests)."""
    import numpy as np

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
