"""Fidelity of the time model: predicted vs measured step time of real torchrun runs on this machine.

    OMP_NUM_THREADS=1 .venv/bin/python bench/fidelity.py [--rounds 2] [--steps 8] [--state-dir DIR]

1. Discover: worker.netbench under torchrun at 1, 2 and 4 ranks (per-rank matmul rate, memory
   bandwidth, gloo α–β fits per op), stored in a DuckDB file in the state folder.
2. Profile one model (FIDELITY_MODEL below) with worker.profile_layers: every (layer kind, mbs, tp,
   recompute) the plans use, one process, one thread, into the same DuckDB file.
3. For each plan: predict with planner.cost.estimate on the cluster discovered at the plan's rank
   count plus the measured profiles, and measure with torchrun + worker.train (median over steady
   steps of the slowest rank's step_time_s, warm-up steps dropped). Plans are run round-robin for
   `--rounds` rounds, so slow phases of the shared machine spread over all plans; the measured
   figure is the median over rounds.
Printed: plan, predicted, measured, error %, then MAPE and Spearman ρ for the cost model and for the
same-run baseline: FLOPs only (model training FLOPs / (ranks × measured per-rank matmul rate)).

The model: GPT, d=256, 4 heads, 8 layers, seq 128, vocab 512. A block's fwd+bwd at mbs=1 is ~10 ms on
one core, so per-micro-batch gloo and pipelining overheads (~0.1–1 ms) are visible but do not
dominate, and a 4-rank step stays under ~1 s so ≥ 8 plans × 2 rounds fit in a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from planner import flops  # noqa: E402
from planner.calibrate import Calibration, cpu_calibration  # noqa: E402
from planner.cluster import ClusterSpec  # noqa: E402
from planner.cost import estimate  # noqa: E402
from planner.model import ModelSpec  # noqa: E402
from planner.plan import Plan, parse_plan  # noqa: E402
from planner.profiles import ProfileTable  # noqa: E402
from planner.profiling import profile_keys  # noqa: E402

FIDELITY_MODEL = ModelSpec(name="fidelity-gpt", family="gpt", num_layers=8, hidden=256, num_heads=4,
                           vocab_size=512, seq_len=128)  # fmt: skip
SEQ = 128
WARMUP_STEPS = 2


def _stage(a: int, b: int, devs: list[int], tp: int = 1, dp: int = 1, rec: str = "none", shard: str = "none") -> dict:
    return {"layer_start": a, "layer_end": b, "device_ids": devs, "tp": tp, "dp": dp, "recompute": rec,
            "sharding": shard}  # fmt: skip


def fidelity_plans() -> dict[str, dict]:
    """≥ 8 distinct plans on 2–4 ranks: pp, dp, tp, mbs, #micro-batches, schedules, recompute,
    sharding, uneven splits and unequal batch shares (name → Plan fields)."""
    L = FIDELITY_MODEL.num_layers
    return {
        "pp2 1f1b mbs2 m4": dict(mbs=2, gb=8, sched="1f1b", stages=[_stage(0, 4, [0]), _stage(4, L, [1])], shares=[8]),
        "pp2 gpipe mbs1 m8 3/5": dict(
            mbs=1, gb=8, sched="gpipe", stages=[_stage(0, 3, [0]), _stage(3, L, [1])], shares=[8]
        ),
        "pp2 1f1b rec mbs2": dict(
            mbs=2, gb=8, sched="1f1b", stages=[_stage(0, 4, [0], rec="full"), _stage(4, L, [1], rec="full")], shares=[8]
        ),
        "dp2 none mbs2": dict(mbs=2, gb=8, sched="1f1b", stages=[_stage(0, L, [0, 1], dp=2)], shares=[4, 4]),
        "dp2 zero2 6/2": dict(
            mbs=2, gb=8, sched="1f1b", stages=[_stage(0, L, [0, 1], dp=2, shard="zero2")], shares=[6, 2]
        ),
        "dp2 zero3 mbs4": dict(
            mbs=4, gb=8, sched="1f1b", stages=[_stage(0, L, [0, 1], dp=2, shard="zero3")], shares=[4, 4]
        ),
        "tp2 mbs2": dict(mbs=2, gb=4, sched="1f1b", stages=[_stage(0, L, [0, 1], tp=2)], shares=[4]),
        "pp2xdp2 1f1b": dict(
            mbs=2, gb=8, sched="1f1b", stages=[_stage(0, 4, [0, 1], dp=2), _stage(4, L, [2, 3], dp=2)], shares=[4, 4]
        ),
        "pp4 1f1b 1/2/2/3": dict(
            mbs=1,
            gb=8,
            sched="1f1b",
            stages=[_stage(0, 1, [0]), _stage(1, 3, [1]), _stage(3, 5, [2]), _stage(5, L, [3])],
            shares=[8],
        ),  # fmt: skip
        "dp4 none mbs2": dict(
            mbs=2, gb=8, sched="gpipe", stages=[_stage(0, L, [0, 1, 2, 3], dp=4)], shares=[2, 2, 2, 2]
        ),
    }


def make_plan(name: str, f: dict) -> Plan:
    return parse_plan({"version": 1, "model": FIDELITY_MODEL.name, "cluster": "this-machine",
                       "global_batch_size": f["gb"], "seq_len": SEQ, "micro_batch_size": f["mbs"],
                       "schedule": f["sched"], "dtype": "fp32", "stages": f["stages"], "batch_shares": f["shares"],
                       "provenance": {"algorithm": "manual"}}, name)  # fmt: skip


# ---- stage 1 and 2: discover and profile into DuckDB ---------------------------------------------


def discover(db: Path, state: Path, num_ranks: int, timeout_s: float) -> str:
    """Run netbench at `num_ranks` and store it; its hardware fingerprint."""
    from tasks.discover import ingest_snapshot, run_netbench

    run_dir = state / f"discover-{num_ranks}"
    run_dir.mkdir(parents=True, exist_ok=True)
    sizes = [1 << 10, 1 << 14, 1 << 17, 1 << 19, 1 << 21]
    # 1024³ matmuls (the netbench default): big enough to leave the caches, so concurrent ranks
    # contend for memory as the model's matmuls do; 7 repeats for a median under a noisy neighbour
    path = run_netbench.fn(str(run_dir), num_ranks, sizes, 7, 1024, timeout_s)
    return ingest_snapshot.fn(str(db), path)


def profile(db: Path, state: Path, plans: list[Plan], timeout_s: float) -> ProfileTable:
    """Measure every layer shape the plans need (one profiler subprocess per tp) and load the table."""
    import torch

    from storage.profiles import load_profile_table, missing_keys, upsert_profiles
    from tasks.profile import profile_group

    mbs = sorted({p.micro_batch_size for p in plans})
    keys = []
    for tp in sorted({s.tp for p in plans for s in p.stages}):
        keys += profile_keys("cpu", mbs, [SEQ], [tp], "fp32", (False, True))
    todo = missing_keys(db, keys, FIDELITY_MODEL, torch.__version__)
    for tp in sorted({k.tp for k in todo}):
        group = [k for k in todo if k.tp == tp]
        rows = profile_group.fn(FIDELITY_MODEL, group, torch.__version__, 5, 0.1, timeout_s, str(state / "profile"))
        upsert_profiles(db, rows)
    return load_profile_table(db, FIDELITY_MODEL, ["cpu"])


def speed_probe_flop_per_s(window_s: float = 0.5) -> float:
    """This process's one-thread 512³ matmul rate over `window_s` of wall time: the share of a core
    other users of the shared machine leave us right now (a load proxy taken next to each measurement)."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    a @ b
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < window_s:
        a @ b
        n += 1
    return 2 * 512**3 * n / (time.perf_counter() - t0)


