"""Search wall time, completeness and regret at 8 … 16,384 GPUs, one to three device kinds (issue #18).

For gpt3-175b, llama3-70b and llama3-405b on clusters of H100 (NDR), H100+A100 (NDR/HDR) and
H100+A100+V100 (NDR/HDR/EDR), each case runs the complete search (no time budget) and the budgeted
one at the CLI default budget (planner.specs.config, 2 s), both without baselines, and prints:
wall time of each, whether the budgeted one was complete and its gap, its regret (best step time
over the complete search's best, minus one; the target is 0 everywhere), the best plan, and how the
complete search's time grows with GPU count (ratio to the smallest size) and with device kinds
(ratio to one kind at the same size).

    OMP_NUM_THREADS=1 .venv/bin/python bench/search.py [--quick] [--repeat 3] [--models a,b] [--sizes 64,1024] [--seq 2048]

--quick: llama3-70b, 64 and 1,024 GPUs. --repeat N: each wall time is the minimum of N runs (the
machine is shared; say which N a figure used). Growth ratios are to the smallest size at which the
model fits (below it the search answers "infeasible" at once, which says nothing about its growth).
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from planner.report.ranking import layout
from planner.search import NoFeasiblePlan, search
from planner.specs.cluster import parse_cluster
from planner.specs.config import SearchConfig
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


def _best(res) -> float | None:
    return None if isinstance(res, NoFeasiblePlan) else res.best.predicted.step_time_s


def _timed(model, cluster, gb: int, budget: float, repeat: int = 1, seq: int | None = None):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = search(model, cluster, global_batch=gb, seq=seq, time_budget_s=budget, baselines=False)
        best = min(best, time.perf_counter() - t0)
    return res, best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="llama3-70b only, 64 and 1,024 GPUs")
    ap.add_argument("--repeat", type=int, default=1, help="wall time = min of this many runs")
    ap.add_argument("--models", default="", help="comma-separated model names")
    ap.add_argument("--sizes", default="", help="comma-separated GPU counts")
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's)")
    args = ap.parse_args()
    sizes = [64, 1024] if args.quick else [8, 64, 512, 1024, 4096, 16384]
    models = ["llama3-70b"] if args.quick else ["gpt3-175b", "llama3-70b", "llama3-405b"]
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else sizes
    models = args.models.split(",") if args.models else models
    budget = SearchConfig().time_budget_s
    console = Console(width=220)
    t = Table(
        title=f"meshplan search: complete (no budget) vs budgeted ({budget:g} s, the CLI default), "
        f"wall s = min of {args.repeat}"
    )
    for col in ("model", "GPUs", "kinds", "complete s", "budgeted s", "regret", "budgeted complete", "gap",
                "shapes", "step s", "MFU", "best layout"):  # fmt: skip
        t.add_column(col)
    wall: dict[tuple[str, str, int], float] = {}
    fits: set[tuple[str, int]] = set()
    for model_name in models:
        model = get_model(model_name)
        for n in sizes:
            for mix in MIXES:
                cluster = make_cluster(n, mix)
                gb = max(512, n)
                full, full_s = _timed(model, cluster, gb, float("inf"), args.repeat, args.seq)
                cut, cut_s = _timed(model, cluster, gb, budget, args.repeat, args.seq)
                if not isinstance(full, NoFeasiblePlan):
                    fits.add((model_name, n))
                wall[(model_name, mix, n)] = full_s
                console.print(f"{model_name:12s} {n:6d} {mix:15s} complete {full_s:6.2f} s, budgeted {cut_s:6.2f} s",
                              highlight=False)  # fmt: skip
                f, c = _best(full), _best(cut)
                # 0 exactly when the budgeted search returns the complete search's best plan
                regret = "-" if f is None or c is None else f"{c / f - 1:.2%}"
                if f is not None and c is not None and full.best.fingerprint() != cut.best.fingerprint():
                    regret += " (other plan)"
                if isinstance(full, NoFeasiblePlan):
                    row = ["-", "-", "infeasible: " + full.reasons[0][:50] + "…"]
                else:
                    b = full.best
                    row = [f"{b.predicted.step_time_s:.3g}", f"{b.predicted.mfu:.1%}", layout(b)]
                t.add_row(model_name, str(n), mix, f"{full_s:.2f}", f"{cut_s:.2f}", regret, str(cut.stats.complete),
                          f"{cut.stats.gap_fraction:.1%}", str(full.stats.shapes), *row)  # fmt: skip
    console.print(t)
    g = Table(title="complete search time growth: ratio to the smallest size the model fits (GPUs) and to one kind")
    for col in ("model", "kinds", *(f"{n} GPUs" for n in sizes), *(f"kinds ratio @{n}" for n in sizes)):
        g.add_column(col)
    for model_name in models:
        ok = [n for n in sizes if (model_name, n) in fits]
        for mix in MIXES:
            base = wall[(model_name, mix, ok[0])] if ok else float("nan")
            grow = [f"{wall[(model_name, mix, n)] / base:.2f}×" if n in ok else "-" for n in sizes]
            kinds = [
                f"{wall[(model_name, mix, n)] / wall[(model_name, 'H100', n)]:.2f}×" if n in ok else "-" for n in sizes
            ]
            g.add_row(model_name, mix, *grow, *kinds)
    console.print(g)


if __name__ == "__main__":
    main()
