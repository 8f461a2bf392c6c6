"""AlpaServe's synthetic setting: SLO attainment of three placements as rate, CV and SLO scale vary.

16 models of 3 sizes (6 × GPT-3 1.3B, 5 × 2.7B, 5 × 6.7B, fp16, 512-token requests) on 8 V100-32GB
(one NVLink node, as AlpaServe's p3.16xlarge), Gamma arrivals split evenly over the models, SLO =
scale × each model's single-device latency (Li et al., OSDI'23 §6.1). For each setting: attainment of
meshplan's placement (model-parallel groups, greedy replicas), selective replication (no model
parallelism) and one model per group, and each search's seconds. Then the largest rate and CV at
which each placement still holds ≥ 99 % attainment. Finally the search time for 64 devices × 32 models.

    PYTHONPATH=. python bench/serve.py            # full sweep (a few minutes on one core)
    PYTHONPATH=. python bench/serve.py --quick    # fewer points
"""

from __future__ import annotations

import argparse
import time

from planner.serve.cost import ServeCost
from planner.serve.placement import Problem, one_model_per_group, resolve_slos, search, selective_replication
from planner.serve.workload import ServedModel, Workload, make_trace
from planner.specs.cluster import parse_cluster

SIZES = ["gpt3-1.3b"] * 6 + ["gpt3-2.7b"] * 5 + ["gpt3-6.7b"] * 5
METHODS = {
    "meshplan": search,
    "selective-replication": selective_replication,
    "one-model-per-group": one_model_per_group,
}


def cluster(nodes: int = 1):
    return parse_cluster(
        {
            "name": f"v100-32gb-{8 * nodes}",
            "nodes": [
                {
                    "name": "p3",
                    "device": "V100-SXM2-32GB",
                    "num_devices": 8,
                    "count": nodes,
                    "intra_link": "nvlink2",
                    "inter_link": "eth-100g",
                }
            ],
        }
    )


def problem(rate: float, cv: float, scale: float, sizes=SIZES, nodes: int = 1, duration_s: float = 60.0) -> Problem:
    models = tuple(
        ServedModel(name=f"m{i}", preset=p, seq=512, rate=rate / len(sizes), cv=cv, slo_scale=scale)
        for i, p in enumerate(sizes)
    )
    w = Workload(name="alpaserve-synthetic", models=models, duration_s=duration_s, seed=1)
    cost = ServeCost(cluster(nodes), "fp16")
    return Problem(w, cost, make_trace(w), resolve_slos(w, cost))


def row(label: str, p: Problem) -> dict[str, tuple[float, float]]:
    out = {}
    for name, fn in METHODS.items():
        t0 = time.monotonic()
        pl = fn(p)
        out[name] = (pl.attainment or 0.0, time.monotonic() - t0)
    cells = "  ".join(f"{100 * a:6.2f}% {s:5.2f}s" for a, s in out.values())
    print(f"{label:<28} {len(p.trace):>6}  {cells}", flush=True)
    return out


def header(what: str) -> None:
    names = "  ".join(f"{n[:21]:>15}" for n in METHODS)
    print(f"\n{what:<28} {'reqs':>6}  {names}")


def largest(points: list[float], results: list[dict], method: str) -> str:
    ok = [x for x, r in zip(points, results, strict=True) if r[method][0] >= 0.99]
    return f"{max(ok):g}" if ok else "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rates = [8, 16, 24, 32, 40] if args.quick else [8, 12, 16, 20, 24, 28, 32, 40, 48]
    cvs = [1, 2, 3, 4, 5, 8] if args.quick else [1, 2, 3, 4, 5, 6, 8]
    scales = [1, 2.5, 5, 10] if args.quick else [1, 1.5, 2, 2.5, 3, 5, 7.5, 10]
    print("AlpaServe synthetic: 16 models (6×1.3B, 5×2.7B, 5×6.7B) on 8 V100-32GB; cells: attainment, search s")
    header("rate (req/s), CV 3, SLO 5x")
    by_rate = [row(f"rate {r}", problem(r, 3, 5)) for r in rates]
    header("CV, rate 20, SLO 5x")
    by_cv = [row(f"cv {c}", problem(20, c, 5)) for c in cvs]
    header("SLO scale, rate 20, CV 3")
    for s in scales:
        row(f"slo {s}x", problem(20, 3, s))
    print("\nlargest setting holding >= 99 % attainment")
    print(f"{'placement':<24} {'rate (CV 3)':>12} {'CV (rate 20)':>13}")
    for m in METHODS:
        print(f"{m:<24} {largest(rates, by_rate, m):>12} {largest(cvs, by_cv, m):>13}")
    sizes32 = (SIZES * 2)[:32]
    p = problem(80, 3, 5, sizes=sizes32, nodes=8, duration_s=30.0)
    t0 = time.monotonic()
    pl = search(p)
    print(
        f"\nsearch time, 64 devices x 32 models ({len(p.trace)} requests): {time.monotonic() - t0:.1f} s, "
        f"attainment {100 * (pl.attainment or 0):.2f}%, groups {len(pl.groups)} of pp×tp {pl.groups[0].pp}x{pl.groups[0].tp}"
    )


if __name__ == "__main__":
    main()
