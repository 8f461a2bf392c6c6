"""Tensor-parallel serving on real ranks beside the pipeline-free baseline, in one run.

One model (hidden 192, 4 blocks, 128-token requests, Gamma arrivals) served by `meshplan serve
--replay` twice on the same trace: a 1-rank group (tp = 1, the baseline) and a 2-rank group (tp = 2,
heads / MLP / embedding / head split, worker/serve.py). Per run: the stage time the ranks calibrated
at start-up, the median per-request service time they logged, measured vs simulated p50 / p99, and
the ratio of each to the baseline's. On a CPU box the all-reduces cost more than the halved matmuls
save at this size; the table shows by how much, and that the calibrated simulator follows either way.

    PYTHONPATH=. python bench/serve_tp.py [--duration-s 4] [--hidden 192]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from planner.serve.workload import ServedModel, Workload, make_trace

CLUSTER = """name = "cpu-2"
[[nodes]]
name = "cpu"
device = "cpu"
num_devices = 2
intra_link = "eth-100g"
inter_link = "eth-100g"
device_memory_bytes = 8000000000
device_peak_flop_per_s = 50000000000
"""


def run(tmp: Path, model: dict, tp: int, trace_csv: str) -> dict:
    tmp.mkdir(parents=True)
    (tmp / "cpu.toml").write_text(CLUSTER)
    group = {"devices": list(range(tp)), "kind": "cpu", "pp": 1, "tp": tp, "models": [model["name"]]}
    pl = {"method": "manual", "cluster": "cpu-2", "dtype": "fp32", "models": [model], "groups": [group]}
    (tmp / "placement.json").write_text(json.dumps(pl))
    (tmp / "trace.csv").write_text(trace_csv)
    env = dict(os.environ, PREFECT_HOME=str(tmp / "prefect"), OMP_NUM_THREADS="1")
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp), "serve", "--port", "0"]
    cmd += ["--placement", str(tmp / "placement.json"), "--cluster", str(tmp / "cpu.toml")]
    cmd += ["--replay", str(tmp / "trace.csv")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"tp={tp}: meshplan serve exited {p.returncode}\n{p.stderr[-3000:]}")
    row = next(ln for ln in p.stdout.splitlines() if ln.startswith("all "))
    p50m, p50s, p99m, p99s = (float(x) for x in re.findall(r"([\d.]+)ms", row))
    calib = json.loads(next(tmp.glob("runs/*/calib_rank0.json")).read_text())["stage_s"][model["name"]]
    served = json.loads(next(tmp.glob("runs/*/stage_rank0.json")).read_text())["requests"]
    service = statistics.median(r["compute_s"] for r in served)
    return {"tp": tp, "calib_ms": 1e3 * calib, "service_ms": 1e3 * service, "p50": p50m, "p50_sim": p50s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration-s", type=float, default=4.0)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--rate", type=float, default=4.0)
    args = ap.parse_args()
    dims = {"name": "m", "hidden": args.hidden, "num_layers": 4, "num_heads": 4, "vocab_size": 512, "seq_len": 128}
    model = {"name": "m", "dims": dims, "rate": args.rate, "cv": 2, "slo_s": 5.0}
    trace = make_trace(Workload(models=(ServedModel.model_validate(model),), duration_s=args.duration_s, seed=5))
    with tempfile.TemporaryDirectory() as d:
        rows = [run(Path(d) / f"tp{tp}", model, tp, trace.to_csv(["m"])) for tp in (1, 2)]
    base = rows[0]
    print(f"{len(trace)} requests, hidden {args.hidden}, 4 blocks, 128 tokens, load {os.getloadavg()[0]:.1f}")
    print(f"{'tp':>3} {'calib ms':>9} {'service ms':>11} {'× tp1':>6} {'p50 meas':>9} {'p50 sim':>8} {'× tp1':>6}")
    for r in rows:
        print(
            f"{r['tp']:>3} {r['calib_ms']:>9.1f} {r['service_ms']:>11.1f} {r['service_ms'] / base['service_ms']:>6.2f} "
            f"{r['p50']:>9.1f} {r['p50_sim']:>8.1f} {r['p50'] / base['p50']:>6.2f}"
        )


if __name__ == "__main__":
    main()
