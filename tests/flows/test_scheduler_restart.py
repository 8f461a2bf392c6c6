"""One scheduler round at a time (issue #36): the DuckDB lease, missed rounds collapsed, admission
idempotent, and a scheduler SIGKILLed mid-round whose restart admits its job once.

The restart test is real: a round process takes the lease, admits the job, starts its runner
(flows/job.py: train_flow, torchrun, a gloo rank) and is SIGKILLed before it records the runner's
pid — the worst moment. Two rounds then start together (what Prefect does with the rounds missed
while `schedule-cluster` was down): one runs, adopts the live runner instead of admitting the job a
second time, and the job trains once to `finished`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from flows.scheduler import scheduler_flow
from storage import lease
from storage.jobs import get_job, job_events, submit_job
from tasks.scheduler import LEASE, live_runners, take_lease
from tests.support import procs

CPU4 = "tests/data/cpu-4ranks.toml"
TABLE = "model_cfg,gpu_type,num_gpus,num_nodes,gpus_per_node,sim_iter_time_s\ntiny,cpu,1,1,1,1.0\ntiny,cpu,2,1,2,1.0\n"
TRAIN = {"data": "synthetic", "optimizer": "sgd", "lr": 0.05, "checkpoint_every": 1000}


def _dead_holder() -> str:
    p = procs.start([sys.executable, "-c", "pass"])
    p.wait()
    return f"{os.uname().nodename}:{p.pid}:1:dead"


def test_a_round_waits_for_no_one_it_skips_while_a_live_round_holds_the_lease_and_takes_a_dead_ones(tmp_path):
    db, table = str(tmp_path / "m.duckdb"), tmp_path / "speed.csv"
    table.write_text(TABLE)
    kw = {"speed_table": str(table), "launch": False}
    submit_job(db, "tiny", 8, 10, job_id="j", seq=32)
    live = lease.new_holder()  # another round of a live process (this one)
    assert lease.acquire(db, LEASE, live, 60) is None
    out = scheduler_flow(db, CPU4, "jct", **kw)
    assert out.actions == [] and "another round holds the scheduler lease" in out.skipped
    assert get_job(db, "j")["state"] == "queued"
    lease.release(db, LEASE, live)
    assert lease.acquire(db, LEASE, _dead_holder(), 60) is None  # a round that died holding it
    out = scheduler_flow(db, CPU4, "jct", **kw)
    assert out.skipped == "" and [a[:2] for a in out.actions] == [("j", "start")]
    assert lease.acquire(db, LEASE, lease.new_holder(), 60) is None  # the round released it


def test_an_expired_lease_is_taken_and_a_round_scheduled_before_the_last_one_ended_is_collapsed(tmp_path):
    db = str(tmp_path / "m.duckdb")
    far = "otherhost:1:1:x"  # a holder on another host: only its expiry frees the lease
    assert lease.acquire(db, LEASE, far, 60) is None
    assert lease.acquire(db, LEASE, "otherhost:2:1:y", 60) == far  # a live lease on another host
    assert lease.acquire(db, LEASE, far, 0.01) is None  # its holder renews it, for 10 ms
    time.sleep(0.05)
    mine = lease.new_holder()
    assert lease.acquire(db, LEASE, mine, 60) is None
    lease.release(db, LEASE, mine)
    ended = lease.last_end(db, LEASE)
    missed = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=30)  # a round Prefect starts 30 s late
    holder, why = take_lease.fn(db, missed)
    assert holder is None and why.startswith("collapsed") and ended is not None
    holder, why = take_lease.fn(db, dt.datetime.now(dt.UTC))
    assert holder is not None and why == ""


KILLED_ROUND = """
import os, signal, sys
from flows.scheduler import RUNNER
from storage import lease
from storage.jobs import set_job_run, transition
from planner.specs.config import TrainConfig
from tasks.scheduler import LEASE, start_runner
db, cluster, runs = sys.argv[1:4]
assert lease.acquire(db, LEASE, lease.new_holder(), 900) is None
transition(db, "j", "running", "admitted by the round that dies", "1xcpu/1")
set_job_run(db, "j", base_allocation="1xcpu/1")
start_runner(RUNNER, db, "j", cluster, runs, TrainConfig(timeout_s=120.0))
os.kill(os.getpid(), signal.SIGKILL)  # before set_job_run(runner_pid=...): the pid is never recorded
"""


@pytest.mark.dist
def test_a_scheduler_sigkilled_mid_round_then_restarted_twice_at_once_trains_its_job_once(tmp_path):
    db, table, runs = str(tmp_path / "m.duckdb"), tmp_path / "speed.csv", tmp_path / "runs"
    table.write_text(TABLE)
    submit_job(db, "tiny", 8, 8, job_id="j", seq=32, train=TRAIN)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value() or ""}
    dead = subprocess.run([sys.executable, "-c", KILLED_ROUND, db, CPU4, str(runs)], env=env, timeout=120)
    assert dead.returncode == -9
    started = live_runners(db, "j")
    assert get_job(db, "j")["runner_pid"] is None and started  # admitted, runner unrecorded
    outs = []
    rounds = [
        threading.Thread(target=lambda: outs.append(scheduler_flow(db, CPU4, "jct", speed_table=str(table))))
        for _ in range(2)
    ]
    for t in rounds:
        t.start()
    for t in rounds:
        t.join(120)
    assert len(outs) == 2 and all(not any(k == "start" for _, k, _ in o.actions) for o in outs)
    # the rounds adopted the dead round's runner (its pid recorded; it may have finished the job by now)
    assert get_job(db, "j")["runner_pid"] in started | {None}
    t_end = time.monotonic() + 120
    while get_job(db, "j")["state"] not in ("finished", "failed") and time.monotonic() < t_end:
        time.sleep(0.5)
    events = job_events(db, "j")
    assert get_job(db, "j")["state"] == "finished", events["reason"].to_list()
    assert events["to_state"].to_list() == ["queued", "running", "finished"]
    control = json.loads((Path(runs) / "j" / "control.json").read_text())
    assert control["generation"] == 1  # one launch: no second runner ever started the job
