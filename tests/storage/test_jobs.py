"""The job queue in DuckDB: every transition recorded, illegal ones refused, nothing lost to a kill -9."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from planner.errors import MeshplanError
from storage.jobs import cancel_job, job_events, list_jobs, submit_job, transition
from tests.support import procs

# A scheduler round in another process: start queued jobs one by one, a marker line after each.
ROUND = """
import sys, time
from storage.jobs import list_jobs, transition
db, marker = sys.argv[1], sys.argv[2]
for job_id in list_jobs(db, "queued")["job_id"].to_list():
    transition(db, job_id, "running", "round 1", "4xa100")
    with open(marker, "a") as f:
        f.write(job_id + "\\n")
    time.sleep(0.5)
"""


def test_states_and_events(tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    a = submit_job(db, "gpt2-small", 32, 100, job_id="a", gpu_kinds=("a100",))
    transition(db, a, "running", "start", "2xa100")
    transition(db, a, "resizing", "shrink for b")
    transition(db, a, "running", "resharded", "1xa100")
    transition(db, a, "finished", "done")
    ev = job_events(db, a)
    assert ev["to_state"].to_list() == ["queued", "running", "resizing", "running", "finished"]
    assert list_jobs(db)["allocation"].to_list() == ["1xa100"]
    with pytest.raises(MeshplanError, match="cannot go to running from finished"):
        transition(db, a, "running")
    with pytest.raises(MeshplanError, match="already submitted"):
        submit_job(db, "gpt2-small", 32, 100, job_id="a")
    b = submit_job(db, "tiny", 8, 10)
    cancel_job(db, b)
    assert list_jobs(db, "cancelled")["job_id"].to_list() == [b]


def test_nothing_in_the_queue_is_lost_when_the_scheduler_is_killed_mid_round(tmp_path: Path) -> None:
    db, marker = tmp_path / "m.duckdb", tmp_path / "marker"
    ids = [submit_job(db, "gpt2-small", 32, 100, job_id=f"j{i:02d}") for i in range(20)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = procs.start([sys.executable, "-c", ROUND, str(db), str(marker)], env=env)
    try:
        while not (marker.exists() and len(marker.read_text().split()) >= 2):
            assert p.poll() is None, "the round ended before it was killed"
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL
    jobs = list_jobs(db)
    assert sorted(jobs["job_id"].to_list()) == ids  # every job is still there
    ev = job_events(db)
    last = {j: s for j, s in zip(ev["job_id"], ev["to_state"], strict=True)}  # events are ordered by seq
    assert all(last[j] == s for j, s in zip(jobs["job_id"], jobs["state"], strict=True))
    started = set(marker.read_text().split())
    running = set(list_jobs(db, "running")["job_id"])
    assert started <= running and len(running) <= len(started) + 1  # at most the one being written
    assert 0 < len(running) < 20 and len(list_jobs(db, "queued")) == 20 - len(running)


def test_custom_model_is_stored_with_its_job_and_pre_0012_rows_read_as_presets(tmp_path: Path) -> None:
    import duckdb

    from planner.specs.model import PRESETS, ModelSpec
    from storage import db as store
    from storage.jobs import get_job, job_model
    from tasks.scheduler import job_from_row

    path = tmp_path / "m.duckdb"
    con = duckdb.connect(str(path))  # a store last opened before migration 0012, holding a job
    store.migrate(con)
    con.execute("DELETE FROM schema_version WHERE version >= 12")
    con.execute("ALTER TABLE jobs DROP COLUMN model_json")
    con.execute(
        "INSERT INTO jobs (job_id, model, global_batch, iterations, state, submitted_at, updated_at)"
        " VALUES ('old', 'tiny', 8, 10, 'queued', now(), now())"
    )
    con.close()
    store._migrated.clear()
    custom = ModelSpec(name="custom", num_layers=2, hidden=32, num_heads=2, vocab_size=128, seq_len=32)
    submit_job(path, custom, 4, 5, job_id="new")  # migrates the store, then writes the dimensions
    submit_job(path, PRESETS["tiny"], 4, 5, job_id="preset")
    old, new, preset = (get_job(path, j) for j in ("old", "new", "preset"))
    assert (old["model_json"], job_model(old), job_from_row(old).spec) == (None, None, None)
    assert (new["model"], job_model(new), job_from_row(new).spec) == ("custom", custom, custom)
    assert (preset["model"], preset["model_json"]) == ("tiny", None)  # a preset is stored by its name


def test_a_jobs_options_are_stored_typed_and_pre_0019_rows_read_over_the_defaults(tmp_path: Path) -> None:
    import duckdb

    from planner.specs.runspec import RunOptions
    from storage import db as store
    from storage.jobs import get_job, job_options

    path = tmp_path / "m.duckdb"
    con = duckdb.connect(str(path))  # a store last opened before migration 0019: options were a dict of flags
    store.migrate(con)
    con.execute("DELETE FROM schema_version WHERE version >= 19")
    con.execute("ALTER TABLE jobs DROP COLUMN options")
    con.execute(
        "INSERT INTO jobs (job_id, model, global_batch, iterations, state, submitted_at, updated_at, train_json)"
        """ VALUES ('old', 'tiny', 8, 10, 'queued', now(), now(), '{"lr": 0.1, "poll_s": 1.0}')"""
    )
    con.close()
    store._migrated.clear()
    submit_job(path, "tiny", 4, 7, job_id="new", train=RunOptions(lr=0.2, optimizer="sgd", steps=1))
    assert job_options(get_job(path, "old")) == RunOptions(lr=0.1, steps=10)
    assert job_options(get_job(path, "new")) == RunOptions(lr=0.2, optimizer="sgd", steps=7)  # steps: iterations
    assert store.query(path, "SELECT typeof(options) AS t FROM jobs WHERE job_id = 'new'")["t"][0] == "JSON"
    with pytest.raises(MeshplanError, match="lr"):  # validated on the way in: nothing queued
        submit_job(path, "tiny", 4, 7, job_id="bad", train={"lr": -1})
    with pytest.raises(MeshplanError, match="job_id"):
        submit_job(path, "tiny", 4, 7, job_id="../x")
    assert sorted(list_jobs(path)["job_id"]) == ["new", "old"]
