"""Fidelity of the time model: predicted vs measured step time of real torchrun runs on this machine.

    OMP_NUM_THREADS=1 .venv/bin/python bench/fidelity.py [--rounds 5] [--steps 10] [--state-dir DIR] [--replay]
    # issue #42 item 7: the five plans, three rounds (~3 min a round on a quiet 2-core VM, ~9–11 min at load 9–17)
    OMP_NUM_THREADS=1 .venv/bin/python bench/fidelity.py --plans dp2 pp2 tp2 zero3 recompute --rounds 3 --keep best --steps 8

Every round measures, in this order:
1. Discover: worker.netbench under torchrun at 1, 2 and 4 ranks (per-rank matmul rate, memory
   bandwidth, gloo α–β fits per op), a snapshot file per rank count.
2. Profile one model (FIDELITY_MODEL below) with worker.profile_layers: every (layer kind, mbs, tp,
   recompute) the plans use, one process, one thread (itself the median of 3 round-robin passes).
3. The optimizer: torch AdamW's step time per parameter over one block, plain, tensor-parallel and
   FSDP2-sharded, on 2 real ranks stepping at once (worker.profile_layers --optimizer).
4. Every plan once with torchrun + worker.train: the median over steady steps (warm-up dropped)
   of the slowest rank's step_time_s.
Rounds: everything is measured once per round, and of each quantity (snapshot, collective time per
message size, profile row, optimizer step, run) one round's value is kept, the same way for
measurements and predictions: `--keep median` (default) the typical round, which is what a user's
run will see on a machine as busy as it usually is (a 2-core VM moves the same run by ±30 % between
rounds); `--keep best` the least-disturbed round (a neighbour only ever adds time), an estimate of
the machine with nobody else on it. The kept snapshots and
profiles go into a DuckDB file in the state folder; `--replay` re-prices a state folder.
Prediction: planner.cost.estimate on the cluster discovered at the plan's rank count plus the
profiles, with the calibration from discovery (planner.measure.calibrate; nothing fitted on these runs),
and without it. Printed: plan, predicted, measured, error %, then MAPE and Spearman ρ for the cost
model and for the same-run baseline: FLOPs only (model training FLOPs / (ranks × per-rank matmul rate));
and peak memory: estimate's peak_memory_bytes against the ranks' peak RSS before the final checkpoint
(`run_peak_memory`), per pipeline rank, the one furthest off shown. Discovery runs at one rank and at
each rank count the chosen plans use; profiling covers the layer shapes they price with.

The model: GPT, d=256, 4 heads, 8 layers, seq 128, vocab 512. A block's fwd+bwd at mbs=1 is ~10 ms on
one core, so per-micro-batch gloo and pipelining overheads (~0.1–1 ms) are visible but do not
dominate, and a 4-rank step stays under ~1 s so 10 plans × 5 rounds fit in about half an hour.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")

import rundir  # noqa: E402
from planner.cost import estimate  # noqa: E402
from planner.measure.calibrate import (  # noqa: E402
    Calibration,
    cpu_calibration,
    pipeline_overhead_from,
)
from planner.measure.ops import COLLECTIVE_OPS, CONCURRENCY_OPS, FSDP_OPS, BenchOp  # noqa: E402
from planner.measure.profiles import ProfileTable  # noqa: E402
from planner.measure.targets import profile_keys  # noqa: E402
from planner.specs import flops  # noqa: E402
from planner.specs.cluster import ClusterSpec  # noqa: E402
from planner.specs.model import ModelSpec  # noqa: E402
from planner.specs.plan import Plan, parse_plan  # noqa: E402

FIDELITY_MODEL = ModelSpec(
    name="fidelity-gpt", family="gpt", num_layers=8, hidden=256, num_heads=4, vocab_size=512, seq_len=128
)
SEQ = 128
WARMUP_STEPS = 2
KEEP = {"mode": "median"}  # which round's value is kept (--keep): "median" or "best"


def keep(values: list, key=lambda v: v, best_is_max: bool = False):  # noqa: ANN001, ANN201
    """The kept one of `values` (see --keep): the median-ranked by `key` (lower middle of an even
    count), or the best (smallest key, or largest with `best_is_max`)."""
    ranked = sorted(values, key=key, reverse=best_is_max)
    return ranked[0] if KEEP["mode"] == "best" else ranked[(len(ranked) - 1) // 2]


def _stage(a: int, b: int, devs: list[int], tp: int = 1, dp: int = 1, rec: str = "none", shard: str = "none") -> dict:
    return {
        "layer_start": a,
        "layer_end": b,
        "device_ids": devs,
        "tp": tp,
        "dp": dp,
        "recompute": rec,
        "sharding": shard,
    }


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
        ),
        "dp4 none mbs2": dict(
            mbs=2, gb=8, sched="gpipe", stages=[_stage(0, L, [0, 1, 2, 3], dp=4)], shares=[2, 2, 2, 2]
        ),
    }


# `--plans` names: issue #42 item 7's five plans, each one of fidelity_plans()
PLAN_ALIASES = {
    "dp2": "dp2 none mbs2",
    "pp2": "pp2 1f1b mbs2 m4",
    "tp2": "tp2 mbs2",
    "zero3": "dp2 zero3 mbs4",
    "recompute": "pp2 1f1b rec mbs2",
}


def select_plans(names: list[str] | None, only: list[str] | None) -> list[str]:
    """The plan names to run: `--plans` aliases (PLAN_ALIASES) or full names, else `--only`, else all;
    an unknown name exits with one line naming the flag, the value and the choices."""
    specs = fidelity_plans()
    if names is None and only is None:
        return list(specs)
    out = []
    for n in names if names is not None else only:
        full = PLAN_ALIASES.get(n, n)
        if full not in specs:
            raise SystemExit(
                f"--plans {n!r}: no such plan; choose from {', '.join(PLAN_ALIASES)} or {', '.join(specs)}"
            )
        out.append(full)
    return out


def make_plan(name: str, f: dict) -> Plan:
    return parse_plan(
        {
            "version": 1,
            "model": FIDELITY_MODEL.name,
            "cluster": "this-machine",
            "global_batch_size": f["gb"],
            "seq_len": SEQ,
            "micro_batch_size": f["mbs"],
            "schedule": f["sched"],
            "dtype": "fp32",
            "stages": f["stages"],
            "batch_shares": f["shares"],
            "provenance": {"algorithm": "manual"},
        },
        name,
    )


# ---- stage 1 and 2: discover and profile into DuckDB ---------------------------------------------


def discover_pass(state: Path, num_ranks: int, rnd: int, timeout_s: float) -> None:
    """One netbench run at `num_ranks`, its snapshot kept in the state folder (round `rnd`)."""
    from tasks.discover import run_netbench

    run_dir = state / f"discover-{num_ranks}-{rnd}"
    run_dir.mkdir(parents=True, exist_ok=True)
    # up to 32 MB: the fidelity model's whole gradient (~26 MB) is one all-reduce; fits on ≤ 2 MB
    # messages extrapolated it badly (α of several ms and β = 0 at 4 ranks on 2 cores)
    sizes = [1 << 10, 1 << 14, 1 << 17, 1 << 19, 1 << 21, 1 << 23, 1 << 25]
    # 1024³ matmuls (the netbench default): big enough to leave the caches, so concurrent ranks
    # contend for memory as the model's matmuls do; 7 repeats for a median under a noisy neighbour
    run_netbench.fn(str(run_dir), num_ranks, sizes, 7, 1024, timeout_s)


def best_snapshot(db: Path, state: Path, num_ranks: int) -> str:
    """Store the kept snapshot of `num_ranks` ranks by its median per-rank matmul rate (best: the
    highest, as a neighbour's burst only slows ranks down); its hardware fingerprint."""
    from tasks.discover import ingest_snapshot

    def rate(path: Path) -> float:
        return statistics.median(r["probe"]["matmul_flop_per_s"] for r in json.loads(path.read_text())["ranks"])

    paths = sorted(state.glob(f"discover-{num_ranks}-*/snapshot.json"))
    if not paths:
        raise RuntimeError(f"no netbench snapshot of {num_ranks} ranks in {state}; run without --replay first")
    return ingest_snapshot.fn(str(db), str(keep(paths, rate, best_is_max=True)))


def kept_times(state: Path, num_ranks: int, ops: Iterable[str]) -> dict[tuple[str, int], float]:
    """(op, message bytes) → the kept time across all rounds' snapshots at `num_ranks` ranks (per
    point, as for everything else), for the measurement rows of `ops`."""
    wanted = set(ops)
    times: dict[tuple[str, int], list[float]] = {}
    for path in state.glob(f"discover-{num_ranks}-*/snapshot.json"):
        for m in json.loads(path.read_text())["measurements"]:
            if m["op"] in wanted:
                times.setdefault((m["op"], m["message_bytes"]), []).append(m["time_s"])
    return {k: keep(v) for k, v in sorted(times.items())}


def collective_fit_rows(state: Path, num_ranks: int) -> list[dict]:
    """α–β fits of the collectives over `num_ranks` ranks on the kept time of each message size
    across all rounds' snapshots, as discovery's fit rows."""
    from planner.measure.alphabeta import fit_alpha_beta

    best = kept_times(state, num_ranks, COLLECTIVE_OPS)
    rows = []
    for op in COLLECTIVE_OPS:
        pts = sorted((size, t) for (o, size), t in best.items() if o == op)
        if len({size for size, _ in pts}) >= 2:
            fit = fit_alpha_beta([p[0] for p in pts], [p[1] for p in pts])
            rows.append(
                {"op": op, "link_class": "intra-node", "alpha_s": fit.alpha_s, "beta_s_per_byte": fit.beta_s_per_byte}
            )
    return rows


def overhead_rows_for(state: Path, num_ranks: int) -> list[dict]:
    """Discovery's FSDP2, concurrency and all-reduce rows at `num_ranks` ranks (worker.netbench.bench_fsdp,
    bench_concurrency, bench_collectives), the kept time of each (op, size) across rounds, for
    planner.measure.calibrate's fsdp_overhead_from, measured_slowdowns and small_allreduce_from; [] when none."""
    kept = kept_times(state, num_ranks, FSDP_OPS + CONCURRENCY_OPS + (BenchOp.ALL_REDUCE,))
    return [{"op": op, "message_bytes": size, "time_s": t} for (op, size), t in kept.items()]


def pipeline_overhead_for(state: Path, num_ranks: int, cluster: ClusterSpec) -> float:
    """The pipeline schedule's own cost per micro-batch beyond the p2p's α–β, of the kept round at
    `num_ranks` ranks on the kept cluster's link, as tasks.plan.load_calibration derives it from a
    snapshot (planner.measure.calibrate.pipeline_overhead_from); 0 when discovery did not time it (1 rank)."""
    link = cluster.nodes[0].intra_link
    rounds = [
        json.loads(path.read_text())["measurements"] for path in state.glob(f"discover-{num_ranks}-*/snapshot.json")
    ]
    timed = [
        pipeline_overhead_from(ms, link) for ms in rounds if any(m["op"] == BenchOp.PIPELINE_MICROBATCH for m in ms)
    ]
    return keep(timed) if timed else 0.0


def profile_keys_for(plans: list[Plan]) -> list:
    """The layer shapes the plans price with (planner.cost.estimate.plan_profile_needs), every layer
    kind of each, without recompute as well (the embedding and head never recompute): no more, so a
    round of the five item-7 plans profiles 10 shapes, not the grid's 24."""
    from planner.cost.estimate import plan_profile_needs

    needs = {n for p in plans for n in plan_profile_needs(p)}
    keys = {
        k
        for n in needs
        for k in profile_keys("cpu", [n.mbs], [n.seq], [n.tp], n.dtype, sorted({False, n.recompute}))
        if k.layer_kind == "block" or not k.recompute
    }
    return sorted(keys, key=lambda k: (k.tp, k.micro_batch_size, k.layer_kind, k.recompute))


def profile_pass(state: Path, plans: list[Plan], rnd: int, timeout_s: float) -> None:
    """Measure every layer shape the plans need (one profiler subprocess per tp) into round `rnd`'s folder."""
    import torch

    from tasks.profile import profile_group

    keys = profile_keys_for(plans)
    for tp in sorted({k.tp for k in keys}):
        group = [k for k in keys if k.tp == tp]
        real_tp = tp <= len(os.sched_getaffinity(0))  # as flows.profile: a real tp group where the cores allow
        profile_group.fn(
            FIDELITY_MODEL, group, torch.__version__, 5, 0.1, timeout_s, str(state / f"profile-{rnd}"), real_tp=real_tp
        )


def kept_profiles(db: Path, state: Path) -> ProfileTable:
    """Store, per layer shape, the kept pass's row by forward + backward (as for runs and snapshots)
    and load the table. Rows timed on a real tp group (all-reduces included) win over fake-group ones
    of older passes: they measure something else."""
    from storage.profiles import load_profile_table, read_jsonl, upsert_profiles

    def rank(r: dict) -> float:
        return r["forward_s"] + r["backward_s"]

    passes: dict[tuple, list[dict]] = {}
    for f in sorted(state.glob("profile-*/*.jsonl")):
        for r in read_jsonl(f):
            key = (r["layer_kind"], r["micro_batch_size"], r["seq_len"], r["tp"], r["recompute"])
            passes.setdefault(key, []).append(r)
    best = {}
    for key, rows in passes.items():
        real = [r for r in rows if r.get("tp_comm_included")] or rows
        best[key] = keep(real, rank)
    upsert_profiles(db, best.values())
    return load_profile_table(db, FIDELITY_MODEL, ["cpu"])


OPTIMIZER_RANKS = 2  # ranks that step at once in the optimizer measurement (as the profile flow on 2 cores)


def measure_optimizer() -> dict:
    """torch AdamW's step time per parameter over one FIDELITY_MODEL block for each parameter layout
    (plain, tp, fsdp), with OPTIMIZER_RANKS real gloo ranks stepping at once (worker.profile_layers
    --optimizer --tp-group real, as the profile flow measures it), one thread each; from the project
    root (this folder's `profile.py` would shadow the stdlib module torch's optimizer imports)."""
    import subprocess

    cmd = [
        sys.executable,
        "-m",
        "worker.agent",
        "--nproc-per-node",
        str(OPTIMIZER_RANKS),
        "-m",
        "worker.profile_layers",
        "--optimizer",
        "true",
        "--spec-json",
        FIDELITY_MODEL.model_dump_json(),
        "--tp-group",
        "real",
    ]
    res = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    return json.loads([line for line in res.stdout.splitlines() if line.startswith("{")][-1])


def kept_optimizer(state: Path) -> dict:
    """The kept round's optimizer figures: {"plain", "tp", "fsdp", "num_ranks"} from the rounds'
    `optimizer-N.json`; a state folder from before them holds one-process figures (`adamw-N.json`
    plain, `adamw-dtensor-N.json` DTensor on a fake group), read as such; {} when none."""
    runs = [json.loads(f.read_text()) for f in state.glob("optimizer-[0-9]*.json")]
    if runs:
        return {k: keep([r[k] for r in runs]) for k in ("plain", "tp", "fsdp")} | {"num_ranks": runs[0]["num_ranks"]}
    plain = [json.loads(f.read_text()) for f in state.glob("adamw-[0-9]*.json")]
    dt = [json.loads(f.read_text()) for f in state.glob("adamw-dtensor-*.json")]
    old = {"plain": keep(plain)} if plain else {}
    return old | ({"tp": keep(dt), "fsdp": keep(dt)} if dt else {}) | ({"num_ranks": 1} if old else {})


# ---- stage 4: measure with torchrun -------------------------------------------------------------


def measure(plan: Plan, name: str, state: Path, steps: int, timeout_s: float) -> float:
    """Launch one real torchrun run of `plan`; its measured step time (`run_step_time_s`)."""
    from launcher.launch import Launch, log_tail, run_logged, torchrun_command
    from planner.specs.runspec import RunSpec

    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=state))
    rundir.plan_path(run_dir).write_text(plan.to_json())
    spec_file = rundir.model_path(run_dir)
    spec_file.write_text(FIDELITY_MODEL.model_dump_json())
    launch = Launch(
        plan_path=str(rundir.plan_path(run_dir)),
        run_dir=str(run_dir),
        run_id=run_dir.name,
        spec=RunSpec(
            steps=steps,
            data="synthetic",
            checkpoint_every=0,
            resume="none",
            collective_timeout_s=120.0,
            model_json=str(spec_file),
        ),
        nproc_per_node=plan.num_devices,
    )
    # No checkpoint: worker.train saves one at the last step, after the last timed step, so it costs
    # wall time but is outside every step_time_s.
    cmd = torchrun_command(launch)
    rc, _ = run_logged(cmd, rundir.node_log(run_dir), timeout_s)
    if rc != 0 and not (
        rc == 1 and "exitcode  : -6" in log_tail(rundir.node_log(run_dir)) and _all_steps(run_dir, steps)
    ):
        # gloo's sporadic abort at process exit after every step was logged is no failure
        raise RuntimeError(f"{name}: torchrun exited {rc}:\n{log_tail(rundir.node_log(run_dir))}")
    # the final checkpoint is no measurement: 80 MB a run, 4 GB a 5-round state folder (which filled a disk)
    shutil.rmtree(rundir.checkpoints_dir(run_dir), ignore_errors=True)
    return run_step_time_s(run_dir)


