"""Elastic execution on real ranks: a job on 4 gloo ranks shrunk to 2 and grown back to 4 while it trains.

job_flow (flows/job.py) runs the job; the test plays the scheduler's apply step (request_resize:
resizing + control.json checkpoint_exit) twice. Each resize checkpoints at a step boundary, the
runner re-plans for the new rank count and train_flow resumes by resharding the DCP checkpoint
(FSDP zero3 over dp=4 → dp=2 → dp=4). Rank 0 trains every step exactly once, in order, and the
final weights equal the single-process reference's: a lost, repeated or mis-resharded step fails.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from flows.job import job_flow
from planner.specs.config import TrainConfig
from storage.jobs import get_job, job_events, submit_job, transition
from tasks.scheduler import request_resize
from tests.worker.test_train_dist import assert_matches_reference

pytestmark = [pytest.mark.dist, pytest.mark.flow]

CLUSTER = "tests/data/cpu-4ranks.toml"
# SGD at lr 0.05 on synthetic data: over ≤ 60 steps fp32 summation order (dp all-reduce vs one
# process) drifts the tiny model's weights 2e-6 while they move 0.02 (tests/flows/test_replan_flow.py)
STEPS, TRAIN, ATOL = 60, {"data": "synthetic", "optimizer": "sgd", "lr": 0.05, "checkpoint_every": 1000}, 1e-4


def rank0_rows(run_dir: Path) -> list[dict]:
    f = run_dir / "telemetry" / "rank_00000.jsonl"  # worker/telemetry.py names files by 5-digit rank
    if not f.is_file():
        return []
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def wait_until(cond, what: str, deadline_s: float = 180.0) -> None:
    t_end = time.monotonic() + deadline_s
    while time.monotonic() < t_end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_job_shrunk_to_two_ranks_and_grown_back_continues_its_curve_and_matches_one_process(tmp_path):
    db, runs = str(tmp_path / "m.duckdb"), tmp_path / "runs"
    submit_job(db, "tiny", 8, STEPS, job_id="a", seq=32, train=TRAIN)
    transition(db, "a", "running", "admitted by the test", "4xcpu/1")
    out: dict = {}
    runner = threading.Thread(
        target=lambda: out.update(job=job_flow(db, "a", CLUSTER, str(runs), TrainConfig(timeout_s=600.0)))
    )
    runner.start()
    run_dir = runs / "a"
    try:
        wait_until(lambda: len(rank0_rows(run_dir)) >= 5, "5 steps on 4 ranks")
        request_resize(db, "a", str(run_dir), "2xcpu/1", "test: shrink")
        wait_until(lambda: any(r["dp"] == 2 for r in rank0_rows(run_dir)[-1:]), "the relaunch on 2 ranks")
        n = len(rank0_rows(run_dir))
        wait_until(lambda: len(rank0_rows(run_dir)) >= n + 5, "5 steps on 2 ranks")
        assert get_job(db, "a")["state"] == "running"
        request_resize(db, "a", str(run_dir), "4xcpu/1", "test: grow")
    finally:
        runner.join(timeout=600)
    assert out["job"].state == "finished", out
    segs = out["job"].segments
    assert [s.allocation for s in segs] == ["4xcpu/1", "2xcpu/1", "4xcpu/1"]
    assert [s.exit for s in segs] == ["requested", "requested", "done"]
    # the steps are contiguous: each launch starts where the previous one's exit checkpoint ended
    assert segs[0].from_step == 0 and segs[-1].to_step == STEPS
    assert all(a.to_step == b.from_step for a, b in zip(segs, segs[1:], strict=False))
    rows = rank0_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS)), "rank 0 trained every step once, in order"
    widths = [r["dp"] for r in rows]
    cut1, cut2 = segs[0].to_step, segs[1].to_step
    assert widths == [4] * cut1 + [2] * (cut2 - cut1) + [4] * (STEPS - cut2)
    assert all(r["loss"] is not None and r["loss"] == r["loss"] for r in rows)
    events = job_events(db, "a").to_dicts()
    assert [e["to_state"] for e in events] == [
        "queued",
        "running",
        "resizing",
        "running",
        "resizing",
        "running",
        "finished",
    ]
    assert f"from the checkpoint at step {cut1}" in events[3]["reason"]
    assert_matches_reference(run_dir, "tiny", STEPS, lr=TRAIN["lr"], atol=ATOL)


def _rank_pid(run_dir: Path, rank: int) -> int | None:
    """The live process of `rank` of the job training in `run_dir` (Linux /proc)."""
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and str(run_dir).encode() in (d / "cmdline").read_bytes():
                env = (d / "environ").read_bytes().split(b"\0")
                if f"RANK={rank}".encode() in env and b"worker.train" in (d / "cmdline").read_bytes():
                    return int(d.name)
        except OSError:
            continue
    return None


def test_job_that_loses_a_rank_falls_back_to_its_latest_checkpoint_and_finishes_exactly(tmp_path):
    """Rank 3 is SIGKILLed after the step-10 checkpoint: torchrun fails, the runner records the loss,
    relaunches from the latest verified checkpoint and trains the steps since it again — the same
    weights as no crash, because a step's batch is a function of the step (worker/data.py)."""
    db, runs, steps = str(tmp_path / "m.duckdb"), tmp_path / "runs", 40
    submit_job(db, "tiny", 8, steps, job_id="c", seq=32, train={**TRAIN, "checkpoint_every": 10})
    transition(db, "c", "running", "admitted by the test", "4xcpu/1")
    out: dict = {}
    runner = threading.Thread(
        target=lambda: out.update(job=job_flow(db, "c", CLUSTER, str(runs), TrainConfig(timeout_s=600.0)))
    )
    runner.start()
    run_dir = runs / "c"
    try:
        wait_until(lambda: len(rank0_rows(run_dir)) >= 13, "13 steps (a checkpoint at step 10)")
        pid = _rank_pid(run_dir, 3)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    finally:
        runner.join(timeout=600)
    assert out["job"].state == "finished", out
    lost, resumed = out["job"].segments
    assert lost.exit == "error" and resumed.exit == "done"
    assert resumed.from_step % 10 == 0 and 10 <= resumed.from_step <= lost.to_step
    steps_seen = [r["step"] for r in rank0_rows(run_dir)]
    drops = [i for i in range(1, len(steps_seen)) if steps_seen[i] <= steps_seen[i - 1]]
    cut = drops[-1] if drops else resumed.from_step  # the relaunch's first row
    assert steps_seen[cut:] == list(range(resumed.from_step, steps)), "resumed exactly at the checkpoint"
    assert sorted(set(steps_seen[:cut])) == list(range(len(set(steps_seen[:cut])))), "before the loss: in order"
    events = job_events(db, "c").to_dicts()
    assert [e["to_state"] for e in events] == ["queued", "running", "resizing", "running", "finished"]
    assert "resuming from the latest checkpoint" in events[2]["reason"]
    assert_matches_reference(run_dir, "tiny", steps, lr=TRAIN["lr"], atol=ATOL)


def test_a_diverging_job_fails_at_its_first_launch_with_the_one_line(tmp_path):
    """A non-finite loss is not transient: the runner does not relaunch it until its failed-launch
    limit; the job ends `failed` after one launch, its reason the ranks' line (step, values, --lr)."""
    db, runs = str(tmp_path / "m.duckdb"), tmp_path / "runs"
    train = {"data": "synthetic", "optimizer": "sgd", "lr": 10.0, "checkpoint_every": 0}
    submit_job(db, "tiny", 8, 8, job_id="d", seq=32, train=train)
    transition(db, "d", "running", "admitted by the test", "2xcpu/1")
    job = job_flow(db, "d", "tests/data/cpu-2ranks.toml", str(runs), TrainConfig(timeout_s=300.0), max_failures=3)
    assert job.state == "failed" and [s.exit for s in job.segments] == ["error"]
    events = job_events(db, "d").to_dicts()
    assert [e["to_state"] for e in events] == ["queued", "running", "failed"]
    reason = events[-1]["reason"]
    assert reason.startswith("--lr=10.0: training diverged at step") and "\n" not in reason, reason
