"""Prefect tasks of serving: plan placements (cached like the training stages), simulate, run ranks.

`plan_placements` is a pure function of its inputs (workload, cluster): cached on their stable JSON
form (tasks/caching.py). `run_serving` runs a serving session (launcher/serving.py: ranks, router,
replay), records every request into DuckDB and compares with the simulator: never cached or retried.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict

import rundir
from launcher.launch import log_tail
from launcher.serving import serve_session
from planner.serve.calibrate import fit_serving
from planner.serve.cost import KindServing, ServeCost
from planner.serve.placement import (
    Placement,
    Problem,
    one_model_per_group,
    replay_placement,
    resolve_slos,
    search,
    selective_replication,
)
from planner.serve.workload import Trace, Workload, make_trace
from planner.specs.cluster import ClusterSpec
from planner.specs.config import SERVE_START_TIMEOUT_S
from storage.serve import read_calibration, read_measured, record_requests, save_serving
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
    serving: dict[str, dict[str, float]] = {}  # device kind -> fitted KindServing figures (serve_calibrations)
    group_events: list[GroupEvent] = []
    simulated: list[dict] = []  # replay only: the simulator's per-model table, calibrated
    simulated_nominal: list[dict] = []  # the same on the trace's own arrival times
    arrival_late_s: dict[str, float] | None = None  # how late requests reached the router (p50, max)


@task(name="serve-placements", cache_policy=stable_inputs())
def plan_placements(
    workload: Workload, cluster: ClusterSpec, serving: dict[str, KindServing] | None = None
) -> dict[str, Placement]:
    """meshplan's placement and the two baselines, each scored by the simulator on the workload's
    trace; `serving`: the device kinds' serving figures (fitted on earlier serving runs), in the key."""
    cost = ServeCost(cluster, workload.dtype, serving=dict(serving or {}))
    p = Problem(workload, cost, make_trace(workload), resolve_slos(workload, cost))
    return {
        "meshplan": search(p),
        "selective-replication": selective_replication(p),
        "one-model-per-group": one_model_per_group(p),
    }


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
    timeout_s: float = SERVE_START_TIMEOUT_S,
) -> ServeRun:
    """Serve `pl` (launcher/serving.serve_session: ranks, router, replay), every request recorded
    into DuckDB as it is answered; then the simulator on the same trace, calibrated with the ranks'
    measured stage times and front-end overhead."""
    cost = ServeCost(cluster, pl.dtype)
    names = [m.name for m in pl.models]
    slo = dict(zip(names, resolve_slos(_workload(pl), cost).tolist(), strict=True))
    s = serve_session(
        pl, run_dir, run_id, slo, partial(record_requests, db_path), trace, port, warmup, serve_s, timeout_s
    )
    bad = [(gi, rc) for gi, rc in enumerate(s.codes) if rc != 0 and not s.gave_up[gi]]
    if bad and not s.events:
        gi, rc = bad[0]
        log = rundir.serve_log(run_dir, gi)
        raise RuntimeError(f"serving group {gi}'s ranks exited {rc}; log {log}:\n{log_tail(log)}")
    calib = read_calibration(Path(run_dir), pl)
    # what serving paid beyond the kernels, per device kind, from this run's per-request logs (the
    # router's rows as recorded in serve_requests, beside the ranks' stage logs): stored for the next
    # serve-plan, which pools every run's figures of a kind (storage/serve.load_serving)
    measured = read_measured(Path(run_dir), pl, s.rows, s.t0)
    fitted = fit_serving([(pl.groups[gi].kind, m) for gi, m in sorted(measured.items())], calib)
    counts: dict[str, int] = {}
    for gi, m in measured.items():
        counts[pl.groups[gi].kind] = counts.get(pl.groups[gi].kind, 0) + len(m.idle.front)
    save_serving(db_path, run_id, fitted, counts)
    result: dict = {
        "run_id": run_id,
        "run_dir": run_dir,
        "recorded": s.recorded,
        "statuses": s.statuses,
        "calibration": {str(k): v for k, v in calib.items()},
        "serving": {k: vars(f) for k, f in fitted.items() if counts.get(k, 0) > 0},
        "group_events": [GroupEvent(**vars(e)) for e in s.events],
    }
    if trace is not None:
        # the simulator runs the trace as it reached the router (the replay client sends a burst's
        # requests one by one: they arrive a few ms apart, not at once), each request's front end,
        # stage work, hand-offs and the box's speed over time drawn from the ranks' and the router's
        # logs of this replay (service figures: no request's latency or wait); median p50/p99 over
        # seeded runs. "simulated_nominal": the same on the trace's own times.
        # each request's arrival and finish on the router's monotonic clock, beside the ranks' stage logs
        keep = ("request_id", "model", "grp", "phase", "status", "t_arrival", "t_finish")
        rundir.router_log_path(run_dir).write_text(json.dumps([{k: r.get(k) for k in keep} for r in s.rows]))
        ccost = ServeCost(cluster, pl.dtype, calibration=calib)
        rows = sorted((r for r in s.rows if r["phase"] == "serve"), key=lambda r: r["t_arrival"])
        received = Trace(
            np.array([r["t_arrival"] - s.t0 for r in rows]),
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
