"""The cluster scheduler under load: every policy and two published baselines on the shipped trace.

Workloads (the trace's jobs.csv, speeds from its sim_lookup.csv: measured per-allocation iteration
times, Arena/Crius artifact): the first 241 jobs (36 h at 1×) with inter-arrival times divided by 1,
2, 3 and 4, and the busiest later window of 241 jobs (jobs 494–734 by requested GPU-hours per hour,
1×). Each replay runs to a 24 h cut; it is also read at a post-burst cut (the last arrival + 30 min,
when that comes before 24 h). At a cut: average time in system of the jobs that arrived by then
(an unfinished job counts until the cut), jobs finished, average JCT of the finished ones, resizes
begun, and each decision's wall time (mean and max over the rounds that decided).

Every policy runs in meshplan's simulator (planner/scheduler/simulate.py) with meshplan's charges
(a start costs `relaunch_s`; a resize the switch: relaunch + resharded checkpoint save and load);
`crius` and `sia` are the baselines of planner/scheduler/baselines.py.

    .venv/bin/python bench/scheduler.py [--quick] [--policies a,b] [--diagnose POLICY] [--scaling]

`--quick`: 1× and 3× only, and five policies. `--diagnose P,Q`: at 3×, at both cuts, how much of
each policy's time in system beyond the bound is waiting and how much running slow, by job length,
and the jobs that lost the most (their allocations over time).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

from planner.scheduler import POLICIES, ClusterState, Job, Policy, TableSpeed, decide
from planner.scheduler.simulate import SimResult, simulate
from planner.scheduler.trace import cluster_from_csv, parse_jobs, parse_lookup

H = 3600.0
CUT_S = 24 * H
WINDOW = 241
BUSY_START = 493  # 0-based: the 241-job window with the most requested GPU-hours per hour of arrivals


@dataclass
class Row:
    scenario: str
    cut: str
    policy: str
    avg_sys_h: float
    finished: int
    arrived: int
    avg_jct_h: float
    resizes: int
    decide_mean_ms: float
    decide_max_ms: float
    cpu_mean_ms: float
    cpu_max_ms: float
    cpu_s: float


def scaled(jobs: list[Job], k: float) -> list[Job]:
    t0 = jobs[0].submit_s
    return [replace(j, submit_s=t0 + (j.submit_s - t0) / k) for j in jobs]


def at_cut(r: SimResult, jobs: list[Job], cut_s: float) -> tuple[float, int, int, float, int]:
    t0 = min(j.submit_s for j in jobs)
    end = t0 + cut_s
    sys_s, jcts, resizes, arrived = [], [], 0, 0
    for o in r.jobs:
        if o.submit_s > end or o.rejected:
            continue
        arrived += 1
        done = o.finish_s is not None and o.finish_s <= end
        sys_s.append((o.finish_s if done else end) - o.submit_s)
        if done:
            jcts.append(o.finish_s - o.submit_s)
        resizes += max(0, sum(1 for s in o.segments if s[0] < end) - 1)
    avg_sys = sum(sys_s) / len(sys_s) / H if sys_s else math.nan
    avg_jct = sum(jcts) / len(jcts) / H if jcts else math.nan
    return avg_sys, len(jcts), arrived, avg_jct, resizes


def run(
    jobs, cl, rows, name: str, scenario: str, cuts: list[tuple[str, float]], until: float
) -> tuple[SimResult, list[Row]]:
    speed = TableSpeed(rows)
    c0 = time.process_time()
    r = simulate(jobs, cl, Policy(name), speed, until_s=jobs[0].submit_s + until)
    cpu = time.process_time() - c0
    walls = [w * 1e3 for _, _, w in r.decide_calls] or [0.0]
    cpus = [c * 1e3 for c in r.decide_cpu_s] or [0.0]
    out = []
    for label, cut in cuts:
        s, f, a, j, z = at_cut(r, jobs, cut)
        out.append(
            Row(
                scenario,
                label,
                name,
                s,
                f,
                a,
                j,
                z,
                statistics.mean(walls),
                max(walls),
                statistics.mean(cpus),
                max(cpus),
                cpu,
            )
        )
    return r, out


def bound(jobs, cl, rows, scenario: str, cuts: list[tuple[str, float]], relaunch_s: float = 60.0) -> list[Row]:
    """No policy does better: every job on its fastest allocation from its arrival (no other job in
    the way, one relaunch), unfinished ones counted to the cut like the policies'."""
    speed = TableSpeed(rows)
    t0 = jobs[0].submit_s
    out = []
    for label, cut in cuts:
        sys_s, jcts = [], []
        for j in jobs:
            if j.submit_s - t0 > cut:
                continue
            run_s = relaunch_s + j.iterations * min(p.iter_time_s for p in speed.options(j, cl))
            left = t0 + cut - j.submit_s
            sys_s.append(min(run_s, left))
            if run_s <= left:
                jcts.append(run_s)
        out.append(
            Row(
                scenario,
                label,
                "(bound)",
                sum(sys_s) / len(sys_s) / H,
                len(jcts),
                len(sys_s),
                sum(jcts) / len(jcts) / H,
                0,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0,
            )
        )
    return out


