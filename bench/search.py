"""Search wall time and plan quality at 8 … 16,384 GPUs, one to three device kinds.

For gpt3-175b, llama3-70b and llama3-405b on clusters of H100 (NDR), H100+A100 (NDR/HDR) and
H100+A100+V100 (NDR/HDR/EDR), it runs the full search (time budget: 0.6 s up to 1,024 GPUs, so the whole call stays near 1 s,
and 8 s above) including both baselines, and prints wall time, the best plan and its predicted speed-up
over the Megatron rule of thumb and the heterogeneity-blind uniform plan.

    OMP_NUM_THREADS=1 .venv/bin/python bench/search.py [--quick]
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from planner.report.ranking import layout
from planner.search import NoFeasiblePlan, search
from planner.specs.cluster import parse_cluster
from planner.specs.model import get_model

KINDS = {
    "H100": ("H100-SXM5-80GB", "nvlink4", "ib-ndr"),
    "A100": ("A100-SXM4-80GB", "nvlink3", "ib-hdr"),
    "V100": ("V100-SXM2-32GB", "nvlink2", "ib-edr"),
}
MIXES = {
    "H100": {"H100": 1.0},
    "H100+A100": {"H100": 0.5, "A100": 0.5},
    "H100+A100+V100": {"H100": 0.5, "A100": 0.25, "V100": 0.25},
}


def make_cluster(num_gpus: int, mix: str):
    nodes = []
    for kind, frac in MIXES[mix].items():
        n = max(1, int(num_gpus * frac))
        per = min(8, n)
        device, intra, inter = KINDS[kind]
        nodes.append(
            {
                "name": kind.lower(),
                "device": device,
                "num_devices": per,
                "count": n // per,
                "intra_link": intra,
                "inter_link": inter,
            }
        )
    return parse_cluster({"name": f"{mix}-{num_gpus}", "nodes": nodes})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only 1,024 GPUs")
    args = ap.parse_args()
    sizes = [1024] if args.quick else [8, 64, 512, 1024, 4096, 16384]
    t = Table(title="meshplan search: wall time (incl. baselines) and predicted speed-up")
    for col in (
        "model",
        "GPUs",
        "kinds",
        "wall s",
        "shapes",
        "step s",
        "MFU",
        "best layout",
        "vs Megatron",
        "vs uniform",
    ):
        t.add_column(col)
    console = Console(width=200)
    for model_name in ("gpt3-175b", "llama3-70b", "llama3-405b"):
        model = get_model(model_name)
        for n in sizes:
            for mix in MIXES:
                cluster = make_cluster(n, mix)
                gb = max(512, n)
                budget = 0.6 if n <= 1024 else 8.0
                t0 = time.perf_counter()
                res = search(model, cluster, global_batch=gb, time_budget_s=budget)
                wall = time.perf_counter() - t0
                if isinstance(res, NoFeasiblePlan):
                    t.add_row(
                        model_name,
                        str(cluster.num_devices),
                        mix,
                        f"{wall:.2f}",
                        str(res.stats.shapes),
                        "-",
                        "-",
                        "infeasible: " + res.reasons[0][:60] + "…",
                        "-",
                        "-",
                    )
                    continue
                b = res.best
                c = b.predicted
                ups = [res.speedup(k) for k in ("megatron", "uniform")]
                t.add_row(
                    model_name,
                    str(cluster.num_devices),
                    mix,
                    f"{wall:.2f}",
                    str(res.stats.shapes),
                    f"{c.step_time_s:.3g}",
                    f"{c.mfu:.1%}",
                    layout(b),
                    *("n/a" if u is None else f"{u:.2f}×" for u in ups),
                )
                console.print(f"{model_name:12s} {cluster.num_devices:6d} {mix:15s} {wall:6.2f} s", highlight=False)
    console.print(t)


if __name__ == "__main__":
    main()
