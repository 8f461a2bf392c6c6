"""The search under the user's runtime (issue #42 item 5): what searching under X finds that re-ranking
meshplan's plans under X missed, and what it costs.

For each case of bench/search.py's users' table (the 1.4B GPT on A100-40GB + V100-16GB, llama3-70b on
H100 and H100+A100) and each runtime X of planner/specs/data/runtimes.toml, the complete search (no
time budget, no baselines) is run twice:

- **search under X** (planner.cost.runtimes.Pricing, what `plan --runtime X` runs now): its cheapest
  plan's step time under X (`*`: one meshplan's torch runtime would refuse for more than X's stack;
  `plan` ranks the ones it can launch first);
- **re-rank** (what `plan --runtime X` ran before): meshplan's own search (Pricing of meshplan), its
  top k priced under X, the cheapest feasible one (the old re-rank ignored launchability too);

and the table prints both step times, the re-rank's loss (its step over the search's, minus one; ≥ 0
when the search is exact: the re-ranked plans are in the search's space), whether the two best plans
differ, and the CPU seconds of each search (time.process_time; the machine is shared), with the plain
search (no runtime: meshplan's estimate, what bench/search.py times) as the baseline of the ratio.

    OMP_NUM_THREADS=1 .venv/bin/python bench/search_runtime.py [--sizes 16,64] [--top 5] [--runtimes megatron,deepspeed]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from search import GPT_1P4B, make_cluster  # noqa: E402

from planner.cost.runtimes import RUNTIME_NAMES, Pricing, price, profile_named  # noqa: E402
from planner.runtime import launch_problems  # noqa: E402
from planner.search import NoFeasiblePlan, search  # noqa: E402
from planner.specs.model import get_model  # noqa: E402


def cases(sizes: list[int]) -> list[tuple[str, object, str, int]]:
    llama = get_model("llama3-70b")
    out = [(f"gpt-1.4b/{n}/A100-40+V100-16", GPT_1P4B, "A100-40+V100-16", n) for n in sizes]
    return out + [(f"llama3-70b/{n}/{mix}", llama, mix, n) for mix in ("H100", "H100+A100") for n in sizes]


def timed(model, cluster, gb: int, top: int, pricing: Pricing | None):
    c0 = time.process_time()
    res = search(model, cluster, global_batch=gb, top_k=top, time_budget_s=float("inf"), baselines=False,
                 pricing=pricing)  # fmt: skip
    return res, time.process_time() - c0


def undressed(p):
    """A plan on meshplan's own stack, for another runtime to dress (Pricing.dress)."""
    return p.model_copy(update={"attention": "sdpa", "loss": "torch", "dropout": False, "predicted": None})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="16,64,256", help="comma-separated GPU counts")
    ap.add_argument("--top", type=int, default=5, help="plans the search keeps (what the re-rank re-priced)")
    ap.add_argument("--runtimes", default=",".join(n for n in RUNTIME_NAMES if n != "meshplan"))
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    console = Console(width=200)
    t = Table(title=f"complete search under runtime X vs meshplan's search re-ranked under X (top {args.top}); "
              "CPU s = time.process_time")  # fmt: skip
    for col in ("case", "runtime", "search X: step s", "re-rank: step s", "re-rank loss", "other plan",
                "cpu s X", "cpu s plain", "ratio"):  # fmt: skip
        t.add_column(col)
    for label, model, mix, n in cases(sizes):
        cluster = make_cluster(n, mix)
        gb = max(512, n)
        _, plain_cpu = timed(model, cluster, gb, args.top, None)
        mine, _ = timed(model, cluster, gb, args.top, Pricing(profile_named("meshplan")))
        for name in args.runtimes.split(","):
            pc = Pricing(profile_named(name))
            res, cpu = timed(model, cluster, gb, args.top, pc)
            if isinstance(res, NoFeasiblePlan) or isinstance(mine, NoFeasiblePlan):
                t.add_row(label, name, "infeasible" if isinstance(res, NoFeasiblePlan) else "-", "-", "-", "-",
                          f"{cpu:.3f}", f"{plain_cpu:.3f}", "-")  # fmt: skip
                continue
            top = min(res.plans, key=lambda p: p.predicted.step_time_s)  # the cheapest, as the oracle tests compare
            best = top.predicted.step_time_s
            star = "*" if launch_problems(undressed(top)) else ""
            priced = [price(pc.dress(undressed(p)), model, cluster, pc) for p in mine.plans]
            fits = [c.step_time_s for c in priced if c.feasible]
            rer = min(fits) if fits else None
            loss = "none fits" if rer is None else f"{rer / best - 1:+.2%}"
            other = "yes" if rer is None or rer > best * (1 + 1e-9) else "no"
            t.add_row(label, name, f"{best:.5g}{star}", "-" if rer is None else f"{rer:.5g}", loss, other, f"{cpu:.3f}",
                      f"{plain_cpu:.3f}", f"{cpu / plain_cpu:.2f}×" if plain_cpu > 0 else "-")  # fmt: skip
            console.print(
                f"{label:32s} {name:11s} search {best:.5g} s, re-rank {loss}, cpu {cpu:.3f} s", highlight=False
            )
    console.print(t)


if __name__ == "__main__":
    main()
