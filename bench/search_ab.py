"""Complete-search CPU time of this tree against a base revision, alternating, with the best plans compared.

For each model, GPU count and mix (default: the bench's H100+A100+V100 cluster at 1,024 GPUs,
bench/search.py), the complete search (no budget, no baselines) runs in fresh processes, alternating base and this tree, N times each; each figure is
the minimum CPU time (time.process_time, so the other processes of a shared machine count less) of the
second search in its process (the first imports and warms). Prints base s, new s, their ratio, and
whether the best plan's fingerprint, the top-k fingerprints and the top-k step times agree (the
speedups must be exact: "same ranking" is the equality check against the base's search).

    OMP_NUM_THREADS=1 .venv/bin/python bench/search_ab.py [--base b7ec51a] [--models llama3-70b] \
        [--gpus 64,1024] [--mixes H100,H100+A100+V100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys, time
from bench.search import make_cluster
from planner.search import search
from planner.specs.model import get_model
m, c = get_model({model!r}), make_cluster({gpus}, {mix!r})
kw = dict(global_batch=max(512, {gpus}), time_budget_s=float("inf"), baselines=False)
search(m, c, **kw)
t = time.process_time()
r = search(m, c, **kw)
cpu = time.process_time() - t
plans = getattr(r, "plans", ())  # none when nothing fits
print(json.dumps([cpu, [p.fingerprint() for p in plans], [p.predicted.step_time_s for p in plans]]))
"""


def run(tree: Path, model: str, gpus: int, mix: str) -> tuple[float, list[str], list[float]]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(model=model, gpus=gpus, mix=mix)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    cpu, fp, top = json.loads(out.stdout.strip().splitlines()[-1])
    return cpu, fp, top


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="b7ec51a", help="git revision to compare against")
    ap.add_argument("--models", default="llama3-70b,gpt3-175b,llama3-405b")
    ap.add_argument("--gpus", default="1024", help="comma-separated GPU counts")
    ap.add_argument("--mixes", default="H100+A100+V100", help="comma-separated mixes of bench/search.py")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    t = Table(title=f"complete search CPU s: {args.base} vs this tree, min of {args.repeat} alternating runs")
    for col in ("model", "GPUs", "kinds", "base s", "new s", "base / new", "same best plan", "same top-k"):
        t.add_column(col)
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", args.base, "planner", "bench"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        cases = [
            (m, int(g), x) for m in args.models.split(",") for g in args.gpus.split(",") for x in args.mixes.split(",")
        ]
        for model, gpus, mix in cases:
            res: dict[str, list] = {"base": [], "new": []}
            for _ in range(args.repeat):
                res["base"].append(run(Path(tmp), model, gpus, mix))
                res["new"].append(run(ROOT, model, gpus, mix))
            b, n = min(r[0] for r in res["base"]), min(r[0] for r in res["new"])
            same_fp = res["base"][0][1][:1] == res["new"][0][1][:1]
            same_top = res["base"][0][1:] == res["new"][0][1:]  # fingerprints and step times, in order
            t.add_row(model, str(gpus), mix, f"{b:.2f}", f"{n:.2f}", f"{b / n:.2f}×", str(same_fp), str(same_top))
    Console(width=160).print(t)


if __name__ == "__main__":
    main()
