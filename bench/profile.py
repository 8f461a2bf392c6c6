"""Cost and noise of layer profiling per model size, with same-run baselines.

    .venv/bin/python bench/profile.py [--models tiny gpt2-small gpt2-medium] [--seq 256] [--repeats 5]

For each model it runs the real profiler subprocess (worker.profile_layers: embedding, block, head
at mbs=1, tp=1, no recompute, one CPU thread) and reports the wall seconds it cost and, per layer,
the median forward+backward time, the noise (inter-quartile spread of the timed blocks as % of the
median) and the achieved GFLOP/s. Baselines in the same run:
- `torch.utils.benchmark.Timer.blocked_autorange` on the same block, fwd+bwd (torch's own
  benchmarking method), to compare the median and the noise against an independent timer;
- a square fp32 matmul's GFLOP/s on one thread: the rate a block's matmuls could reach here;
- what profiling every layer separately would cost (num_layers × the block's share), which the
  profiler avoids by measuring each distinct shape once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.utils.benchmark as tbench

ROOT = Path(__file__).resolve().parents[1]

from planner.specs import flops  # noqa: E402
from planner.specs.model import get_model  # noqa: E402
from worker.layer_bench import Request, build_case  # noqa: E402


def run_profiler(model_name: str, seq: int, repeats: int, min_block_s: float) -> tuple[float, list[dict]]:
    spec = get_model(model_name)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.jsonl"
        cmd = [
            sys.executable,
            "-m",
            "worker.profile_layers",
            "--spec-json",
            spec.model_dump_json(),
            "--out",
            str(out),
            "--mbs",
            "1",
            "--seq",
            str(seq),
            "--tp",
            "1",
            "--recompute",
            "0",
            "--repeats",
            str(repeats),
            "--min-block-s",
            str(min_block_s),
            "--device",
            "cpu",
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, timeout=1800, cwd=ROOT, env=env, capture_output=True)
        wall = time.perf_counter() - t0
        return wall, [json.loads(line) for line in out.read_text().splitlines()]


def timer_baseline(model_name: str, seq: int) -> tuple[float, float]:
    """(median s, IQR % of median) of block fwd+bwd with torch.utils.benchmark, in this process."""
    case = build_case(get_model(model_name), Request("block", 1, seq, 1, False), "cpu", "fp32")
    m = tbench.Timer("case.backward(case.forward())", globals={"case": case}, num_threads=1).blocked_autorange(
        min_run_time=1.0
    )
    return m.median, 100 * m.iqr / m.median


def matmul_gflops(n: int = 1024) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    m = tbench.Timer("a @ b", globals={"a": a, "b": b}, num_threads=1).blocked_autorange(min_run_time=1.0)
    return 2 * n**3 / m.median / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["tiny", "gpt2-small", "gpt2-medium"])
    p.add_argument("--seq", type=int, default=256, help="sequence length (capped at each model's seq_len)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min-block-s", type=float, default=0.05)
    args = p.parse_args()
    torch.set_num_threads(1)

    print(f"torch {torch.__version__}, 1 thread, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"baseline: 1024³ fp32 matmul {matmul_gflops():.1f} GFLOP/s\n")
    head = (
        f"{'model':<12}{'seq':>5}{'profile s':>10}{'layer':>10}{'fwd ms':>10}{'bwd ms':>10}{'noise %':>9}"
        f"{'GFLOP/s':>9}{'act MB':>9}{'Timer ms':>10}{'Timer %':>9}{'per-layer s':>12}"
    )
    print(head)
    print("-" * len(head))
    for name in args.models:
        spec = get_model(name)
        seq = min(args.seq, spec.seq_len)
        wall, rows = run_profiler(name, seq, args.repeats, args.min_block_s)
        t_med, t_iqr = timer_baseline(name, seq)
        for r in rows:
            train = r["forward_s"] + r["backward_s"]
            spread = 100 * (r["forward_spread_s"] + r["backward_spread_s"]) / train
            extra = f"{t_med * 1e3:>10.2f}{t_iqr:>9.1f}" if r["layer_kind"] == "block" else f"{'':>19}"
            # Timed iterations of one block measurement: warm-up (2), the sizing block (1), repeats × inner.
            block_cost_s = train * (3 + r["repeats"] * r["inner_iters"])
            print(
                f"{name:<12}{seq:>5}{wall:>10.1f}{r['layer_kind']:>10}{r['forward_s'] * 1e3:>10.2f}"
                f"{r['backward_s'] * 1e3:>10.2f}{spread:>9.1f}{r['achieved_flop_per_s'] / 1e9:>9.1f}"
                f"{r['activation_bytes'] / 1e6:>9.2f}{extra}"
                + (f"{block_cost_s * spec.num_layers:>12.1f}" if r["layer_kind"] == "block" else "")
            )
        blk = next(r for r in rows if r["layer_kind"] == "block")
        analytic = flops.block_activation_bytes(spec, 1, seq, 1, "fp32")
        print(
            f"{'':<12}block activations measured {blk['activation_bytes'] / 1e6:.2f} MB vs analytic "
            f"{analytic / 1e6:.2f} MB ({blk['activation_bytes'] / analytic:.3f}×)"
        )
    print(
        "\nnoise % = IQR of timed blocks (fwd + bwd) as % of the median; Timer = torch.utils.benchmark on the "
        "same block;\nper-layer s = timed seconds a profiler measuring each of the num_layers blocks separately "
        "would spend (one block's timed iterations × num_layers); the profiler spends them once"
    )


if __name__ == "__main__":
    main()