def print_table(rows: list[Row], file=None) -> None:
    head = (
        f"{'scenario':<10}{'cut':<14}{'policy':<11}{'avg in system h':>16}{'finished':>10}{'avg JCT h':>10}"
        f"{'resizes':>8}{'decide wall ms':>15}{'decide CPU ms':>14}{'sim CPU s':>10}"
    )
    print(head, file=file)
    last = None
    for x in rows:
        if last is not None and (x.scenario, x.cut) != last:
            print("", file=file)
        last = (x.scenario, x.cut)
        print(
            f"{x.scenario:<10}{x.cut:<14}{x.policy:<11}{x.avg_sys_h:>16.2f}{f'{x.finished}/{x.arrived}':>10}"
            f"{x.avg_jct_h:>10.2f}{x.resizes:>8}{f'{x.decide_mean_ms:.1f}/{x.decide_max_ms:.0f}':>15}"
            f"{f'{x.cpu_mean_ms:.1f}/{x.cpu_max_ms:.0f}':>14}{x.cpu_s:>10.1f}",
            file=file,
        )


def diagnose(jobs, cl, rows, names: list[str], cut_s: float) -> None:
    """Where each policy's time in system goes beyond the bound, at the cut: waiting (queued) or running
    slower than the job's fastest allocation, by job length; and the jobs that lost the most."""
    end = jobs[0].submit_s + cut_s
    by_id = {j.job_id: j for j in jobs}
    for pol in names:
        speed = TableSpeed(rows)
        r = simulate(jobs, cl, Policy(pol), speed, until_s=end)
        n, wait, slow, buckets, worst = 0, 0.0, 0.0, {}, []
        for o in r.jobs:
            if o.submit_s > end:
                continue
            j, n = by_id[o.job_id], n + 1
            opts = speed.options(j, cl)
            best = min(p.iter_time_s for p in opts) * j.iterations + 60.0
            lb = min(end - o.submit_s, best)
            fin = o.finish_s if o.finish_s is not None and o.finish_s <= end else end
            start = o.start_s if o.start_s is not None and o.start_s <= end else end
            ex = fin - o.submit_s - lb
            w = min(start - o.submit_s, ex)
            wait, slow = wait + w, slow + ex - w
            b = "<1h" if best < H else "1-6h" if best < 6 * H else ">6h"
            x = buckets.setdefault(b, [0, 0.0, 0.0])
            x[0], x[1], x[2] = x[0] + 1, x[1] + w, x[2] + ex - w
            segs = [f"{c}x{k}@{(s0 - jobs[0].submit_s) / H:.1f}h" for s0, _, k, c in o.segments if s0 <= end]
            worst.append((ex / H, o.job_id, f"best {best / H:.1f} h", " ".join(segs)))
        print(
            f"\n[{pol}] at +{cut_s / H:.1f} h, per arrived job: {wait / n / H:.2f} h waiting, {slow / n / H:.2f} h slow, above the bound"
        )
        for b, (k, w, sl) in sorted(buckets.items()):
            print(
                f"  jobs {b:>5} on their fastest allocation: {k:>3}, waiting {w / n / H:.2f} h, slow {sl / n / H:.2f} h"
            )
        for ex, jid, best, segs in sorted(worst, reverse=True)[:5]:
            print(f"  {jid} lost {ex:.1f} h ({best}): {segs}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--trace-dir", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared/data/cluster_trace"
    )
    ap.add_argument("--quick", action="store_true", help="1× and 3× only, five policies")
    ap.add_argument("--policies", default="", help="comma-separated (default: all, crius and sia)")
    ap.add_argument("--diagnose", default="", help="comma-separated policies: where their time goes at 3×")
    ap.add_argument("--scaling", action="store_true", help="also: one decision's wall time by queue and cluster size")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()
    d = args.trace_dir if args.trace_dir.is_dir() else Path("/work/shared/data/cluster_trace")
    cl = cluster_from_csv((d / "cluster.csv").read_text())
    alljobs = parse_jobs((d / "jobs.csv").read_text(), set(cl.kinds))
    rows = parse_lookup((d / "sim_lookup.csv").read_text())
    first = alljobs[:WINDOW]
    if args.diagnose:
        for cut in (12.5 * H, CUT_S):
            diagnose(scaled(first, 3), cl, rows, args.diagnose.split(","), cut)
        return
    scen = [("1x", 1.0), ("2x", 2.0), ("3x", 3.0), ("4x", 4.0)]
    if args.quick:
        scen = [("1x", 1.0), ("3x", 3.0)]
    names = [p for p in args.policies.split(",") if p] or (
        ["jct", "throughput", "gavel", "crius", "sia"] if args.quick else list(POLICIES)
    )
    workloads = [(s, scaled(first, k)) for s, k in scen]
    if not args.quick:
        workloads.append(("busy-1x", alljobs[BUSY_START : BUSY_START + WINDOW]))
    print(
        f"{len(first)} jobs per workload on {cl.num_devices} GPUs ({', '.join(f'{cl.total(k)} {k}' for k in cl.kinds)}); "
        f"policies: {', '.join(names)}"
    )
    table: list[Row] = []
    t0 = time.perf_counter()
    for scenario, jobs in workloads:
        span = jobs[-1].submit_s - jobs[0].submit_s
        post = span + 0.5 * H
        cuts = [("24h", CUT_S)] + ([(f"post {post / H:.1f}h", post)] if post < CUT_S else [])
        table += bound(jobs, cl, rows, scenario, cuts)
        for name in names:
            _, out = run(jobs, cl, rows, name, scenario, cuts, CUT_S)
            table += out
            print(
                f"  {scenario} {name}: {out[-1].avg_sys_h:.2f} h at {out[-1].cut}, "
                f"{out[0].avg_sys_h:.2f} h at 24h ({out[0].cpu_s:.0f} s CPU)",
                flush=True,
            )
    table.sort(key=lambda r: (r.cut == "24h", [w for w, _ in workloads].index(r.scenario)))
    print()
    print_table(table)
    _verdict(table)
    print(f"\nwhole bench: {time.perf_counter() - t0:.0f} s wall")
    if args.out:
        with args.out.open("w") as f:
            f.write(f"bench/scheduler.py, {dt.date.today()}, {len(first)}-job windows of {d}\n")
            f.write("time in system: arrival to finish, or to the cut if unfinished; finished: by the cut / arrived\n")
            f.write(
                "(bound): every job on its fastest allocation from arrival, nobody in its way (no policy beats it)\n"
            )
            f.write(
                "decide: mean/max over the rounds that decided; wall on a shared 2-core machine, CPU = process time\n\n"
            )
            print_table(table, file=f)
            _verdict(table, file=f)
    if args.scaling:
        _scaling_table(cl, alljobs, rows)


