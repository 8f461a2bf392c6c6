"""A non-finite loss or gradient norm stops a run (worker/train.py `_diverged`): every rank learns it
in the step's one all-reduce (worker/clip.global_grad_norm), so none waits on another; rank 0 records
the step, the value and `--lr` in resume.jsonl for the flow's one line; the run never completes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from worker.checkpoint import checkpoint_step, latest_checkpoint

pytestmark = pytest.mark.dist

# SGD at the largest --lr meshplan accepts (planner/limits.MAX_LR): tiny's weights blow up within 8 steps
DIVERGES = ("--data", "synthetic", "--optimizer", "sgd", "--lr", "10", "--steps", "8", "--checkpoint-every", "2")


def test_two_ranks_stop_together_at_the_first_non_finite_step(tmp_path, make_plan):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(make_plan([(0, 2), (2, 4)])))  # pp2: only rank 1 sees the loss
    cmd = ["timeout", "-k", "10", "180", sys.executable, "-m", "worker.agent", "--nproc-per-node", "2"]
    cmd += ["-m", "worker.train", "--plan", str(plan), "--run-dir", str(tmp_path), *DIVERGES]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, start_new_session=True)
    assert proc.returncode not in (0, 124, 137), proc.stderr[-3000:]  # refused, not completed, not hung
    lines = [json.loads(x) for x in (tmp_path / "resume.jsonl").read_text().splitlines()]
    stop = [r for r in lines if r.get("error")]
    assert len(stop) == 1 and stop[0]["field"] == "--lr" and stop[0]["value"] == 10.0, lines
    assert "training diverged at step" in stop[0]["fix"] and "lower --lr" in stop[0]["fix"]
    step = int(stop[0]["fix"].split("step ")[1].split(":")[0])
    assert f"error: --lr=10.0: training diverged at step {step}" in proc.stderr
    ckpt = latest_checkpoint(tmp_path)  # checkpoints before the divergence stay; none of it or after
    assert ckpt is None or checkpoint_step(ckpt) <= step
    rows = [json.loads(x) for f in (tmp_path / "telemetry").glob("rank_*.jsonl") for x in f.read_text().splitlines()]
    assert rows and max(r["step"] for r in rows) == step - 1  # the diverged step is not logged as trained
