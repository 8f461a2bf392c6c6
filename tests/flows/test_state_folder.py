"""One state folder (rundir/state.py): `--state-dir` and `--db` resolved once, every run folder in
one runs folder, ids that cannot leave it, and a `--db` that must be a DuckDB file."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

import rundir
from launcher import group
from rundir import StateDir
from tests.support.cli import meshplan, meshplan_main
from tests.worker.conftest import plan_dict

CLUSTER = "tests/data/cpu-2ranks.toml"


def _one_line_error(out, starts: str) -> None:
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert out.stderr.startswith(f"error: {starts}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr


def test_state_dir_resolves_every_folder_once(tmp_path):
    s = StateDir.of(tmp_path / "state", tmp_path / "elsewhere" / "m.duckdb")
    assert s.runs == (tmp_path / "state" / "runs").resolve() and s.db.parent.name == "elsewhere"
    assert s.prefect_home.parent == s.root and s.backups == s.db.parent / "backups"
    assert s.run("a.b-1_c") == s.runs / "a.b-1_c" and s.discovery("x").parent == s.runs
    assert StateDir.of(tmp_path).db == tmp_path.resolve() / "meshplan.duckdb"
    assert StateDir.of_db(tmp_path / "m.duckdb").runs == tmp_path.resolve() / "runs"
    for bad in ("../../etc", "/abs/path", "a/b", "..", ".hidden", "-flag", "", "x" * 129, "a\nb"):
        with pytest.raises(ValueError, match="id"):
            s.run(bad)
        assert rundir.id_problem(bad)


def test_db_problem_names_what_is_not_a_duckdb_file(tmp_path):
    (tmp_path / "a.csv").write_text("a,b\n1,2\n")
    (tmp_path / "empty.duckdb").write_bytes(b"")
    assert "not a DuckDB" in rundir.db_problem(tmp_path / "a.csv")
    assert "directory" in rundir.db_problem(tmp_path)
    assert rundir.db_problem(tmp_path / "new.duckdb") is None and rundir.db_problem(tmp_path / "empty.duckdb") is None


def test_run_and_job_ids_cannot_escape_the_state_folder(tmp_path):
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(plan_dict([(0, 4)], dp=2)))
    out = meshplan(tmp_path, "train", "--plan", str(plan), "--run-id", "../../etc", "--steps", "2")
    _one_line_error(out, "--run-id='../../etc'")
    out = meshplan(tmp_path, "train", "--plan", str(plan), "--executor", "slurm", "--dry-run", "--run-id", "/abs/x")
    _one_line_error(out, "--run-id='/abs/x'")
    job = ["submit", "--model", "tiny", "--global-batch", "8", "--iterations", "2"]
    out = meshplan(tmp_path, *job, "--job-id", str(tmp_path.parent / "abs-job"))
    _one_line_error(out, f"--job-id='{tmp_path.parent / 'abs-job'}'")
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "abs-job").exists()
    assert not (tmp_path.parent.parent / "etc" / "plan.json").exists()
    assert meshplan(tmp_path, "jobs").stdout.strip() == "no jobs"  # nothing was queued


def test_db_must_be_a_duckdb_file_or_absent(tmp_path):
    csv = tmp_path / "existing.csv"
    csv.write_text("job,state\n")
    job = ["submit", "--model", "tiny", "--global-batch", "8", "--iterations", "2", "--job-id", "j"]
    for db, starts in ((csv, f"--db='{csv}'"), (tmp_path / "folder", f"--db='{tmp_path / 'folder'}'")):
        (tmp_path / "folder").mkdir(exist_ok=True)
        out = meshplan(tmp_path, "--db", str(db), *job)
        _one_line_error(out, starts)
    assert csv.read_text() == "job,state\n" and not any((tmp_path / "folder").iterdir())
    out = meshplan(tmp_path, "--db", str(tmp_path / "folder"), "jobs")
    _one_line_error(out, "--db=")
    assert not (tmp_path / "meshplan.duckdb").exists()  # nothing was stored anywhere


# the smallest placement `meshplan serve` runs: one model of one layer on one CPU rank
SERVED = {
    "name": "m",
    "dims": {"name": "m", "num_layers": 1, "hidden": 32, "num_heads": 2, "vocab_size": 64, "seq_len": 16},
    "seq": 8,
    "rate": 2,
    "cv": 1,
    "slo_s": 30.0,
}


@pytest.mark.dist
@pytest.mark.flow
def test_with_db_elsewhere_train_jobs_serving_and_discovery_share_the_state_folders_runs(tmp_path, monkeypatch, capsys):
    """--db outside --state-dir: a trained run's folder, a queued job's (started by a real scheduler
    round with schedule-cluster's parameters, its runner training 2 ranks), a serving run's and a
    discovery's are all in <state-dir>/runs; nothing is written beside the database but the database.
    Every command runs in this process (cli.main), so all of them and the job's runner use the test
    session's one Prefect server instead of starting one each; discover and serve run while the job does."""
    from cli.app import G, load_settings
    from cli.commands.jobs import scheduler_parameters
    from flows.scheduler import scheduler_flow
    from storage.db import query
    from storage.jobs import get_job
    from tests.flows.test_elastic_job import wait_until

    state, elsewhere = tmp_path / "state", tmp_path / "elsewhere"
    db = elsewhere / "m.duckdb"
    elsewhere.mkdir()
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(plan_dict([(0, 4)], dp=2)))
    placement = {
        "method": "manual",
        "cluster": "cpu-2ranks",
        "dtype": "fp32",
        "models": [SERVED],
        "groups": [{"devices": [0], "kind": "cpu", "pp": 1, "tp": 1, "models": ["m"]}],
    }
    (tmp_path / "placement.json").write_text(json.dumps(placement))
    (tmp_path / "trace.csv").write_text("model,arrival_s\nm,0.0\nm,0.05\n")

    def cli(*args: str) -> str:
        rc, out, err = meshplan_main(monkeypatch, capsys, "--state-dir", str(state), "--db", str(db), *args)
        assert rc == 0, err
        return out

    cli("train", "--plan", str(plan), "--executor", "slurm", "--dry-run", "--run-id", "t", "--nproc-per-node", "2")
    job = ["submit", "--model", "tiny", "--global-batch", "4", "--iterations", "2", "--job-id", "j"]
    cli(*job, "--data", "synthetic", "--checkpoint-every", "1000")
    G.state_dir, G.db = state, db  # what `meshplan --state-dir S --db D schedule-cluster` resolves
    try:
        params = scheduler_parameters(load_settings(), Path(CLUSTER))
    finally:
        G.state_dir = G.db = None
    pid = None
    try:
        out = scheduler_flow(**params)
        pid = out.applied[0]["runner_pid"]
        # while the job's runner trains: a discovery, then a serving run (each store write retries the lock)
        sets = ["discover.message_sizes=[1024]", "discover.repeats=1", "discover.matmul_size=64"]
        cli(*(a for kv in sets for a in ("--set", kv)), "discover", "--num-ranks", "2")
        served = ["--placement", str(tmp_path / "placement.json"), "--cluster", CLUSTER]
        assert "requests recorded in" in cli("serve", *served, "--replay", str(tmp_path / "trace.csv"), "--port", "0")
        wait_until(lambda: get_job(db, "j")["state"] in ("finished", "failed"), "job j to end", 240.0)
    finally:
        if pid:
            group.send(pid, signal.SIGTERM)
    runs = state / "runs"
    assert get_job(db, "j")["state"] == "finished", (runs / "j" / "job.log").read_text()[-2000:]
    assert get_job(db, "j")["run_dir"] == str((runs / "j").resolve())
    assert (runs / "t" / "sbatch.sh").is_file() and (runs / "j" / "torchrun.log").is_file()
    assert [p.name for p in runs.glob("discover-*/snapshot.json")], sorted(p.name for p in runs.iterdir())
    serving = [p for p in runs.glob("serve-*") if rundir.serve_placement_path(p).is_file()]
    assert len(serving) == 1 and rundir.serve_calib_files(serving[0]), sorted(p.name for p in runs.iterdir())
    assert query(db, "SELECT count(*) AS n FROM serve_requests WHERE phase = 'serve'")["n"][0] == 2
    assert sorted(p.name for p in elsewhere.iterdir() if not p.name.startswith("m.duckdb")) == []