def _verdict(table: list[Row], file=None) -> None:
    """meshplan's best policy against crius, per scenario and cut (the issue's target: ≥ 20 % less)."""
    print("", file=file)
    mesh = [p for p in POLICIES if p not in ("crius", "sia")]  # "(bound)" is no policy
    for key in sorted({(r.scenario, r.cut) for r in table}, key=lambda k: (k[1] == "24h", k[0])):
        rs = {r.policy: r for r in table if (r.scenario, r.cut) == key}
        if "crius" not in rs:
            continue
        ours = [rs[p] for p in mesh if p in rs]
        if not ours:
            continue
        best = min(ours, key=lambda r: r.avg_sys_h)
        c = rs["crius"]
        lb = rs.get("(bound)")
        room = f"; the bound is {(1 - lb.avg_sys_h / c.avg_sys_h) * 100:.1f} % below crius" if lb else ""
        print(
            f"{key[0]:<8}{key[1]:<14}best meshplan {best.policy:<10}{best.avg_sys_h:6.2f} h vs crius {c.avg_sys_h:6.2f} h: "
            f"{(1 - best.avg_sys_h / c.avg_sys_h) * 100:+.1f} % less time in system (target 20 %{room})",
            file=file,
        )


def _scaling_table(cl: ClusterState, jobs: list[Job], rows) -> None:
    print("\none decision (default policy), wall ms, by queued jobs × cluster GPUs (nodes scaled from the trace's)")
    scales = (0.25, 1.0, 4.0)
    sizes = (50, 200, 800, 1600)
    print(f"{'queued':>7}" + "".join(f"{int(cl.num_devices * s):>9}" for s in scales))
    for n in sizes:
        line = f"{n:>7}"
        for s in scales:
            sc = _scaled(cl, s)
            t = time.perf_counter()
            decide(sc, jobs[:n], [], Policy(), TableSpeed(rows))
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