# ---- stage 4: measure with torchrun -------------------------------------------------------------


def measure(plan: Plan, name: str, state: Path, steps: int, timeout_s: float) -> float:
    """Launch one real torchrun run of `plan`; its measured step time (`run_step_time_s`)."""
    from worker.launch import Launch, log_tail, run_logged, torchrun_command

    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=state))
    before = speed_probe_flop_per_s()
    (run_dir / "plan.json").write_text(plan.to_json())
    spec_file = run_dir / "model.json"
    spec_file.write_text(FIDELITY_MODEL.model_dump_json())
    launch = Launch(plan_path=str(run_dir / "plan.json"), run_dir=str(run_dir), run_id=run_dir.name, steps=steps,
                    nproc_per_node=plan.num_devices, data="synthetic", checkpoint_every=0, resume="none",
                    collective_timeout_s=120.0)  # fmt: skip
    # No checkpoint: worker.train saves one at the last step, after the last timed step, so it costs
    # wall time but is outside every step_time_s.
    cmd = torchrun_command(launch) + ["--model-json", str(spec_file)]
    rc, _ = run_logged(cmd, run_dir / "torchrun.log", timeout_s)
    probe = {"before_flop_per_s": before, "after_flop_per_s": speed_probe_flop_per_s()}
    (run_dir / "speed_probe.json").write_text(json.dumps(probe))
    if rc != 0:
        raise RuntimeError(f"{name}: torchrun exited {rc}:\n{log_tail(run_dir / 'torchrun.log')}")
    return run_step_time_s(run_dir)


