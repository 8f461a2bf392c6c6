"""scheduler_flow: a real Prefect run decides one round over the DuckDB queue and records it (no ranks: a GPU cluster)."""

import os
from pathlib import Path

import pytest
from prefect.artifacts import Artifact

from flows.scheduler import scheduler_flow
from planner.errors import MeshplanError
from storage.jobs import get_job, job_events, list_jobs, submit_job
from tests.support import procs

MIXED = "examples/clusters/mixed-a100-v100-t4.toml"


def test_one_round_starts_what_fits_rejects_what_cannot_and_records_why(tmp_path) -> None:
    db = str(tmp_path / "m.duckdb")
    submit_job(db, "gpt3-1.3b", 64, 100, job_id="a")
    submit_job(db, "gpt2-small", 32, 100, job_id="b", gpu_kinds=("v100",))
    submit_job(db, "gpt3-175b", 8, 10, job_id="huge")
    out = scheduler_flow(db, MIXED, "jct", 1.0, launch=False)
    assert {j for j, _ in out.rejections} == {"huge"}
    states = dict(zip(*list_jobs(db).select("job_id", "state").to_dict().values(), strict=True))
    assert states == {"a": "running", "b": "running", "huge": "failed"}
    alloc = dict(zip(*list_jobs(db).select("job_id", "allocation").to_dict().values(), strict=True))
    assert alloc["b"].endswith("xv100/1")
    assert "plan pp=" in job_events(db, "a")["reason"].to_list()[-1]
    art = Artifact.get("scheduler-round")
    assert art is not None and "| a |" in str(art.data)
    again = scheduler_flow(db, MIXED, "jct", 1.0, launch=False)  # running jobs are placed back; nothing new to do
    assert again.rejections == [] and all(k != "start" for _, k, _ in again.actions)
    assert list_jobs(db, "running").height == 2


CPU4 = "tests/data/cpu-4ranks.toml"
TABLE = "model_cfg,gpu_type,num_gpus,num_nodes,gpus_per_node,sim_iter_time_s\ntiny,cpu,1,1,1,1.0\ntiny,cpu,2,1,2,0.5\ntiny,cpu,4,1,4,0.4\n"


def test_admitted_allocation_survives_in_the_queue_so_a_later_arrival_shrinks_the_grown_job(tmp_path) -> None:
    """Round 1 admits a at 2 ranks (GPU-seconds) and grows it to 4; round 2 reads that back from
    DuckDB and shrinks it to 2 for b. With launch=False no rank starts: the resize is a recorded
    `resizing` the runner would act on."""
    db, table = str(tmp_path / "m.duckdb"), tmp_path / "speed.csv"
    table.write_text(TABLE)
    kw = {"speed_table": str(table), "policy_options": {"relaunch_s": 5.0, "min_gain_s": 0.5}, "launch": False}
    submit_job(db, "tiny", 8, 120, job_id="a", seq=32)
    assert scheduler_flow(db, CPU4, "jct", **kw).actions == [("a", "start", "4xcpu/1")]
    submit_job(db, "tiny", 8, 40, job_id="b", seq=32)
    out = scheduler_flow(db, CPU4, "jct", **kw)
    assert sorted(out.actions) == [("a", "shrink", "2xcpu/1"), ("b", "start", "2xcpu/1")]
    states = dict(zip(*list_jobs(db).select("job_id", "state").to_dict().values(), strict=True))
    assert states == {"a": "resizing", "b": "running"}
    assert "so that 1 waiting job(s) start" in job_events(db, "a")["reason"].to_list()[-1]
    third = scheduler_flow(db, CPU4, "jct", **kw)  # a's switch is under way: it holds its 2, nothing to do
    assert third.actions == [] and third.waiting == []


def test_a_resize_finishing_while_the_round_reads_is_counted_once(tmp_path, monkeypatch) -> None:
    """A runner takes its job resizing → running whenever its relaunch is up, also while a round
    reads the queue. CI saw it on Slurm: a round read the shrunk job once as resizing and again as
    running, held its node twice and failed ("running job b no longer fits"). Here the runner moves
    at the worst moment — right after the round has read the job as resizing — and the round must
    still place it once."""
    import tasks.scheduler as ts
    from planner.scheduler import PlannerSpeed
    from planner.specs.cluster import parse_cluster_toml
    from storage.jobs import transition

    db, table = str(tmp_path / "m.duckdb"), tmp_path / "speed.csv"
    table.write_text(TABLE)
    kw = {"speed_table": str(table), "policy_options": {"relaunch_s": 5.0, "min_gain_s": 0.5}, "launch": False}
    submit_job(db, "tiny", 8, 120, job_id="a", seq=32)
    scheduler_flow(db, CPU4, "jct", **kw)
    submit_job(db, "tiny", 8, 40, job_id="b", seq=32)
    scheduler_flow(db, CPU4, "jct", **kw)  # a: resizing onto 2 of 4 ranks, b: running on the other 2
    read = ts.list_jobs

    def runner_moves(db_path, state=None):
        out = read(db_path, state)
        if "a" in out.filter(out["state"] == "resizing")["job_id"].to_list():
            transition(db_path, "a", "running", "the runner relaunched it", "2xcpu/1")
        return out

    monkeypatch.setattr(ts, "list_jobs", runner_moves)
    spec = parse_cluster_toml(Path(CPU4).read_text(), CPU4)
    _, _, running = ts.read_state.fn(db, spec, PlannerSpeed.from_cluster(spec))
    assert [r.job.job_id for r in running] == ["b"] and get_job(db, "a")["state"] == "running"


