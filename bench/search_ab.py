"""Complete-search CPU time of this tree against a base revision, alternating, with the best plans compared.

For each model, the complete search (no budget, no baselines) on the bench's H100+A100+V100 cluster
(bench/search.py) runs in fresh processes, alternating base and this tree, N times each; each figure is
the minimum CPU time (time.process_time, so the other processes of a shared machine count less) of the
second search in its process (the first imports and warms). Prints base s, new s, their ratio, and
whether the best plan's fingerprint and the top-k step times agree (the speedups must be exact).

    OMP_NUM_THREADS=1 .venv/bin/python bench/search_ab.py [--base 659d758] [--models llama3-70b] [--gpus 1024] [--repeat 3]
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
sys.path.insert(0, "bench")
from search import make_cluster
from planner.search import search
from planner.specs.model import get_model
m, c = get_model({model!r}), make_cluster({gpus}, "H100+A100+V100")
kw = dict(global_batch=max(512, {gpus}), time_budget_s=float("inf"), baselines=False)
search(m, c, **kw)
t = time.process_time()
r = search(m, c, **kw)
cpu = time.process_time() - t
print(json.dumps([cpu, r.best.fingerprint(), [p.predicted.step_time_s for p in r.plans]]))
"""


def run(tree: Path, model: str, gpus: int) -> tuple[float, str, list[float]]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(model=model, gpus=gpus)],
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
    ap.add_argument("--base", default="659d758", help="git revision to compare against")
    ap.add_argument("--models", default="llama3-70b,gpt3-175b,llama3-405b")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    t = Table(title=f"complete search CPU s, H100+A100+V100 at {args.gpus} GPUs: {args.base} vs this tree, "
              f"min of {args.repeat} alternating runs")  # fmt: skip
    for col in ("model", "base s", "new s", "base / new", "same best plan", "same top-k"):
        t.add_column(col)
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", args.base, "planner", "bench"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        for model in args.models.split(","):
            res: dict[str, list] = {"base": [], "new": []}
            for _ in range(args.repeat):
                res["base"].append(run(Path(tmp), model, args.gpus))
                res["new"].append(run(ROOT, model, args.gpus))
            b, n = min(r[0] for r in res["base"]), min(r[0] for r in res["new"])
            same_fp = res["base"][0][1] == res["new"][0][1]
            same_top = res["base"][0][2] == res["new"][0][2]
            t.add_row(model, f"{b:.2f}", f"{n:.2f}", f"{b / n:.2f}×", str(same_fp), str(same_top))
    Console(width=160).print(t)


if __name__ == "__main__":
    main()
