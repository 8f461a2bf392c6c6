"""`meshplan submit / jobs / cancel` in real CLI processes against one state folder."""

import json
import sys

from tests.support.cli import meshplan


def test_submit_list_cancel(tmp_path) -> None:
    p = meshplan(
        tmp_path, "submit", "--model", "gpt2-small", "--global-batch", "32", "--iterations", "100", "--job-id", "a"
    )
    assert p.returncode == 0 and p.stdout.strip() == "a", p.stderr
    p = meshplan(tmp_path, "jobs")
    title, header, *rows = p.stdout.splitlines()
    assert header.split()[:3] == ["job_id", "state", "model"]
    assert rows[0].split()[:3] == ["a", "queued", "gpt2-small"]
    assert meshplan(tmp_path, "cancel", "a").returncode == 0
    p = meshplan(tmp_path, "jobs", "--events")
    assert [ln.split()[3] for ln in p.stdout.splitlines()[2:]] == ["queued", "cancelled"]
    p = meshplan(tmp_path, "cancel", "a")
    assert p.returncode == 1 and "cannot go to cancelled from cancelled" in p.stderr
    p = meshplan(tmp_path, "submit", "--model", "gpt9", "--global-batch", "8", "--iterations", "1")
    assert p.returncode == 1 and "did you mean" in p.stderr


def test_submit_records_the_training_options_the_runner_uses(tmp_path) -> None:
    from planner.specs.runspec import RunOptions
    from storage.jobs import get_job, job_options

    args = ["submit", "--model", "tiny", "--global-batch", "8", "--iterations", "20", "--job-id", "b"]
    p = meshplan(tmp_path, *args, "--optimizer", "sgd", "--lr", "0.05", "--checkpoint-every", "5")
    assert p.returncode == 0, p.stderr
    options = job_options(get_job(tmp_path / "meshplan.duckdb", "b"))  # what job_flow hands to train_flow
    assert options == RunOptions(optimizer="sgd", lr=0.05, checkpoint_every=5, steps=20)
    p = meshplan(tmp_path, *args[:-1], "c", "--lr", "-1")
    assert p.returncode == 1 and p.stderr.lower().startswith("error: --lr") and "Traceback" not in p.stderr, p.stderr
    p = meshplan(tmp_path, *args[:-1], "d", "--optimizer", "lion")
    assert p.returncode == 1 and "--optimizer" in p.stderr and "adamw" in p.stderr, p.stderr
    assert (
        meshplan(tmp_path, "jobs", "--format", "csv").stdout.splitlines()[1].split(",")[0] == "b"
    )  # the refused ones were never queued


def test_jobs_json_gives_the_allocation_as_numbers(tmp_path) -> None:
    from storage.jobs import submit_job, transition

    db = tmp_path / "meshplan.duckdb"
    submit_job(db, "tiny", 8, 10, job_id="a", seq=32, train={"lr": 0.1})
    transition(db, "a", "running", "admitted by the test", "4xcpu/2")
    p = meshplan(tmp_path, "jobs", "--json")
    assert p.returncode == 0, p.stderr
    (job,) = json.loads(p.stdout)
    assert (job["job_id"], job["state"], job["train"]["lr"], job["train"]["steps"]) == ("a", "running", 0.1, 10)
    assert (job["num_devices"], job["device_kind"], job["num_nodes"]) == (4, "cpu", 2)
    assert job["base_num_devices"] is None  # admitted by hand, not by the scheduler
    p = meshplan(tmp_path, "jobs", "--events", "--json")
    assert [(e["to_state"], e["num_devices"]) for e in json.loads(p.stdout)] == [("queued", None), ("running", 4)]


def test_schedule_cluster_needs_a_server_and_a_known_policy(tmp_path) -> None:
    cluster = "tests/data/cpu-4ranks.toml"
    p = meshplan(tmp_path, "schedule-cluster", "--cluster", cluster, "--every", "5m")
    assert p.returncode == 1 and "run `meshplan ui` first" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = meshplan(tmp_path, "schedule-cluster", "--cluster", cluster, "--policy", "sjf")
    assert p.returncode == 1 and "choose one of srtf, jct" in p.stderr
    p = meshplan(tmp_path, "schedule-cluster", "--cluster", cluster, "--every", "never")
    assert p.returncode == 1 and "--every" in p.stderr


def test_schedule_cluster_serves_a_deployment_whose_run_decides_a_round(tmp_path) -> None:
    """A real server (flows/server.py), `meshplan schedule-cluster` serving, one run on demand:
    the queued job is admitted, recorded in the queue (--no-launch: a GPU cluster, no ranks here)."""
    from storage.jobs import list_jobs, submit_job
    from tests.flows.test_replan_cli import _env
    from tests.support.served import serve_and_run_once

    db = tmp_path / "meshplan.duckdb"
    submit_job(db, "gpt2-small", 32, 100, job_id="a")
    args = [
        "schedule-cluster",
        "--cluster",
        "examples/clusters/mixed-a100-v100-t4.toml",
        "--every",
        "1h",
        "--no-launch",
    ]
    command = [sys.executable, "-m", "cli", "--state-dir", str(tmp_path), *args]
    serve_and_run_once(tmp_path, command, "scheduler/cluster", _env(PREFECT_RUNNER_POLL_FREQUENCY="1"), 3600)
    assert list_jobs(db, "running")["job_id"].to_list() == ["a"]
