"""Replay the shipped multi-job trace with every policy and print the policies side by side.

Speed ground truth: the trace's sim_lookup.csv (measured per-allocation iteration times, Arena/Crius
artifact). Also prints how one decision's wall time grows with the queue length and the cluster's
GPU count (a fresh TableSpeed, so the first call's filtering is included).

    .venv/bin/python bench/scheduler.py [--trace-dir /work/shared/data/cluster_trace] [--jobs N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from planner.scheduler import POLICIES, ClusterState, Policy, TableSpeed, decide
from planner.scheduler.simulate import simulate
from planner.scheduler.trace import cluster_from_csv, parse_jobs, parse_lookup


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--trace-dir", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared/data/cluster_trace"
    )
    ap.add_argument("--jobs", type=int, default=0, help="replay only the first N jobs (0: all)")
    args = ap.parse_args()
    d = args.trace_dir if args.trace_dir.is_dir() else Path("/work/shared/data/cluster_trace")
    t0 = time.perf_counter()
    cl = cluster_from_csv((d / "cluster.csv").read_text())
    jobs = parse_jobs((d / "jobs.csv").read_text(), set(cl.kinds))
    jobs = jobs[: args.jobs] if args.jobs else jobs
    rows = parse_lookup((d / "sim_lookup.csv").read_text())
    print(f"trace: {len(jobs)} jobs on {cl.num_devices} GPUs ({', '.join(f'{cl.total(k)} {k}' for k in cl.kinds)})")
    print(
        f"{'policy':<11}{'avg JCT h':>10}{'p99 JCT h':>10}{'queue h':>9}{'makespan d':>11}{'finished':>9}"
        f"{'rejected':>9}{'resizes':>8}{'decides':>8}{'decide s':>9}{'wall s':>8}  util " + "/".join(cl.kinds)
    )
    results = {}
    # jct-floor: the jct policy that never shrinks a job below the allocation it was admitted with
    variants = [(name, Policy(name)) for name in POLICIES] + [("jct-floor", Policy("jct", shrink_below_base=False))]
    for name, policy in variants:
        r = simulate(jobs, cl, policy, TableSpeed(rows))
        results[name] = r
        util = "/".join(f"{r.utilisation(k):.2f}" for k in cl.kinds)
        print(
            f"{name:<11}{r.avg_jct_s / 3600:>10.1f}{r.p99_jct_s / 3600:>10.1f}{r.avg_queue_s / 3600:>9.2f}"
            f"{r.makespan_s / 86400:>11.1f}{r.finished:>9}{r.rejected:>9}{r.resizes:>8}{len(r.decide_calls):>8}"
            f"{r.decide_s:>9.1f}{r.wall_s:>8.1f}  {util}",
            flush=True,
        )
    best_base = min(results["fcfs"].avg_jct_s, results["gavel"].avg_jct_s)
    print(
        f"co-designed jct vs best baseline: avg JCT ratio {results['jct'].avg_jct_s / best_base:.2f} "
        f"(fcfs/jct {results['fcfs'].avg_jct_s / results['jct'].avg_jct_s:.2f}×, gavel/jct "
        f"{results['gavel'].avg_jct_s / results['jct'].avg_jct_s:.2f}×); shrinking below the admitted size: "
        f"jct-floor/jct {results['jct-floor'].avg_jct_s / results['jct'].avg_jct_s:.2f}×"
    )
    print(f"whole replay, every policy: {time.perf_counter() - t0:.0f} s")

    print("\none decision (jct policy), wall ms, by queued jobs × cluster GPUs (nodes scaled from the trace's)")
    scales = (0.25, 1.0, 4.0)
    sizes = (50, 200, 800, 1600)
    print(f"{'queued':>7}" + "".join(f"{int(cl.num_devices * s):>9}" for s in scales))
    for n in sizes:
        line = f"{n:>7}"
        for s in scales:
            scaled = _scaled(cl, s)
            t = time.perf_counter()
            decide(scaled, jobs[:n], [], Policy("jct"), TableSpeed(rows))
            line += f"{(time.perf_counter() - t) * 1e3:>9.1f}"
        print(line)


def _scaled(cl: ClusterState, s: float) -> ClusterState:
    kinds, totals = [], []
    for kind in cl.kinds:
        idx = [i for i, k in enumerate(cl.node_kind) if k == kind]
        n = max(1, round(len(idx) * s))
        kinds += [kind] * n
        totals += [cl.node_total[idx[0]]] * n
    return ClusterState(kinds, totals)


if __name__ == "__main__":
    main()