def run_peak_memory(run_dir: Path) -> list[int]:
    """Per pipeline rank, the largest peak RSS (telemetry `memory_bytes`, `cpu_max_rss`: what
    planner.cost.estimate's peak_memory_bytes prices on CPU ranks) of its ranks, read on the
    second-to-last step: the last step's row is written after worker.train's final checkpoint,
    which is no part of a training step."""
    per_rank: dict[int, tuple[int, int, int]] = {}  # rank -> (step, memory, pipeline rank)
    for f in rundir.telemetry_files(run_dir):
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        last = max(r["step"] for r in rows)
        for r in rows:
            if r["step"] < last or len(rows) == 1:
                prev = per_rank.get(r["rank"])
                if prev is None or r["step"] > prev[0]:
                    per_rank[r["rank"]] = (r["step"], r["memory_bytes"], r["stage"] % r["pp"])
    pp = max(j for _, _, j in per_rank.values()) + 1
    return [max(mem for _, mem, j in per_rank.values() if j == k) for k in range(pp)]


def _all_steps(run_dir: Path, steps: int) -> bool:
    files = rundir.telemetry_files(run_dir)
    return bool(files) and all(len(f.read_text().splitlines()) == steps for f in files)


def run_step_time_s(run_dir: Path) -> float:
    """Median over steady steps (warm-up dropped) of the slowest rank's step_time_s in a run's telemetry."""
    per_step: dict[int, float] = {}
    for f in rundir.telemetry_files(run_dir):
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
    ap.add_argument("--rounds", type=int, default=5, help="rounds of discover + profile + every plan's run")
    ap.add_argument("--steps", type=int, default=10, help="steps per run (the first 2 are warm-up)")
    ap.add_argument("--state-dir", default="", help="keep DuckDB + runs here (default: a temp folder)")
    ap.add_argument("--only", nargs="*", default=None, help="plan names to run (full names)")
    ap.add_argument("--plans", nargs="*", default=None, help=f"plans to run: {', '.join(PLAN_ALIASES)} (or full names)")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--replay", action="store_true", help="re-price the snapshots, profiles and runs in --state-dir")
    ap.add_argument("--keep", choices=("median", "best"), default="median", help="which round of each quantity is kept")
    args = ap.parse_args()
    KEEP["mode"] = args.keep
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="meshplan-fidelity-")).resolve()
    state.mkdir(parents=True, exist_ok=True)
    db = state / "meshplan.duckdb"
    from storage.hardware import load_snapshot

    t0 = time.perf_counter()
    print(f"state {state}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    specs = fidelity_plans()
    names = select_plans(args.plans, args.only)
    plans = {n: make_plan(n, specs[n]) for n in names}
    # Each round measures everything once, in the same order: a quiet spell of the shared machine
    # can then serve hardware, profiles and runs alike, and each keeps one round's value (--keep).
    # one rank alone (the single-rank rate) and every rank count a chosen plan runs on
    counts = sorted({1} | {p.num_devices for p in plans.values()})
    done = len(list(state.glob("discover-1-*")))  # rounds add to those the state folder holds
    for rnd in range(done, done + (0 if args.replay else args.rounds)):
        for n in counts:
            discover_pass(state, n, rnd, args.timeout_s)
        profile_pass(state, list(plans.values()), rnd, args.timeout_s)
        (state / f"optimizer-{rnd}.json").write_text(json.dumps(measure_optimizer()))
        for n in names:
            measure(plans[n], n, state, args.steps, args.timeout_s)
        print(
            f"round {rnd + 1}/{done + args.rounds} done after {time.perf_counter() - t0:.0f} s, "
            f"load average {os.getloadavg()[0]:.2f}"
        )

    adam = kept_optimizer(state)
    for layout in ("plain", "tp", "fsdp"):
        v = adam.get(layout)
        print(
            f"AdamW step on {layout} params, {adam.get('num_ranks', 0)} rank(s) at once: "
            + (f"{v * 1e9:.2f} ns/param" if v else "not measured")
        )
    clusters: dict[int, ClusterSpec] = {}
    calibs: dict[int, Calibration] = {}
    single = 0.0
    for n in counts:
        stored = load_snapshot(db, best_snapshot(db, state, n))
        clusters[n] = stored.cluster
        rates = stored.devices["measured_flop_per_s"].to_list()
        single = single or statistics.median(rates)
        node = clusters[n].nodes[0]
        line = (
            f"discover {n} rank(s): {statistics.median(rates) / 1e9:.1f} GFLOP/s per rank, "
            f"{node.memory_bandwidth_bytes_per_s / 1e9:.1f} GB/s memory, send/recv α "
            f"{node.intra_link.latency_s * 1e6:.0f} µs {node.intra_link.bandwidth_bytes_per_s / 1e9:.2f} GB/s"
        )
        if stored.runtime_rss_bytes:
            line += f", a rank's runtime {stored.runtime_rss_bytes / 2**20:.0f} MiB resident"
        if n > 1:
            fits = collective_fit_rows(state, n)
            pipe = pipeline_overhead_for(state, n, clusters[n])
            calibs[n] = cpu_calibration(
                single,
                rates,
                fits,
                n,
                os.cpu_count(),
                adam.get("plain"),
                adam.get("tp"),
                pipe,
                overhead_rows_for(state, n),
                adam.get("fsdp"),
                int(adam.get("num_ranks", 1)),
                stored.runtime_rss_bytes,
            )
            ar = calibs[n].fit(BenchOp.ALL_REDUCE)
            line += f"; contention {calibs[n].compute_slowdown:.2f}, lockstep {calibs[n].lockstep_slowdown:.2f}"
            line += f", pipelining {pipe * 1e3:.2f} ms/micro-batch"
            fs = calibs[n].fsdp
            line += (
                (
                    f", FSDP2 {fs.module_s * 1e3:.2f} ms/module + {fs.s_per_byte * 1e9:.2f} ms/GB"
                    f" + {fs.tensor_s * 1e3:.2f} ms/tensor"
                )
                if fs
                else ""
            )
            line += f", all_reduce α {ar.alpha_s * 1e6:.0f} µs {1 / ar.beta_s_per_byte / 1e9:.2f} GB/s" if ar else ""
        print(line)
    table = kept_profiles(db, state)
    print(f"profiled {sum(1 for r in table if not r.estimated)} layer shapes\n")

    measured: dict[str, list[float]] = {n: [] for n in names}
    memory: dict[str, list[list[int]]] = {n: [] for n in names}
    by_fp = {plans[n].fingerprint(): n for n in names}
    for d in sorted(state.glob("run-*"), key=lambda d: d.stat().st_mtime):  # run folders in launch order
        hit = by_fp.get(Plan.model_validate_json(rundir.plan_path(d).read_text()).fingerprint())
        if hit is not None and rundir.telemetry_dir(d).is_dir():
            measured[hit].append(run_step_time_s(d))
            memory[hit].append(run_peak_memory(d))

    rows = []
    for n in names:
        plan, cluster = plans[n], clusters[plans[n].num_devices]
        priced = estimate(plan, FIDELITY_MODEL, cluster, table, calibration=calibs[plan.num_devices])
        raw = estimate(plan, FIDELITY_MODEL, cluster, table).step_time_s
        # memory: per pipeline rank, the kept round (the smallest peak under --keep best: a neighbour
        # cannot lower a process's RSS); the table shows the pipeline rank furthest off
        mem = keep(memory[n], max) if memory[n] else [0] * plan.pp
        pm = list(priced.peak_memory_bytes)
        j = max(range(plan.pp), key=lambda k: abs(pm[k] - mem[k]) / max(mem[k], 1))
        rows.append(
            dict(
                name=n,
                ranks=plan.num_devices,
                pred=priced.step_time_s,
                raw=raw,
                flops=flops_only_s(plan, cluster),
                meas=keep(measured[n]),
                rounds=measured[n],
                pred_mem=pm[j],
                meas_mem=mem[j],
                mem_stage=j,
            )
        )
    mib = 2**20
    head = (
        f"{'plan':<24}{'ranks':>6}{'predicted s':>13}{'measured s':>12}{'error %':>9}{'uncalib s':>11}{'err %':>8}"
        f"{'FLOPs-only s':>14}{'err %':>8}{'pred MiB':>10}{'meas MiB':>10}{'err %':>8}  rounds s"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        m, mm = r["meas"], max(r["meas_mem"], 1)
        print(
            f"{r['name']:<24}{r['ranks']:>6}{r['pred']:>13.4f}{m:>12.4f}{100 * (r['pred'] - m) / m:>+9.1f}"
            f"{r['raw']:>11.4f}{100 * (r['raw'] - m) / m:>+8.1f}{r['flops']:>14.4f}{100 * (r['flops'] - m) / m:>+8.1f}"
            f"{r['pred_mem'] / mib:>10.1f}{r['meas_mem'] / mib:>10.1f}{100 * (r['pred_mem'] - mm) / mm:>+8.1f}  "
            + " ".join(f"{x:.3f}" for x in r["rounds"])
        )
    meas = [r["meas"] for r in rows]
    for label, col in (
        ("cost model (calibrated)", "pred"),
        ("cost model (uncalibrated)", "raw"),
        ("FLOPs only (baseline)", "flops"),
    ):
        pred = [r[col] for r in rows]
        print(f"{label:<26}: MAPE {mape(pred, meas):5.1f} %   Spearman ρ {spearman(pred, meas):+.3f}")
    if all(r["meas_mem"] for r in rows):
        pm = [float(r["pred_mem"]) for r in rows]
        print(f"{'peak memory (calibrated)':<26}: MAPE {mape(pm, [float(r['meas_mem']) for r in rows]):5.1f} %")
    print(
        f"targets: MAPE ≤ 10 %, ρ ≥ 0.9; load average at end {os.getloadavg()[0]:.2f}; "
        f"wall {time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
