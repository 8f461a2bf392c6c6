"""Fenced generations under the scheduler: a SIGKILLed job runner's orphaned ranks never train beside its relaunch.

SIGKILL of `python -m flows.job` leaves its torchrun agent and ranks under pid 1, still training
into the job's run folder (they are in sessions of their own). The next scheduler round requeues
the job (its runner is gone) and admits it again; the new runner's launch opens generation 2
(control.json and the run's row), stops every process labelled with the run folder — the
orphans — and only then starts its ranks, which resume from the newest checkpoint. Telemetry
shows it: every generation-1 row was written before the first generation-2 row, rank 0's steps
only go back once, to the checkpoint generation 2 resumed from, and the final weights equal an
uninterrupted single-process run's (SGD: a step trained twice on the weights, or lost, would show).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import pytest

from flows.scheduler import scheduler_flow
from launcher.control import read_generation
from launcher.group import RUN_TAG, labelled
from launcher.launch import run_label
from planner.specs.config import TrainConfig
from planner.specs.model import get_model
from storage.db import query
from storage.jobs import get_job, submit_job
from tests.flows.test_elastic_job import ATOL, CLUSTER, rank0_rows, wait_until
from tests.support.reference import train_reference
from worker.checkpoint import latest_checkpoint, load_full_model_state

pytestmark = [pytest.mark.dist, pytest.mark.flow]

# 2 ranks only: the speed table prices no other size, so the job is admitted on 2 and stays there
TABLE = "model_cfg,gpu_type,num_gpus,num_nodes,gpus_per_node,sim_iter_time_s\ntiny,cpu,2,1,2,0.5\n"
STEPS, BATCH = 120, 8
TRAIN = {"data": "synthetic", "optimizer": "sgd", "lr": 0.01, "checkpoint_every": 10}


def _all_rows(run_dir) -> list[dict]:
    rows = []
    for f in sorted((run_dir / "telemetry").glob("rank_*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows


def test_a_sigkilled_runners_orphans_are_fenced_off_and_the_relaunch_matches_an_uninterrupted_run(tmp_path):
    db, runs, table = str(tmp_path / "m.duckdb"), tmp_path / "runs", tmp_path / "speed.csv"
    table.write_text(TABLE)
    run_dir = runs / "a"

    def round_():
        return scheduler_flow(
            db, CLUSTER, "jct", speed_table=str(table), runs_dir=str(runs), train=TrainConfig(timeout_s=300.0)
        )

    submit_job(db, "tiny", BATCH, STEPS, job_id="a", seq=32, train=TRAIN)
    first = round_()
    assert first.actions == [("a", "start", "2xcpu/1")]
    runner = next(x["runner_pid"] for x in first.applied if x.get("runner_pid"))
    try:
        wait_until(lambda: len(rank0_rows(run_dir)) >= 15, "job a's first 15 steps")
        os.kill(runner, signal.SIGKILL)
        n = len(rank0_rows(run_dir))
        wait_until(lambda: len(rank0_rows(run_dir)) >= n + 5, "the orphaned ranks to keep training", 60)
        orphans = labelled(RUN_TAG, run_label(run_dir))
        assert orphans, "the runner's agent and ranks outlived it (the bug's setup)"
        # frozen while the scheduler's round re-admits the job, thawed the moment the new runner's
        # launch opens generation 2 (control.json), which then stops them: still training when the
        # fence begins, however long the round and the runner's start took on a loaded machine. Not
        # thawed when its plan is written: with the other core busy the launch came 7 s after that,
        # and generation 1 trained its last 100 steps in 6 s (measured): no orphan was left to fence.
        for pid in orphans:
            os.kill(pid, signal.SIGSTOP)
        thawed = False
        t_end = time.monotonic() + 300
        while get_job(db, "a")["state"] not in ("finished", "failed") and time.monotonic() < t_end:
            round_()  # requeues the job (its runner is gone), then admits it again
            if not thawed and get_job(db, "a")["runner_pid"] != runner:
                wait_until(lambda: read_generation(run_dir) >= 2, "the relaunch to open generation 2", 120)
                for pid in orphans:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                thawed = True
            time.sleep(1.0)
    finally:  # a failed assertion must not leave ranks behind
        for pid in labelled(RUN_TAG, run_label(run_dir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert get_job(db, "a")["state"] == "finished", (run_dir / "job.log").read_text()[-3000:]
    assert not labelled(RUN_TAG, run_label(run_dir)), "no process of the run outlives it"
    assert query(db, "SELECT generation FROM runs WHERE run_id = 'a'")["generation"].to_list() == [2]

    rows = _all_rows(run_dir)
    gen1, gen2 = [r for r in rows if r["generation"] == 1], [r for r in rows if r["generation"] == 2]
    assert {r["generation"] for r in rows} == {1, 2} and gen2, "the relaunch trained, as generation 2"
    assert max(r["wall_time_s"] for r in gen1) < min(r["wall_time_s"] for r in gen2), "one generation at a time"
    resumed = json.loads((run_dir / "resume.jsonl").read_text().splitlines()[-1])["step"]
    rank0 = [(r["generation"], r["step"]) for r in rank0_rows(run_dir)]
    k = sum(g == 1 for g, _ in rank0)
    assert rank0[:k] == [(1, s) for s in range(k)], "generation 1 trained in order until it was stopped"
    assert rank0[k:] == [(2, s) for s in range(resumed, STEPS)], "generation 2 went back only to its checkpoint"
    assert 20 <= resumed <= k, "generation 1 trained on after its runner died, until generation 2 stopped it"
    ref, _ = train_reference(get_model("tiny"), BATCH, 32, STEPS, "synthetic", 0, TRAIN["lr"], "sgd")
    got = load_full_model_state(latest_checkpoint(run_dir), get_model("tiny"))
    assert max((got[k] - ref[k]).abs().max().item() for k in ref) < ATOL
