"""The serving plan's predicted SLO attainment against a replay of the same placement on meshplan's
serving runtime (torch ranks on CPU behind the HTTP router, every request in DuckDB).

A placement of two small models on one 2-stage pipeline group (2 CPU ranks) is served twice:

1. calibration: a Gamma trace (seed CAL_SEED) with generous SLOs; the serve flow's task stores the
   run's serving figures per device kind (planner/serve/calibrate.fit_serving → serve_calibrations)
   and the ranks' stage times (calib/stage files);
2. test: another trace (seed TEST_SEED, never served before), SLOs = `--slo-scale` × each model's
   calibrated latency alone (AlpaServe's SLO scale). Before it is served, the attainment is predicted
   from the calibration run only — by the planner's simulator (the cost model with the calibrated
   stage times and the pooled serving figures: what serve-plan predicts) and by the replay
   simulator (each request's service drawn from the calibration run's per-request samples) — then
   the trace is served and the measured attainment read from serve_requests.

Rows: measured, the two predictions and their differences in points.

    PYTHONPATH=. python bench/serve_replay.py [--reps 2] [--slo-scale 3] [--test-s 20]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import rundir
from planner.serve.cost import ServeCost
from planner.serve.placement import Placement, replay_placement, simulate_placement
from planner.serve.workload import ServedModel, Workload, make_trace
from planner.specs.cluster import parse_cluster
from storage.serve import load_serving, read_calibration, read_measured, serve_requests
from tasks.serve import run_serving

CAL_SEED, TEST_SEED = 3, 4
CLUSTER = {
    "name": "cpu-2",
    "nodes": [
        {
            "name": "cpu",
            "device": "cpu",
            "num_devices": 2,
            "intra_link": "eth-100g",
            "inter_link": "eth-100g",
            "device_memory_bytes": 8_000_000_000,
            "device_peak_flop_per_s": 50_000_000_000,
        }
    ],
}
DIMS = {"num_layers": 4, "num_heads": 4, "vocab_size": 512, "seq_len": 128}


def placement(slo: dict[str, float], rate: float, cv: float) -> Placement:
    models = [
        ServedModel(name=n, dims={"name": n, "hidden": h, **DIMS}, rate=rate, cv=cv, slo_s=slo[n])
        for n, h in (("a", 256), ("b", 192))
    ]
    return Placement(
        method="manual",
        cluster="cpu-2",
        dtype="fp32",
        models=tuple(models),
        groups=({"devices": (0, 1), "kind": "cpu", "pp": 2, "tp": 1, "models": ("a", "b")},),
    )


def attained(db: Path, run_id: str, slo: dict[str, float]) -> tuple[float, int]:
    rows = serve_requests(db, run_id)
    rows = rows.filter(rows["phase"] == "serve")
    ok = [
        st == "ok" and lat is not None and lat <= slo[m] + 1e-12
        for m, st, lat in zip(
            rows["model"].to_list(), rows["status"].to_list(), rows["latency_s"].to_list(), strict=True
        )
    ]
    return float(np.mean(ok)) if ok else float("nan"), len(ok)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--slo-scale", type=float, default=3.0)
    ap.add_argument("--rate", type=float, default=6.0, help="requests/s per model")
    ap.add_argument("--cv", type=float, default=2.0)
    ap.add_argument("--cal-s", type=float, default=16.0)
    ap.add_argument("--test-s", type=float, default=20.0)
    args = ap.parse_args()
    cluster = parse_cluster(CLUSTER)
    print(
        f"replay on CPU ranks: 2 models on one pp 2 group, rate {args.rate:g}/s each, CV {args.cv:g}, "
        f"SLO {args.slo_scale:g}× calibrated latency alone; calibrated on a {args.cal_s:g} s trace (seed {CAL_SEED}), "
        f"tested on a {args.test_s:g} s trace (seed {TEST_SEED}+rep)"
    )
    print(f"{'rep':>3} {'reqs':>5} {'measured':>9} {'planner':>9} {'Δ pts':>7} {'replay-sim':>10} {'Δ pts':>7}  wall s")
    d_plan, d_rep = [], []
    for rep in range(args.reps):
        w0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            db = tmp / "meshplan.duckdb"
            cal_pl = placement({"a": 60.0, "b": 60.0}, args.rate, args.cv)
            names = [m.name for m in cal_pl.models]
            cal_trace = make_trace(Workload(models=cal_pl.models, duration_s=args.cal_s, seed=CAL_SEED + 100 * rep))
            cal_dir = tmp / "runs" / "cal"
            cal_dir.mkdir(parents=True)
            run_serving.fn(cal_pl, cluster, str(db), str(cal_dir), "cal", cal_trace)
            calib = read_calibration(cal_dir, cal_pl)
            serving = {k: f for k, (f, _, _) in load_serving(db).items()}
            cost = ServeCost(cluster, "fp32", calibration=calib, serving=serving)
            alone = {
                m.name: sum(cost.stage_times(m.name, m.spec, cal_pl.config(cal_pl.groups[0]), 1, m.tokens))
                + cost.reply_s("cpu")
                for m in cal_pl.models
            }
            slo = {n: args.slo_scale * t for n, t in alone.items()}
            pl = placement(slo, args.rate, args.cv)
            trace = make_trace(Workload(models=pl.models, duration_s=args.test_s, seed=TEST_SEED + 100 * rep))
            # predictions from the calibration run alone
            planner = simulate_placement(pl, cost, trace).attainment()
            router = json.loads(rundir.router_log_path(cal_dir).read_text())
            measured = read_measured(cal_dir, cal_pl, router, None)
            replayed = replay_placement(pl, cost, trace, measured)[-1]["attainment"]
            test_dir = tmp / "runs" / "test"
            test_dir.mkdir(parents=True)
            run_serving.fn(pl, cluster, str(db), str(test_dir), "test", trace)
            got, n = attained(db, "test", slo)
        d_plan.append(100 * (planner - got))
        d_rep.append(100 * (replayed - got))
        print(
            f"{rep:>3} {n:>5} {100 * got:8.2f}% {100 * planner:8.2f}% {d_plan[-1]:+7.2f} {100 * replayed:9.2f}% "
            f"{d_rep[-1]:+7.2f}  {time.monotonic() - w0:6.1f}",
            flush=True,
        )
        del names
    print(
        f"planner − measured: mean {np.mean(d_plan):+.2f}, max |.| {max(abs(x) for x in d_plan):.2f} points; "
        f"replay simulator − measured: mean {np.mean(d_rep):+.2f}, max |.| {max(abs(x) for x in d_rep):.2f} points"
    )


if __name__ == "__main__":
    main()
