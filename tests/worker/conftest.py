"""Helpers for tests that launch real torchrun ranks (gloo, CPU, 1 thread each, always under `timeout`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

TORCHRUN_TIMEOUT_S = 240


def plan_dict(
    splits: list[tuple[int, int]],
    *,
    dp: int = 1,
    tp: int = 1,
    shares: list[int] | None = None,
    mbs: int = 2,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    sharding: str = "none",
    recompute: str = "none",
    model: str = "tiny",
    seq_len: int = 32,
) -> dict:
    """A hand-written plan: stage i of pp uses ranks [i*dp*tp, (i+1)*dp*tp) (virtual stages reuse them)."""
    pp = len(splits) // virtual_stages
    shares = shares or [8 // dp] * dp
    stages = []
    for i, (a, b) in enumerate(splits):
        home = i % pp
        ids = list(range(home * dp * tp, (home + 1) * dp * tp))
        stages.append(
            {
                "layer_start": a,
                "layer_end": b,
                "device_ids": ids,
                "tp": tp,
                "dp": dp,
                "sharding": sharding,
                "recompute": recompute,
            }
        )
    return {
        "model": model,
        "cluster": "cpu",
        "global_batch_size": sum(shares),
        "seq_len": seq_len,
        "micro_batch_size": mbs,
        "schedule": schedule,
        "virtual_stages": virtual_stages,
        "dtype": "fp32",
        "stages": stages,
        "batch_shares": shares,
    }


def run_torchrun(
    run_dir: Path, plan: dict, nproc: int, *args: str, launcher_args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    run_dir.mkdir(parents=True, exist_ok=True)
    plan_path = run_dir / "plan.json"
    plan_path.write_text(json.dumps(plan))
    cmd = [
        "timeout",
        "-k",
        "10",
        str(TORCHRUN_TIMEOUT_S),
        sys.executable,
        "-m",
        "worker.agent",
        "--nproc-per-node",
        str(nproc),
        *launcher_args,
        "-m",
        "worker.train",
        "--plan",
        str(plan_path),
        "--run-dir",
        str(run_dir),
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, start_new_session=True)
    if proc.returncode != 0:
        pytest.fail(f"torchrun rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def wait_for_steps(run_dir: Path, n: int, deadline_s: float = 150.0) -> None:
    """Block until both ranks of a 2-rank job in `run_dir` have logged `n` telemetry rows."""
    t_end = time.monotonic() + deadline_s
    while time.monotonic() < t_end:
        files = sorted((run_dir / "telemetry").glob("rank_*.jsonl"))
        if len(files) == 2 and all(len(f.read_text().splitlines()) >= n for f in files):
            return
        time.sleep(0.2)
    raise AssertionError(f"ranks in {run_dir} did not reach step {n} within {deadline_s} s")


def read_telemetry(run_dir: Path) -> list[dict]:
    rows = []
    for f in sorted((run_dir / "telemetry").glob("rank_*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines()]
    return rows


@pytest.fixture(scope="session")
def torchrun():
    return run_torchrun


@pytest.fixture(scope="session")
def make_plan():
    return plan_dict


@pytest.fixture(scope="session")
def telemetry():
    return read_telemetry
