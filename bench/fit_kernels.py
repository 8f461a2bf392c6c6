"""Fit the GEMM and flash-attention efficiencies per architecture on published runs, and say how.

    .venv/bin/python bench/fit_kernels.py [--data PATH] [--family mpt] [--split]

Only planner.cost.compute.KernelEfficiency's four figures move (large-GEMM and flash-attention
fractions of peak for Ampere and Hopper); everything else stays derived. Objective: the mean squared
log error, log(predicted / measured), over the family's rows (default: MPT, the only family running
flash attention on both architectures); coordinate descent, golden-section search per figure on
[0.1, 1.0], 3 sweeps from the prior. The other family (Megatron SC'21, Ampere GEMMs only) is the
held-out check. --split fits on every other model size of the family only (125m, 760m, 3b, 13b,
70b for MPT) and scores the sizes it never saw, a check that the figures carry to other shapes.
It prints the fitted figures as a `KernelEfficiency(...)` to store in
planner/cost/fitted.py with this provenance, and the before/after tables of both families.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import replace
from pathlib import Path

import published as P  # noqa: E402

from planner.cost.compute import PRIOR, KernelEfficiency  # noqa: E402
from planner.cost.runtimes import golden  # noqa: E402

ARCHS = ("Ampere", "Hopper")


def with_figure(k: KernelEfficiency, what: str, arch: str, value: float) -> KernelEfficiency:
    pairs = dict(getattr(k, what))
    pairs[arch] = value
    return replace(k, **{what: tuple(sorted(pairs.items()))})


def loss(cases: list[P.Case], k: KernelEfficiency) -> float:
    results, _ = P.price(cases, k)
    return statistics.fmean(math.log(r.cost.step_time_s / r.case.measured_s) ** 2 for r in results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data/published_dev.csv"))
    ap.add_argument("--family", default="mpt")
    ap.add_argument("--split", action="store_true", help="fit on alternate model sizes, score the others")
    args = ap.parse_args(argv)
    cases, _ = P.load(args.data)
    fit_on = [c for c in cases if c.family == args.family]
    unseen: list[P.Case] = []
    if args.split:
        sizes = sorted({c.model.num_params() // 10**7 for c in fit_on})
        keep = set(sizes[::2])
        unseen = [c for c in fit_on if c.model.num_params() // 10**7 not in keep]
        fit_on = [c for c in fit_on if c.model.num_params() // 10**7 in keep]
        print(f"fit sizes {sorted({c.model.name for c in fit_on})}, unseen {sorted({c.model.name for c in unseen})}")
    k = replace(PRIOR, gemm=tuple((a, PRIOR.gemm_fraction(a)) for a in ARCHS))
    print(f"fitting on {len(fit_on)} {args.family} rows; prior loss {loss(fit_on, k):.5f}")
    for sweep in range(3):
        for what in ("gemm", "flash"):
            for arch in ARCHS:
                best = golden(lambda v, k=k, w=what, a=arch: loss(fit_on, with_figure(k, w, a, v)), 0.1, 1.0, iters=14)
                k = with_figure(k, what, arch, round(best, 3))
        print(f"sweep {sweep + 1}: gemm {dict(k.gemm)} flash {dict(k.flash)} loss {loss(fit_on, k):.5f}")
    print(f"KernelEfficiency(gemm={k.gemm!r}, flash={k.flash!r})")
    for name, kk in (("prior", PRIOR), ("fitted", k)):
        print(f"-- {name}")
        print(P.table(P.price(cases, kk)[0]))
        if unseen:
            print(f"-- {name}, the {len(unseen)} rows of unseen sizes only")
            print(P.table(P.price(unseen, kk)[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
