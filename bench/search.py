"""Search wall time, completeness and regret at 8 … 16,384 GPUs, one to four device kinds (issues #18, #32).

For gpt3-175b, llama3-70b and llama3-405b on clusters of H100 (NDR), H100+A100 (NDR/HDR),
H100+A100+V100 (NDR/HDR/EDR) and H100+A100+V100+L40S (… and PCIe 4 / 200G Ethernet), each case runs
the complete search (no time budget) and the budgeted one at the CLI default budget
(planner.specs.config, 2 s), both without baselines, and prints: wall time of each (median of
--repeat runs) and the complete search's CPU time (the machine is shared: wall time counts others' load), the figure issue #32 measured before its work where it gave one, whether the
complete search met its target (≤ 0.5 s; ≤ 0.1 s at 16 GPUs), whether the budgeted one was
complete and its gap, its regret (best step time over the complete search's best, minus one; the
target is 0 everywhere), the best plan, and how the complete search's time grows with GPU count
(ratio to the smallest size) and with device kinds (ratio to one kind at the same size). Then the
CLI's start-up: `meshplan --help` and `meshplan plan` (whole process, llama3-70b at 1,024 GPUs of
three kinds; targets 0.3 s and 1.0 s).

    OMP_NUM_THREADS=1 .venv/bin/python bench/search.py [--quick] [--repeat 3] [--models a,b] [--sizes 64,1024] [--seq 2048]

--quick: llama3-70b, 16, 64 and 1,024 GPUs. --repeat N: each wall time is the median of N runs
(the machine is shared; say which N a figure used). Growth ratios are to the smallest size at which
the model fits (below it the search answers "infeasible" at once, which says nothing about its growth).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    "L40S": ("L40S", "pcie4", "eth-200g"),
}
MIXES = {
    "H100": {"H100": 1.0},
    "H100+A100": {"H100": 0.5, "A100": 0.5},
    "H100+A100+V100": {"H100": 0.5, "A100": 0.25, "V100": 0.25},
    "H100+A100+V100+L40S": {"H100": 0.25, "A100": 0.25, "V100": 0.25, "L40S": 0.25},
}
# complete-search seconds issue #32 measured before its work (llama3-70b, this 2-core machine)
BEFORE = {
    ("llama3-70b", "H100", 1024): 0.36,
    ("llama3-70b", "H100+A100", 1024): 1.80,
    ("llama3-70b", "H100+A100+V100", 1024): 3.16,
    ("llama3-70b", "H100+A100+V100", 64): 4.27,
}


def make_cluster(num_gpus: int, mix: str):
    return parse_cluster(cluster_doc(num_gpus, mix))


def cluster_doc(num_gpus: int, mix: str) -> dict:
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
    return {"name": f"{mix}-{num_gpus}", "nodes": nodes}


def _best(res) -> float | None:
    return None if isinstance(res, NoFeasiblePlan) else res.best.predicted.step_time_s


def _timed(model, cluster, gb: int, budget: float, repeat: int = 1, seq: int | None = None):
    """(result, median wall s, median CPU s of this process): on a shared machine the CPU time says
    what the search costs, the wall time what a user waits (and what the budget cuts on)."""
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        res = search(model, cluster, global_batch=gb, seq=seq, time_budget_s=budget, baselines=False)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return res, statistics.median(walls), statistics.median(cpus)


def _toml(doc: dict) -> str:
    lines = [f'name = "{doc["name"]}"']
    for n in doc["nodes"]:
        lines += ["", "[[nodes]]"] + [f"{k} = {v!r}".replace("'", '"') for k, v in n.items()]
    return "\n".join(lines) + "\n"


def cli_startup(repeat: int) -> list[tuple[str, float, float]]:
    """Median whole-process seconds of `meshplan --help` and `meshplan plan` (llama3-70b, 1,024 GPUs
    of three kinds, estimates only, nothing stored), each in a fresh interpreter, with its target."""
    with tempfile.TemporaryDirectory() as tmp:
        cfile = Path(tmp) / "cluster.toml"
        cfile.write_text(_toml(cluster_doc(1024, "H100+A100+V100")))
        cli = [sys.executable, "-m", "cli", "--state-dir", tmp]
        cases = [
            ("meshplan --help", cli + ["--help"], 0.3),
            ("meshplan plan (1,024 GPUs, 3 kinds)", cli + ["plan", "--model", "llama3-70b", "--cluster", str(cfile),
                                                         "--no-store"], 1.0),
        ]  # fmt: skip
        out = []
        for name, cmd, target in cases:
            walls = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True, timeout=120, env=os.environ | {"COLUMNS": "200"})
                walls.append(time.perf_counter() - t0)
            out.append((name, statistics.median(walls), target))
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="llama3-70b only, 64 and 1,024 GPUs")
    ap.add_argument("--repeat", type=int, default=3, help="wall time = median of this many runs")
    ap.add_argument("--models", default="", help="comma-separated model names")
    ap.add_argument("--sizes", default="", help="comma-separated GPU counts")
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's)")
    args = ap.parse_args()
    sizes = [16, 64, 1024] if args.quick else [8, 16, 64, 512, 1024, 4096, 16384]
    models = ["llama3-70b"] if args.quick else ["gpt3-175b", "llama3-70b", "llama3-405b"]
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else sizes
    models = args.models.split(",") if args.models else models
    budget = SearchConfig().time_budget_s
    console = Console(width=220)
    t = Table(
        title=f"meshplan search: complete (no budget) vs budgeted ({budget:g} s, the CLI default), "
        f"wall s = median of {args.repeat}"
    )
    for col in ("model", "GPUs", "kinds", "complete s", "cpu s", "before #32", "target", "budgeted s", "regret",
                "budgeted complete", "gap", "shapes", "step s", "MFU", "best layout"):  # fmt: skip
        t.add_column(col)
    wall: dict[tuple[str, str, int], float] = {}
    fits: set[tuple[str, str, int]] = set()
    misses = regrets = 0
    for model_name in models:
        model = get_model(model_name)
        for n in sizes:
            for mix in MIXES:
                cluster = make_cluster(n, mix)
                gb = max(512, n)
                full, full_s, full_cpu = _timed(model, cluster, gb, float("inf"), args.repeat, args.seq)
                cut, cut_s, _ = _timed(model, cluster, gb, budget, args.repeat, args.seq)
                if not isinstance(full, NoFeasiblePlan):
                    fits.add((model_name, mix, n))
                wall[(model_name, mix, n)] = full_s
                limit = 0.1 if n <= 16 else 0.5
                met = "met" if full_s <= limit else "NOT met"
                misses += full_s > limit
                before = BEFORE.get((model_name, mix, n))
                console.print(f"{model_name:12s} {n:6d} {mix:15s} complete {full_s:6.2f} s, budgeted {cut_s:6.2f} s",
                              highlight=False)  # fmt: skip
                f, c = _best(full), _best(cut)
                # 0 exactly when the budgeted search returns the complete search's best plan
                regret = "-" if f is None or c is None else f"{c / f - 1:.2%}"
                regrets += f is not None and (c is None or c > f * (1 + 1e-9))
                if f is not None and c is not None and full.best.fingerprint() != cut.best.fingerprint():
                    regret += " (other plan)"
                if isinstance(full, NoFeasiblePlan):
                    row = ["-", "-", "infeasible: " + full.reasons[0][:50] + "…"]
                else:
                    b = full.best
                    row = [f"{b.predicted.step_time_s:.3g}", f"{b.predicted.mfu:.1%}", layout(b)]
                t.add_row(model_name, str(n), mix, f"{full_s:.2f}", f"{full_cpu:.2f}", "-" if before is None else f"{before:.2f}",
                          f"≤{limit:g} s {met}", f"{cut_s:.2f}", regret, str(cut.stats.complete),
                          f"{cut.stats.gap_fraction:.1%}", str(full.stats.shapes), *row)  # fmt: skip
    console.print(t)
    g = Table(title="complete search time growth: ratio to the smallest size the model fits (GPUs) and to one kind")
    for col in ("model", "kinds", *(f"{n} GPUs" for n in sizes), *(f"kinds ratio @{n}" for n in sizes)):
        g.add_column(col)
    for model_name in models:
        for mix in MIXES:
            ok = [n for n in sizes if (model_name, mix, n) in fits]
            base = wall[(model_name, mix, ok[0])] if ok else float("nan")
            grow = [f"{wall[(model_name, mix, n)] / base:.2f}×" if n in ok else "-" for n in sizes]
            kinds = [
                f"{wall[(model_name, mix, n)] / wall[(model_name, 'H100', n)]:.2f}×"
                if n in ok and (model_name, "H100", n) in fits
                else "-"
                for n in sizes
            ]
            g.add_row(model_name, mix, *grow, *kinds)
    console.print(g)
    c = Table(title=f"CLI start-up: whole process, median of {args.repeat}")
    for col in ("command", "s", "target"):
        c.add_column(col)
    for name, s, target in cli_startup(args.repeat):
        c.add_row(name, f"{s:.2f}", f"≤{target:g} s {'met' if s <= target else 'NOT met'}")
    console.print(c)
    console.print(f"complete search over its target in {misses} case(s); budgeted regret > 0 in {regrets} case(s)")


if __name__ == "__main__":
    main()
