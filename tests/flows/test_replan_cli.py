"""`meshplan replan` on stored telemetry and `meshplan replan-every` as a served deployment on a real server.

The stored run is synthetic telemetry (rank 1's per-sample compute doubles from step 15) ingested
the way train_flow ingests real ranks' files, so no torchrun launch is needed here.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from cli.commands.replan import parse_every
from planner.errors import MeshplanError
from planner.specs.plan import parse_plan
from storage.replan import load_decisions
from storage.runs import finish_run, ingest_step_metrics, start_run
from tests.support.cli import session_prefect_api
from tests.support.served import serve_and_run_once

MESHPLAN = [sys.executable, "-m", "cli"]
pytestmark = pytest.mark.flow


def _env(**extra: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH")
    }
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _stored_straggler_run(state: Path, run_id: str = "stored") -> Path:
    plan = parse_plan(
        {
            "model": "tiny",
            "cluster": "cpu",
            "global_batch_size": 16,
            "seq_len": 32,
            "micro_batch_size": 1,
            "dtype": "fp32",
            "batch_shares": [4, 4, 4, 4],
            "stages": [{"layer_start": 0, "layer_end": 4, "device_ids": [0, 1, 2, 3], "dp": 4}],
        }
    )
    run_dir = state / "runs" / run_id
    (run_dir / "telemetry").mkdir(parents=True)
    rng, files = random.Random(0), {r: [] for r in range(4)}
    for step in range(40):
        comp = {r: 4 * 0.010 * (1 + rng.gauss(0, 0.03)) * (2.0 if r == 1 and step >= 15 else 1.0) for r in range(4)}
        for r in range(4):
            files[r].append(
                {
                    "rank": r,
                    "step": step,
                    "stage": 0,
                    "replica": r,
                    "tp_index": 0,
                    "attempt": 0,
                    "num_microbatches": 4,
                    "samples": 4,
                    "tokens": 128,
                    "step_time_s": max(comp.values()),
                    "compute_s": comp[r],
                    "comm_wait_s": max(comp.values()) - comp[r],
                    "optimizer_s": 0.0,
                    "loss": 1.0,
                    "memory_bytes": 1,
                    "memory_kind": "cpu_max_rss",
                    "wall_time_s": step,
                }
            )
    for r, rows in files.items():
        (run_dir / "telemetry" / f"rank_{r:05d}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    db = state / "meshplan.duckdb"
    start_run(db, run_id, plan, 60, run_dir)
    ingest_step_metrics(db, run_id, run_dir)
    finish_run(db, run_id, "completed")
    return db


def test_every_parses_units_and_rejects_nonsense():
    assert [parse_every(x) for x in ("30s", "5m", "2h", "1d", "45")] == [30, 300, 7200, 86400, 45]
    with pytest.raises(MeshplanError, match="--every"):
        parse_every("soon")


def test_replan_command_decides_and_records_for_a_stored_run(tmp_path):
    db = _stored_straggler_run(tmp_path)
    out = subprocess.run(
        [*MESHPLAN, "--state-dir", str(tmp_path), "replan", "--run-id", "stored"],
        env=_env(PREFECT_API_URL=session_prefect_api()),  # the session's server: none started for the command
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rank 1: compute" in out.stdout and "decision: rebalance" in out.stdout
    assert load_decisions(db, "stored")["chosen_action"].to_list() == ["rebalance"]


def test_replan_every_without_a_server_fails_with_one_line(tmp_path):
    def run(command):
        args = [*MESHPLAN, "--state-dir", str(tmp_path), command, "--run-id", "x", "--every", "5m"]
        return subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=120)

    out = run("replan-every")
    assert out.returncode == 1 and "run `meshplan ui` first" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    old = run("schedule")  # the deprecated name still works, and says so in one line
    assert old.returncode == 1 and old.stderr.splitlines()[0].startswith("note: `meshplan schedule` is now")
    assert old.stderr.splitlines()[1:] == out.stderr.splitlines()


def test_replan_every_serves_an_interval_deployment_that_runs_on_demand(tmp_path):
    _stored_straggler_run(tmp_path)
    command = [
        *MESHPLAN,
        "--state-dir",
        str(tmp_path),
        "replan-every",
        "--run-id",
        "stored",
        "--every",
        "1h",
        "--name",
        "t",
    ]
    serve_and_run_once(tmp_path, command, "replan/t", _env(PREFECT_RUNNER_POLL_FREQUENCY="1"), 3600)
    decisions = load_decisions(tmp_path / "meshplan.duckdb", "stored")
    assert decisions["source"].to_list() == ["replan_flow"]  # the served run decided and recorded


def test_replan_every_refuses_a_run_id_no_run_can_have(tmp_path, monkeypatch, capsys):
    """The run may start after its schedule is served, but not under an id no run can have: the
    fuzz's `schedule --run-id ''` served a schedule for no run until stopped (with a `meshplan ui`
    server); refused first, in one line naming --run-id, server or not."""
    from tests.support.cli import meshplan_main

    for bad in ("", "../x", "a b"):
        for command in ("replan-every", "schedule"):
            rc, _, err = meshplan_main(monkeypatch, capsys, "--state-dir", str(tmp_path), command, "--run-id", bad)
            lines = [ln for ln in err.splitlines() if not ln.startswith("note: ")]
            assert rc == 1 and len(lines) == 1 and lines[0].startswith(f"error: --run-id='{bad}'"), err
