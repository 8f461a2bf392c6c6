"""AlpaServe's synthetic setting, out of sample: plan on one trace, judge on another no planner saw.

16 models of 3 sizes (6 × GPT-3 1.3B, 5 × 2.7B, 5 × 6.7B, fp16, 2048-token requests: single-device
latencies ≈ 0.09 / 0.15 / 0.34 s on a V100, AlpaServe's magnitudes) on 8 V100-32GB (one NVLink node,
as AlpaServe's p3.16xlarge), Gamma arrivals split evenly over the models, SLO = scale × each model's
single-device latency (Li et al., OSDI'23 §6.1). The cost model charges what a serving system pays
beyond the kernels (planner/serve/cost.KindServing; V100 figures below: 5 ms front end, 2 ms reply,
2 ms per stage hand-off, 10 % of a block's compute not split by tp — 6.7B at tp 8 ≈ 0.10 s, not the
ideal 0.07 s).

Every method plans on the same planning trace (seed PLAN_SEED, ≥ `--plan-requests` requests: AlpaServe
draws a long one from the rates and CVs) and is judged by
`judge` below on test traces drawn with seeds TEST_SEEDS (`--test-s` each; a 120 s trace at CV 3 varies
by ±1 point by itself, so two of 600 s) — an independent simulator (its own code: requests admitted in arrival order, each
group's stage clocks advanced per request, a request routed to the replica where it starts first,
dropped when it would finish past its deadline) on the same stage times. Methods: meshplan
(placement.search), AlpaServe's model-parallel greedy and its group-partition / parallel-config
search, and selective replication (planner/serve/alpaserve.py). Cells: judged attainment % and
search CPU seconds (wall in the totals). `pred` is meshplan's own simulator on the test
traces (its prediction of the judge); `plan` the same simulator on the planning trace (what
serve-plan predicts), to compare with `pred` (that simulator on seeds it never saw).

    PYTHONPATH=. python bench/serve.py            # the three sweeps
    PYTHONPATH=. python bench/serve.py --quick    # fewer points
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from planner.serve.alpaserve import alpaserve_greedy, alpaserve_search, selective_replication
from planner.serve.cost import Config, KindServing, ServeCost
from planner.serve.placement import Placement, Problem, resolve_slos, search, simulate_placement
from planner.serve.workload import ServedModel, Trace, Workload, make_trace
from planner.specs.cluster import parse_cluster

SIZES = ["gpt3-1.3b"] * 6 + ["gpt3-2.7b"] * 5 + ["gpt3-6.7b"] * 5
KIND = "V100-SXM2-32GB"
V100 = KindServing(front_s=0.005, reply_s=0.002, handoff_s=0.002, tp_serial=0.10)
PLAN_SEED, TEST_SEEDS = 1, (1001, 2002)
METHODS = {
    "meshplan": search,
    "alpaserve-greedy": alpaserve_greedy,
    "alpaserve-search": alpaserve_search,
    "selective-repl": selective_replication,
}


def cluster(nodes: int = 1):
    return parse_cluster(
        {
            "name": f"v100-32gb-{8 * nodes}",
            "nodes": [
                {
                    "name": "p3",
                    "device": KIND,
                    "num_devices": 8,
                    "count": nodes,
                    "intra_link": "nvlink2",
                    "inter_link": "eth-100g",
                }
            ],
        }
    )


def problem(rate: float, cv: float, scale: float, seed: int, duration_s: float) -> Problem:
    models = tuple(
        ServedModel(name=f"m{i}", preset=p, seq=2048, rate=rate / len(SIZES), cv=cv, slo_scale=scale)
        for i, p in enumerate(SIZES)
    )
    w = Workload(name="alpaserve-synthetic", models=models, duration_s=duration_s, seed=seed)
    cost = ServeCost(cluster(), "fp16", serving={KIND: V100})
    return Problem(w, cost, make_trace(w), resolve_slos(w, cost))


def judge(pl: Placement, cost: ServeCost, trace: Trace, slo_s: np.ndarray) -> float:
    """SLO attainment of `pl` on `trace`, by a simulator written apart from planner/serve/simulate.py
    (module docstring): FCFS per group, blocking pipelined stages, drop on a predicted deadline miss."""
    idx = {m.name: i for i, m in enumerate(pl.models)}
    groups = []  # (stage seconds per model, reply seconds, stage clocks)
    hosts: dict[int, list[int]] = {}
    for gi, g in enumerate(pl.groups):
        cfg = Config(g.kind, g.pp, g.tp)
        times = {}
        for name in g.models:
            sm = pl.models[idx[name]]
            times[idx[name]] = cost.stage_times(sm.name, sm.spec, cfg, sm.batch, sm.tokens)
            hosts.setdefault(idx[name], []).append(gi)
        groups.append((times, cost.reply_s(g.kind), [0.0] * g.pp))
    good = 0
    for t, m in zip(trace.arrival_s.tolist(), trace.model.tolist(), strict=True):
        if m not in hosts:
            continue
        gi = min(hosts[m], key=lambda h: (max(t, groups[h][2][0]), h))
        times, reply, clock = groups[gi]
        new, end = list(clock), t
        for s, dt in enumerate(times[m]):
            begin = max(end, new[s])
            if s:
                new[s - 1] = begin
            end = begin + dt
            new[s] = end
        if end + reply - t <= slo_s[m] + 1e-12:
            clock[:] = new
            good += 1
    return good / max(1, len(trace))


def point(label: str, rate: float, cv: float, scale: float, plan_requests: int, test_s: float) -> dict:
    plan = problem(rate, cv, scale, PLAN_SEED, max(60.0, plan_requests / rate))
    tests = [problem(rate, cv, scale, seed, test_s) for seed in TEST_SEEDS]
    test = tests[0]
    out = {}
    for name, fn in METHODS.items():
        w0, c0 = time.monotonic(), time.process_time()
        pl = fn(plan)
        wall, cpu = time.monotonic() - w0, time.process_time() - c0
        got = float(np.mean([judge(pl, t.cost, t.trace, t.slo_s) for t in tests]))
        pred = (
            float(np.mean([simulate_placement(pl, t.cost, t.trace).attainment() for t in tests]))
            if name == "meshplan"
            else float("nan")
        )
        reps = sum(len(g.models) for g in pl.groups)
        out[name] = {
            "att": got,
            "wall": wall,
            "cpu": cpu,
            "pred": pred,
            "planned": pl.attainment if pl.attainment is not None else float("nan"),
            "replicas": reps,
            "pl": pl,
        }
    best = max((n for n in METHODS if n != "meshplan"), key=lambda n: out[n]["att"])
    d = 100 * (out["meshplan"]["att"] - out[best]["att"])
    cells = "  ".join(f"{100 * r['att']:6.2f} {r['cpu']:5.2f}s {r['replicas']:>2}r" for r in out.values())
    ratio = out["meshplan"]["cpu"] / max(out["alpaserve-greedy"]["cpu"], 1e-9)
    g0 = out["meshplan"]["pl"].groups
    shape = ",".join(sorted({f"{g.pp}x{g.tp}" for g in g0}))
    print(
        f"{label:<10} {len(test.trace):>6}  {cells}  {d:+6.2f} vs {best:<16} {ratio:4.2f}x  "
        f"pred {100 * out['meshplan']['pred']:6.2f}  plan {100 * out['meshplan']['planned']:6.2f}  {shape}",
        flush=True,
    )
    return out


def header(what: str) -> None:
    names = "  ".join(f"{n:>18}" for n in METHODS)
    print(
        f"\n{what:<10} {'reqs':>6}  {names}  {'mesh − best base':>23} {'cpu/greedy':>10}  {'meshplan pred':>13}  {'plan':>11}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--plan-requests", type=int, default=4000)
    ap.add_argument("--test-s", type=float, default=600.0)
    ap.add_argument("--sweep", choices=("rate", "cv", "slo", "all"), default="all")
    args = ap.parse_args()
    rates = [8, 16, 24, 32, 40] if args.quick else [8, 12, 16, 20, 24, 28, 32, 40, 48]
    cvs = [1, 3, 5, 8] if args.quick else [1, 2, 3, 4, 5, 6, 8]
    scales = [1, 2.5, 5, 10] if args.quick else [1, 1.5, 2, 2.5, 3, 5, 7.5, 10]
    print(
        "AlpaServe synthetic, out of sample: 16 models (6×1.3B, 5×2.7B, 5×6.7B, 2048 tokens) on 8 V100-32GB; "
        f"planned on seed {PLAN_SEED} (≥ {args.plan_requests} requests), judged on seeds {TEST_SEEDS} ({args.test_s:g} s each)"
    )
    print("cells: judged SLO attainment %, search CPU s (process_time; wall is noisy on a shared box), replicas placed")
    rows = []
    if args.sweep in ("rate", "all"):
        header("rate, CV 3, SLO 5x")
        rows += [point(f"rate {r}", r, 3, 5, args.plan_requests, args.test_s) for r in rates]
    if args.sweep in ("cv", "all"):
        header("CV, rate 20, SLO 5x")
        rows += [point(f"cv {c}", 20, c, 5, args.plan_requests, args.test_s) for c in cvs]
    if args.sweep in ("slo", "all"):
        header("SLO, rate 20, CV 3")
        rows += [point(f"slo {s}x", 20, 3, s, args.plan_requests, args.test_s) for s in scales]
    print("\nover all points")
    for name in METHODS:
        att = [r[name]["att"] for r in rows]
        print(
            f"{name:<18} mean attainment {100 * np.mean(att):6.2f} %  search wall {sum(r[name]['wall'] for r in rows):7.1f} s"
            f"  cpu {sum(r[name]['cpu'] for r in rows):7.1f} s"
        )
    d = [100 * (r["meshplan"]["att"] - max(r[n]["att"] for n in METHODS if n != "meshplan")) for r in rows]
    print(
        f"meshplan − best baseline: mean {np.mean(d):+.2f}, min {min(d):+.2f}, max {max(d):+.2f} points; "
        f"ahead at {sum(x > 0.005 for x in d)}, level (±0.005) at {sum(abs(x) <= 0.005 for x in d)}, behind at {sum(x < -0.005 for x in d)} of {len(d)}"
    )
    pe = [100 * (r["meshplan"]["pred"] - r["meshplan"]["att"]) for r in rows]
    print(
        f"meshplan's prediction − judge on the unseen seed: mean {np.mean(pe):+.2f}, max |.| {max(abs(x) for x in pe):.2f} points"
    )
    pu = [100 * (r["meshplan"]["planned"] - r["meshplan"]["pred"]) for r in rows]
    print(
        f"meshplan's planned attainment (its simulator, planning seed) − its simulator on the unseen seeds: "
        f"mean {np.mean(pu):+.2f}, max |.| {max(abs(x) for x in pu):.2f} points"
    )


if __name__ == "__main__":
    main()
