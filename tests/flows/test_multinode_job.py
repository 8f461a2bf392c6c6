"""A job whose allocation spans two nodes: one torchrun runner per node, static rendezvous on loopback.

The cluster is two 1-rank CPU "nodes", both this machine. A real scheduler_flow round admits the
job on both (2xcpu/2); its runner (flows/job.py) plans for them and train_flow starts one runner
per node (`python -m worker.agent --nodes 2 --node-rank R`, node 0's store on a 127.0.0.1 socket
the launcher bound), global ranks node-major as planner/runtime.py's node_ranks requires. Each
node logs its own run; the job finishes with the weights of a single-process run. A job that loses
one node's runner falls back to its latest checkpoint, re-planned on the surviving node.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from flows.job import job_flow
from flows.scheduler import scheduler_flow
from launcher import group
from planner.specs.config import TrainConfig
from storage.jobs import get_job, job_events, submit_job, transition
from tests.flows.test_elastic_job import rank0_rows, wait_until
from tests.worker.test_train_dist import assert_matches_reference

pytestmark = [pytest.mark.dist, pytest.mark.flow]

NODES = "tests/data/cpu-2nodes.toml"
STEPS = 12
TRAIN = {"data": "synthetic", "optimizer": "sgd", "lr": 0.05, "checkpoint_every": 4}


def _run_round(db: str, runs, steps: int = STEPS, job_id: str = "n") -> int:
    submit_job(db, "tiny", 8, steps, job_id=job_id, seq=32, train=TRAIN)
    out = scheduler_flow(db, NODES, "jct", runs_dir=str(runs), train=TrainConfig(timeout_s=300.0))
    assert out.actions == [(job_id, "start", "2xcpu/2")], out  # one rank on each node
    return out.applied[0]["runner_pid"]


def _rows(run_dir, rank: int) -> list[dict]:
    f = run_dir / "telemetry" / f"rank_{rank:05d}.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def _stop(pid: int | None) -> None:
    if pid:
        group.send(pid, signal.SIGTERM)


def test_job_on_two_nodes_runs_one_runner_per_node_and_matches_one_process(tmp_path):
    db, runs = str(tmp_path / "m.duckdb"), tmp_path / "runs"
    pid = None
    try:
        pid = _run_round(db, runs)
        wait_until(lambda: get_job(db, "n")["state"] in ("finished", "failed"), "job n to end", 240.0)
    finally:
        _stop(pid)
    run_dir = runs / "n"
    assert get_job(db, "n")["state"] == "finished", (run_dir / "job.log").read_text()[-3000:]
    assert [e["to_state"] for e in job_events(db, "n").to_dicts()] == ["queued", "running", "finished"]
    assert (run_dir / "torchrun.log").is_file() and (run_dir / "torchrun.node1.log").is_file()  # a runner each
    first = [_rows(run_dir, r)[0] for r in (0, 1)]
    assert [(x["rank"], x["node_rank"], x["local_rank"]) for x in first] == [(0, 0, 0), (1, 1, 0)]  # node-major
    rows = rank0_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS)) and {r["dp"] for r in rows} == {2}
    assert_matches_reference(run_dir, "tiny", STEPS, lr=TRAIN["lr"], atol=1e-4)


def _agent_pid(run_dir, node_rank: int) -> int | None:
    """The live torchrun agent of node `node_rank` of the job training in `run_dir` (Linux /proc)."""
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0") if d.name.isdigit() else []
        except OSError:
            continue
        if b"worker.agent" in argv and str(run_dir).encode() in b" ".join(argv) and b"--node-rank" in argv:
            if argv[argv.index(b"--node-rank") + 1] == str(node_rank).encode():
                return int(d.name)
    return None


def test_job_that_loses_a_node_resumes_from_its_checkpoint_replanned_on_the_surviving_node(tmp_path):
    """Node 1's runner (its torchrun agent) is SIGKILLed after the step-5 checkpoint: the launch
    fails naming node 1, the runner records the loss, moves the job to the surviving allocation
    (1xcpu/1), re-plans for it and resumes from the latest checkpoint, resharded from dp=2 to one
    rank — the final weights those of an uninterrupted single-process run."""
    db, runs, steps = str(tmp_path / "m.duckdb"), tmp_path / "runs", 40
    submit_job(db, "tiny", 8, steps, job_id="l", seq=32, train={**TRAIN, "checkpoint_every": 5})
    transition(db, "l", "running", "admitted by the test", "2xcpu/2")
    out: dict = {}
    runner = threading.Thread(
        target=lambda: out.update(job=job_flow(db, "l", NODES, str(runs), TrainConfig(timeout_s=300.0)))
    )
    runner.start()
    run_dir = runs / "l"
    try:
        wait_until(lambda: len(rank0_rows(run_dir)) >= 7, "7 steps on two nodes (a checkpoint at step 5)")
        pid = _agent_pid(run_dir, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    finally:
        runner.join(timeout=300)
    assert out["job"].state == "finished", out
    lost, resumed = out["job"].segments
    assert (lost.allocation, lost.exit) == ("2xcpu/2", "error")
    assert (resumed.allocation, resumed.exit) == ("1xcpu/1", "done")
    assert resumed.from_step % 5 == 0 and 5 <= resumed.from_step <= lost.to_step
    events = job_events(db, "l").to_dicts()
    assert [e["to_state"] for e in events] == ["queued", "running", "resizing", "running", "finished"]
    assert "node 1 of 2xcpu/2 lost" in events[2]["reason"] and events[2]["allocation"] == "1xcpu/1"
    assert f"resharded onto 1xcpu/1 from the checkpoint at step {resumed.from_step}" in events[3]["reason"]
    rows = rank0_rows(run_dir)
    after = [r for r in rows if r["dp"] == 1]
    assert [r["step"] for r in after] == list(range(resumed.from_step, steps)), "resumed exactly at the checkpoint"
    assert {r["dp"] for r in rows if r not in after} == {2}
    assert_matches_reference(run_dir, "tiny", steps, lr=TRAIN["lr"], atol=1e-4)
