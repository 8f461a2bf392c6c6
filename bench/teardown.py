"""Does a finished run ever abort at teardown? A 2-rank tensor-parallel run, repeated, with the other core busy.

gloo sometimes aborts a process at exit after all its work is done (`terminate called without an
active exception`, torchrun exit -6), so a finished run counted as failed. Every rank
entry point now ends with worker.train.clean_exit (barrier, destroy_process_group, flush, os._exit).
This launches the same tiny tp=2 run N times through the launcher (launcher/launch.py: torchrun
command and process group as training uses them) while a busy loop holds another core, and prints
one table: runs, exit codes, aborts (exit -6/134 or the message in the log).

    python -m bench.teardown [--runs 50] [--steps 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import rundir
from launcher import group
from launcher.launch import Launch, run_logged, torchrun_command
from planner.specs.model import get_model
from planner.specs.runspec import RunSpec

ABORT = "terminate called without an active exception"


def tp2_plan(model: str = "tiny") -> dict:
    layers = get_model(model).num_layers
    stage = {"layer_start": 0, "layer_end": layers, "device_ids": [0, 1], "tp": 2, "dp": 1}
    return {
        "model": model,
        "cluster": "cpu",
        "global_batch_size": 4,
        "seq_len": 32,
        "micro_batch_size": 2,
        "schedule": "1f1b",
        "virtual_stages": 1,
        "dtype": "fp32",
        "stages": [{**stage, "sharding": "none", "recompute": "none"}],
        "batch_shares": [4],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.teardown", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench stops its busy loop too
    root = Path(tempfile.mkdtemp(prefix="meshplan-teardown-"))
    (root / "plan.json").write_text(json.dumps(tp2_plan()))
    busy = group.start([sys.executable, "-c", "while True: pass"])  # the other core
    codes: collections.Counter[int] = collections.Counter()
    aborts, walls = 0, []
    try:
        for i in range(a.runs):
            run_dir = root / f"run{i}"
            spec = RunSpec(steps=a.steps, data="synthetic", checkpoint_every=0)
            launch = Launch(str(root / "plan.json"), str(run_dir), f"run{i}", spec)
            log = rundir.node_log(run_dir)
            t0 = time.monotonic()
            rc, _ = run_logged(torchrun_command(launch), log, 300.0)
            walls.append(time.monotonic() - t0)
            text = log.read_text(errors="replace")
            aborted = rc in (-6, 134) or ABORT in text or "exitcode: -6" in text
            aborts += aborted
            codes[rc] += 1
            print(f"run {i + 1}/{a.runs}: exit {rc}{' ABORT' if aborted else ''}", file=sys.stderr, flush=True)
    finally:
        group.stop(busy)
        shutil.rmtree(root, ignore_errors=True)
    print("| runs | exit codes | aborts at teardown | median wall s |")
    print("|---|---|---|---|")
    med = sorted(walls)[len(walls) // 2] if walls else float("nan")
    print(f"| {sum(codes.values())} | {dict(codes)} | {aborts} | {med:.1f} |")


if __name__ == "__main__":
    main()