def probe_speed(path: Path) -> float:
    """Mean of the speed probes taken before and after a measurement (NaN when none was stored)."""
    if not path.is_file():
        return float("nan")
    p = json.loads(path.read_text())
    return (p["before_flop_per_s"] + p["after_flop_per_s"]) / 2


def run_step_time_s(run_dir: Path) -> float:
    """Median over steady steps (warm-up dropped) of the slowest rank's step_time_s in a run's telemetry."""
    per_step: dict[int, float] = {}
    for f in (run_dir / "telemetry").glob("rank_*.jsonl"):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            per_step[r["step"]] = max(per_step.get(r["step"], 0.0), r["step_time_s"])
    steady = [t for s, t in sorted(per_step.items()) if s >= WARMUP_STEPS]
    return statistics.median(steady)


# ---- predictions and statistics -------------------------------------------------------------------


def flops_only_s(plan: Plan, cluster: ClusterSpec) -> float:
    """Naive baseline: training FLOPs of the step / (ranks × measured per-rank matmul FLOP/s)."""
    work = flops.model_flops_per_step(FIDELITY_MODEL, plan.global_batch_size, plan.seq_len)
    return work / (plan.num_devices * cluster.nodes[0].peak_flop_per_s("fp32"))


def ranks(xs: list[float]) -> list[float]:
    """Average ranks (ties share the mean rank), 1-based."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman ρ = Pearson correlation of the rank vectors (handles ties)."""
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def mape(pred: list[float], meas: list[float]) -> float:
    return 100 * statistics.fmean(abs(p - m) / m for p, m in zip(pred, meas, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="round-robin passes over the plans")
    ap.add_argument("--steps", type=int, default=7, help="steps per run (the first 2 are warm-up)")
    ap.add_argument("--state-dir", default="", help="keep DuckDB + runs here (default: a temp folder)")
    ap.add_argument("--only", nargs="*", default=None, help="plan names to run")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--replay", action="store_true", help="re-price the snapshots and runs stored in --state-dir")
    args = ap.parse_args()
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="meshplan-fidelity-")).resolve()
    state.mkdir(parents=True, exist_ok=True)
    db = state / "meshplan.duckdb"
    from storage.hardware import list_snapshots, load_snapshot

    t0 = time.perf_counter()
    print(f"state {state}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    clusters: dict[int, ClusterSpec] = {}
    calibs: dict[int, Calibration] = {}
    single = 0.0
    stored_fps = {}
    if args.replay:  # the snapshots a previous run stored, by rank count
        frame = list_snapshots(db)
        stored_fps = dict(zip(frame["num_devices"].to_list(), frame["fingerprint"].to_list(), strict=True))
    for n in (1, 2, 4):
        fp = stored_fps[n] if args.replay else discover(db, state, n, args.timeout_s)
        stored = load_snapshot(db, fp)
        clusters[n] = stored.cluster
        rates = stored.devices["measured_flop_per_s"].to_list()
        single = single or statistics.median(rates)
        node = clusters[n].nodes[0]
        line = (f"discover {n} rank(s): {statistics.median(rates) / 1e9:.1f} GFLOP/s per rank, "
                f"{node.memory_bandwidth_bytes_per_s / 1e9:.1f} GB/s memory, send/recv α "
                f"{node.intra_link.latency_s * 1e6:.0f} µs {node.intra_link.bandwidth_bytes_per_s / 1e9:.2f} GB/s")  # fmt: skip
        if n > 1:
            calibs[n] = cpu_calibration(single, rates, stored.fits.to_dicts(), n, os.cpu_count())
            ar = calibs[n].fit("all_reduce")
            line += f"; slowdown {calibs[n].compute_slowdown:.2f}"
            line += f", all_reduce α {ar.alpha_s * 1e6:.0f} µs {1 / ar.beta_s_per_byte / 1e9:.2f} GB/s" if ar else ""
        print(line)
    specs = fidelity_plans()
    names = [n for n in specs if args.only is None or n in args.only]
    plans = {n: make_plan(n, specs[n]) for n in names}
    probe_file = state / "profile_speed_probe.json"
    if not args.replay:
        before = speed_probe_flop_per_s()
        table = profile(db, state, list(plans.values()), args.timeout_s)
        probe_file.write_text(json.dumps({"before_flop_per_s": before, "after_flop_per_s": speed_probe_flop_per_s()}))
    table = profile(db, state, list(plans.values()), args.timeout_s)
    profile_speed = probe_speed(probe_file)
    print(f"profiled {sum(1 for r in table if not r.estimated)} layer shapes in {time.perf_counter() - t0:.0f} s\n")

    measured: dict[str, list[float]] = {n: [] for n in names}
    speeds: dict[str, list[float]] = {n: [] for n in names}
    if args.replay:  # re-price the runs a previous invocation measured (run folders in launch order)
        by_fp = {plans[n].fingerprint(): n for n in names}
        for d in sorted(state.glob("run-*"), key=lambda d: d.stat().st_mtime):
            hit = by_fp.get(Plan.model_validate_json((d / "plan.json").read_text()).fingerprint())
            if hit is not None and (d / "telemetry").is_dir():
                measured[hit].append(run_step_time_s(d))
                speeds[hit].append(probe_speed(d / "speed_probe.json"))
    for rnd in range(0 if args.replay else args.rounds):
        for n in names:
            measured[n].append(measure(plans[n], n, state, args.steps, args.timeout_s))
            speeds[n].append(
                probe_speed(sorted(state.glob("run-*"), key=lambda d: d.stat().st_mtime)[-1] / "speed_probe.json")
            )
        print(f"round {rnd + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.2f}")

    rows = []
    for n in names:
        plan, cluster = plans[n], clusters[plans[n].num_devices]
        cal = calibs[plan.num_devices]
        pred = estimate(plan, FIDELITY_MODEL, cluster, table, calibration=cal).step_time_s
        raw = estimate(plan, FIDELITY_MODEL, cluster, table).step_time_s
        # load-normalised: the run-time share of a core vs the profile-time share scales compute
        load = profile_speed / statistics.median(speeds[n])
        normed = float("nan")
        if load == load:  # no probes in runs stored by an older bench: no normalised figure
            normed = estimate(
                plan,
                FIDELITY_MODEL,
                cluster,
                table,
                calibration=replace(cal, compute_slowdown=cal.compute_slowdown * load),
            ).step_time_s
        rows.append((n, plan.num_devices, pred, raw, flops_only_s(plan, cluster), statistics.median(measured[n]),
                     measured[n], normed, load))  # fmt: skip
    head = (f"{'plan':<24}{'ranks':>6}{'predicted s':>13}{'measured s':>12}{'error %':>9}{'uncalib s':>11}{'err %':>8}"
            f"{'FLOPs-only s':>14}{'err %':>8}{'load×':>7}{'normed s':>10}{'err %':>8}  rounds s")  # fmt: skip
    print(head)
    print("-" * len(head))
    for n, k, p, u, b, m, ms, z, ld in rows:
        print(f"{n:<24}{k:>6}{p:>13.4f}{m:>12.4f}{100 * (p - m) / m:>+9.1f}{u:>11.4f}{100 * (u - m) / m:>+8.1f}"
              f"{b:>14.4f}{100 * (b - m) / m:>+8.1f}{ld:>7.2f}{z:>10.4f}{100 * (z - m) / m:>+8.1f}  "
              + " ".join(f"{x:.3f}" for x in ms))  # fmt: skip
    print(f"\nprofile-time speed probe {profile_speed / 1e9:.1f} GFLOP/s; load× = that / the runs' median probe")
    meas = [r[5] for r in rows]
    for label, col in (("cost model (calibrated)", 2), ("cost model (uncalibrated)", 3), ("FLOPs only (baseline)", 4),
                       ("calibrated, load-normalised", 7)):  # fmt: skip
        pred = [r[col] for r in rows]
        print(f"{label:<26}: MAPE {mape(pred, meas):5.1f} %   Spearman ρ {spearman(pred, meas):+.3f}")
    print(f"targets: MAPE ≤ 10 %, ρ ≥ 0.9; load average at end {os.getloadavg()[0]:.2f}; "
          f"wall {time.perf_counter() - t0:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