def test_the_flow_decides_with_the_default_policy_the_simulator_runs(tmp_path) -> None:
    """No --policy: the round is srtf's (planner/scheduler/srtf.py, what bench/scheduler.py measures):
    a is admitted on its smallest allocation and grown while nobody waits; b, shorter, arrives and
    starts at once on what a's growth left or a gives back."""
    db, table = str(tmp_path / "m.duckdb"), tmp_path / "speed.csv"
    table.write_text(TABLE)
    kw = {"speed_table": str(table), "policy_options": {"relaunch_s": 5.0, "min_gain_s": 0.5}, "launch": False}
    submit_job(db, "tiny", 8, 1200, job_id="a", seq=32)
    first = scheduler_flow(db, CPU4, **kw)
    assert [(j, k) for j, k, _ in first.actions] == [("a", "start")]
    assert get_job(db, "a")["base_allocation"] == "1xcpu/1" and first.actions[0][2] != "1xcpu/1"
    assert job_events(db, "a")["reason"].to_list()[-1].startswith("srtf: ")
    submit_job(db, "tiny", 8, 40, job_id="b", seq=32)
    second = scheduler_flow(db, CPU4, **kw)
    assert ("b", "start") in [(j, k) for j, k, _ in second.actions] and second.waiting == []


def test_a_missing_speed_table_is_a_user_error(tmp_path) -> None:
    with pytest.raises(MeshplanError, match="no such file"):
        scheduler_flow(str(tmp_path / "m.duckdb"), CPU4, "jct", speed_table=str(tmp_path / "none.csv"))


def test_an_unknown_train_option_is_refused_on_submission_and_an_allocation_the_cluster_lacks_fails_the_job(tmp_path):
    from flows.job import job_flow
    from storage.jobs import transition

    db = str(tmp_path / "m.duckdb")
    with pytest.raises(MeshplanError, match="learning_rate"):  # refused on the way in, never queued
        submit_job(db, "tiny", 8, 10, job_id="x", seq=32, train={"learning_rate": 0.1})
    submit_job(db, "tiny", 8, 10, job_id="y", seq=32)
    transition(db, "y", "running", "test", "2xa100/1")
    with pytest.raises(MeshplanError, match="no a100 nodes"):
        job_flow(db, "y", CPU4, str(tmp_path / "runs"))
    assert not (tmp_path / "runs" / "y" / "telemetry").exists()
    failed = list_jobs(db, "failed").to_dicts()
    assert {j["job_id"] for j in failed} == {"y"} and list_jobs(db).height == 1
    assert "cannot plan on 2xa100/1" in job_events(db, "y")["reason"].to_list()[-1]


def test_running_jobs_whose_runner_is_gone_go_back_to_the_queue_and_live_ones_stay(tmp_path) -> None:
    """What a scheduler killed between admitting a job and starting its runner leaves behind (no pid),
    a SIGKILLed runner (a dead pid), a pid reused by another process and a process that only names the
    runner module and the job on its command line are all requeued; a live runner's job (the tag
    start_runner puts in its environment) stays."""
    import sys

    from storage.jobs import set_job_run, transition
    from tasks.scheduler import RUNNER_TAG, reconcile_runners, runner_label

    db = str(tmp_path / "m.duckdb")
    for j in ("nopid", "dead", "reused", "named", "live"):
        submit_job(db, "tiny", 8, 10, job_id=j, seq=32)
        transition(db, j, "running", "test", "1xcpu/1")
    dead = procs.start([sys.executable, "-c", "pass"])
    dead.wait()
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    live = procs.start(sleep, env={**os.environ, RUNNER_TAG: runner_label(db, "live")})
    named = procs.start([*sleep, "-m", "flows.job", "named"], env={**os.environ, RUNNER_TAG: "other"})
    try:
        set_job_run(db, "dead", runner_pid=dead.pid)
        set_job_run(db, "reused", runner_pid=os.getpid())  # alive, but not a runner of that job
        set_job_run(db, "named", runner_pid=named.pid)
        set_job_run(db, "live", runner_pid=live.pid)
        assert sorted(reconcile_runners.fn(db)) == ["dead", "named", "nopid", "reused"]
    finally:
        for p in (live, named):
            p.kill()
            p.wait()
    states = dict(zip(*list_jobs(db).select("job_id", "state").to_dict().values(), strict=True))
    assert states == {"nopid": "queued", "dead": "queued", "reused": "queued", "named": "queued", "live": "running"}
    assert "its runner is gone" in job_events(db, "dead")["reason"].to_list()[-1]
