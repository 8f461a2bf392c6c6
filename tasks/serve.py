"""Prefect tasks of serving: plan placements (cached like the training stages), simulate, run ranks.

`plan_placements` and `simulate_workload` are pure functions of their inputs (workload, cluster,
measured profiles): cached on their stable JSON form (tasks/caching.py). `run_serving` starts the
ranks and the front end, replays a trace, records every request into DuckDB: never cached or retried.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict

import rundir
from launcher.launch import log_tail
from launcher.router import Router, post, replay
from launcher.serving import Serving
from planner.serve.calibrate import measured_samples
from planner.serve.cost import ServeCost
from planner.serve.placement import (
    Placement,
    Problem,
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


class GroupEvent(BaseModel):
    """A serving group's ranks died, were started again, or were given up on (launcher/serving.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    group: int
    generation: int
    event: str  # died | restarted | gave-up
    at_s: float  # seconds since the ranks started
    returncode: int | None = None


class ServeRun(BaseModel):
    """What run_serving measured: requests recorded, the replay's statuses, the calibration, the simulator's figures."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    run_id: str
    run_dir: str
    recorded: int  # rows written to serve_requests
    statuses: list[int] = []  # HTTP status of each replayed request, in trace order
    calibration: dict[str, tuple[float, ...]] = {}  # str((model, pp, tp, batch)) -> seconds per stage
    group_events: list[GroupEvent] = []
    simulated: list[dict] = []  # replay only: the simulator's per-model table, calibrated
    simulated_nominal: list[dict] = []  # the same on the trace's own arrival times
    arrival_late_s: dict[str, float] | None = None  # how late requests reached the router (p50, max)


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


def read_calibration(run_dir: Path, pl: Placement) -> dict[tuple[str, int, int, int], tuple[float, ...]]:
    """Per (model, pp, tp, batch 1): the mean service seconds of each stage over the requests the
    ranks served (stage_rank*.json; calib_rank*.json, timed at start-up, where a stage served none).
    Only tp rank 0 of a stage writes these files, keyed by (group, stage); groups of one layout
    hosting the same model pool their figures (the cost model's key has no group)."""
    served: dict[tuple[str, int, int], dict[int, list[float]]] = {}
    started: dict[tuple[str, int, int], dict[int, list[float]]] = {}
    for files, into in ((rundir.serve_calib_files(run_dir), started), (rundir.serve_stage_log_files(run_dir), served)):
        for f in files:
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


@task(name="serve-run", cache_policy=NO_CACHE, retries=0)
def run_serving(
    pl: Placement,
    cluster: ClusterSpec,
    db_path: str,
    run_dir: str,
    run_id: str,
    trace: Trace | None = None,
    port: int = 0,
    warmup: int = 3,
    serve_s: float | None = None,
    timeout_s: float = 300.0,
) -> ServeRun:
    """Start the placement's ranks (launcher/serving.py) behind the router (launcher/router.py);
    replay the trace (or serve for `serve_s` seconds, forever when None), recording every request
    into DuckDB as it is answered; then compare the measured latencies with the simulator's for the
    same trace, calibrated with the ranks' measured stage times and front-end overhead."""
    cost = ServeCost(cluster, pl.dtype)
    names = [m.name for m in pl.models]
    slo = dict(zip(names, resolve_slos(_workload(pl), cost).tolist(), strict=True))
    rundir.serve_placement_path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    rundir.serve_placement_path(run_dir).write_text(pl.model_dump_json())  # what every rank reads
    router = Router(pl, slo, run_id)
    ranks = Serving(pl, router, run_dir)
    recorded, timed, statuses, t0 = 0, [], [], 0.0
    try:
        ranks.start(timeout_s)
        http_port = router.start_http(port)
        print(f"serving {', '.join(router.served)} on http://127.0.0.1:{http_port}/models/<name>", flush=True)
        router.phase = "warmup"
        for name in router.served:
            for _ in range(warmup):
                post(http_port, name, 60.0)
        router.phase = "serve"
        if trace is not None:
            t0 = time.monotonic()
            done = threading.Event()

            def record_meanwhile() -> None:  # rows reach DuckDB while the replay runs
                nonlocal recorded
                while not done.wait(1.0):
                    rows = router.take_rows()
                    timed.extend(rows)
                    recorded += record_requests(db_path, rows)

            writer = threading.Thread(target=record_meanwhile, daemon=True)
            writer.start()
            try:
                statuses = replay(http_port, trace, names, t0=t0)
            finally:
                done.set()
                writer.join()
        else:
            end = time.monotonic() + serve_s if serve_s is not None else float("inf")
            while time.monotonic() < end and ranks.alive():
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
                recorded += record_requests(db_path, router.take_rows())
        router.stop_http()
        codes = ranks.stop()
    except BaseException:
        router.stop_http()
        ranks.stop(0.0)
        raise
    finally:
        router.close()
        last = router.take_rows()
        recorded += record_requests(db_path, last)
        timed.extend(last)
    events = [GroupEvent(**vars(e)) for e in ranks.events]
    bad = [(gi, rc) for gi, rc in enumerate(codes) if rc != 0 and not ranks.gave_up[gi]]
    if bad and not events:
        gi, rc = bad[0]
        log = rundir.serve_log(run_dir, gi)
        raise RuntimeError(f"serving group {gi}'s ranks exited {rc}; log {log}:\n{log_tail(log)}")
    calib = read_calibration(Path(run_dir), pl)
    result: dict = {
        "run_id": run_id,
        "run_dir": run_dir,
        "recorded": recorded,
        "statuses": statuses,
        "calibration": {str(k): v for k, v in calib.items()},
        "group_events": events,
    }
    if trace is not None:
        # the simulator runs the trace as it reached the router (the replay client sends a burst's
        # requests one by one: they arrive a few ms apart, not at once), each request's front end,
        # stage work, hand-offs and the box's speed over time drawn from the ranks' and the router's
        # logs of this replay (service figures: no request's latency or wait); median p50/p99 over
        # seeded runs. "simulated_nominal": the same on the trace's own times.
        # each request's arrival and finish on the router's monotonic clock, beside the ranks' stage logs
        keep = ("request_id", "model", "grp", "phase", "status", "t_arrival", "t_finish")
        rundir.router_log_path(run_dir).write_text(json.dumps([{k: r.get(k) for k in keep} for r in timed]))
        measured = read_measured(Path(run_dir), pl, timed, t0)
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
    return ServeRun(**result)


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
