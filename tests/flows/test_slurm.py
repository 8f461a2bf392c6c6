"""Training through a real Slurm (issue #28): `meshplan train --executor slurm` on a two-node cluster.

The cluster (tests/support/slurm.py) is Debian's slurmctld and two slurmd nodes on this machine,
started for this module and stopped after it. A pp2 plan, one rank a node, is submitted as one
sbatch job (launcher/slurm.py): srun starts one torchrun agent a node, the static rendezvous on
the first allocated node numbers the ranks node-major, and the run ends with the weights of the
single-process run. The job id is on the run row and in the output; a run past its timeout is
cancelled (scancel) and leaves nothing queued.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import duckdb
import pytest

from flows.scheduler import scheduler_flow
from launcher import group
from planner.specs.config import TrainConfig
from planner.specs.model import get_model
from storage.jobs import get_job, job_events, submit_job
from tests.flows.test_elastic_job import rank0_rows, wait_until
from tests.support import procs
from tests.support.cli import meshplan, session_prefect_api
from tests.support.reference import train_reference
from tests.support.slurm import SlurmCluster, slurm_missing
from tests.worker.conftest import plan_dict
from tests.worker.test_train_dist import assert_matches_reference
from worker.checkpoint import latest_checkpoint, load_full_model_state

pytestmark = [pytest.mark.dist, pytest.mark.flow]

SGD = ("--set", "train.data='synthetic'", "--set", "train.optimizer='sgd'", "--set", "train.lr=0.5")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = slurm_missing()
    if why:
        if os.environ.get("CI"):  # .ci/run installs slurm-wlm: missing there is a failure, not a skip
            pytest.fail(why)
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # the meshplan processes below find it, as a user's shell
    yield cluster
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old
    cluster.stop()


def _plan(tmp_path):
    path = tmp_path / "pp2.json"
    path.write_text(json.dumps(plan_dict([(0, 2), (2, 4)], schedule="gpipe")))
    return path


def test_dry_run_prints_the_batch_script_and_submits_nothing(tmp_path, slurm):
    out = meshplan(
        tmp_path, "train", "--plan", str(_plan(tmp_path)), "--executor", "slurm", "--nnodes", "2",
        "--nproc-per-node", "1", "--partition", "debug", "--time", "00:05:00", "--dry-run", "--run-id", "dry",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    script = out.stdout
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=debug",
        "#SBATCH --time=00:05:00",
    ):
        assert line in script
    assert '--node-rank "$SLURM_NODEID"' in script and "torch.distributed.run" in script
    assert (tmp_path / "runs" / "dry" / "sbatch.sh").read_text() == script
    assert slurm.run("squeue", "-h").strip() == ""


def test_two_node_plan_trains_through_slurm_resumes_when_requeued_and_matches_one_process(tmp_path, slurm):
    """A pp2 plan, one rank a node, as one sbatch job. Mid-run `scontrol requeue` (what preemption with
    requeue does): Slurm kills the ranks and runs the batch script again; the ranks resume from the
    run folder's latest checkpoint and the run ends with the weights of the single-process run,
    every step after the checkpoint trained again exactly once. The job id is on the run row."""
    cmd = [
        sys.executable, "-m", "cli", "--state-dir", str(tmp_path), *SGD, "--set", "train.checkpoint_every=5",
        "train", "--plan", str(_plan(tmp_path)), "--executor", "slurm", "--nnodes", "2", "--nproc-per-node", "1",
        "--steps", "30", "--run-id", "q",
    ]  # fmt: skip
    # the session's Prefect server, as a user's PREFECT_API_URL: no temporary server started for it
    env = dict(
        os.environ, PREFECT_HOME=str(tmp_path / "prefect"), OMP_NUM_THREADS="1", PREFECT_API_URL=session_prefect_api()
    )
    proc = procs.start(cmd, env=env, capture=True, merge_stderr=True)
    run_dir = tmp_path / "runs" / "q"
    try:
        wait_until(lambda: len(rank0_rows(run_dir)) >= 12, "10 steps checkpointed", 150)
        job_id = slurm.run("squeue", "-h", "-n", "meshplan-q", "-o", "%i").strip()
        slurm.run("scontrol", "requeue", job_id)
        wait_until(lambda: "PENDING" in slurm.run("squeue", "-h", "-j", job_id, "-o", "%T"), "the requeue", 60)
        slurm.run("scontrol", "update", f"jobid={job_id}", "StartTime=now")  # Slurm holds a requeued job 2 min
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    assert_matches_reference(run_dir, "tiny", 30)
    steps = [r["step"] for r in rank0_rows(run_dir)]
    back = [(a, b) for a, b in zip(steps, steps[1:], strict=False) if b <= a]
    assert len(back) == 1 and back[0][1] % 5 == 0 and back[0][1] >= 10, steps  # once, to a checkpoint
    assert steps[-1] == 29
    with duckdb.connect(str(tmp_path / "meshplan.duckdb"), read_only=True) as con:
        status, executor, stored_id = con.execute("select status, executor, slurm_job_id from runs").fetchall()[0]
    assert (status, executor, stored_id) == ("completed", "slurm", job_id)
    assert f"slurm job {job_id}" in out and (run_dir / f"slurm-{job_id}.out").is_file()
    ranks = {json.loads(f.read_text().splitlines()[0])["rank"] for f in (run_dir / "telemetry").glob("rank_*.jsonl")}
    assert ranks == {0, 1}


def test_a_run_past_its_timeout_is_cancelled(tmp_path, slurm):
    out = meshplan(
        tmp_path, *SGD, "--set", "train.timeout_s=4", "train", "--plan", str(_plan(tmp_path)), "--executor", "slurm",
        "--nnodes", "2", "--nproc-per-node", "1", "--steps", "100000", "--run-id", "t", timeout=200,
        prefect_api_url=session_prefect_api(),
    )  # fmt: skip
    assert out.returncode != 0
    assert "cancelled" in out.stdout + out.stderr
    assert slurm.run("squeue", "-h").strip() == ""  # scancel'd: nothing left queued or running


def test_readme_sequence_discovery_of_two_nodes_then_plan_then_train_on_them(tmp_path, slurm):
    """The README's Slurm sequence as written: `discover --executor slurm --nodes 2` measures both
    nodes into one snapshot; `plan --out` plans on every discovered device (nodes × ranks a node, what
    `train --executor slurm` is given) and says the launch; `train` of that plan on 2 nodes × 1 runs.
    The three commands report to the session's Prefect server (PREFECT_API_URL), not one they start each."""
    api = session_prefect_api()
    out = meshplan(
        tmp_path, "--set", "discover.repeats=2", "--set", "discover.message_sizes=[1024, 65536]",
        "--set", "discover.matmul_size=128", "discover", "--executor", "slurm", "--nodes", "2", "--num-ranks", "1",
        "--json", timeout=240, prefect_api_url=api,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    summary = json.loads(out.stdout)
    assert (summary["num_nodes"], summary["num_devices"], summary["source"]) == (2, 2, "probe")
    assert {d["node"] for d in summary["devices"]} == {"n1", "n2"}  # Slurm's node names, not the shared hostname
    assert any(f["link_class"] == "inter-node" for f in summary["fits"]), summary["fits"]

    plan = tmp_path / "plan.json"
    out = meshplan(tmp_path, "plan", "--model", "tiny", "--budget", "2", "--out", str(plan), prefect_api_url=api)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "launch: --nnodes 2 --nproc-per-node 1" in out.stdout, out.stdout
    devices = sorted(d for s in json.loads(plan.read_text())["stages"] for d in s["device_ids"])
    assert devices == [0, 1]
    out = meshplan(
        tmp_path, *SGD, "train", "--plan", str(plan), "--executor", "slurm", "--nnodes", "2", "--nproc-per-node", "1",
        "--steps", "2", "--run-id", "readme", timeout=240, prefect_api_url=api,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert [r["step"] for r in rank0_rows(tmp_path / "runs" / "readme")] == [0, 1]


# --- the multi-job scheduler on Slurm: the cluster read from scontrol, each launch an sbatch job ----

NODES = "tests/data/cpu-2nodes.toml"  # the kind's figures and links; Slurm says how many nodes are up
# 2 nodes are worth it while nobody waits (0.55 s vs 1.0 s an iteration), so a is admitted on one
# (its most efficient allocation), grown to two, and shrunk back when b arrives
TABLE = "model_cfg,gpu_type,num_gpus,num_nodes,gpus_per_node,sim_iter_time_s\ntiny,cpu,1,1,1,1.0\ntiny,cpu,2,2,1,0.55\n"
POLICY = {"relaunch_s": 5.0, "min_gain_s": 0.5}
LR, ATOL = 0.01, 1e-4
TRAIN_S = {"data": "synthetic", "optimizer": "sgd", "lr": LR, "checkpoint_every": 10}


def _params_error(run_dir, steps: int, batch: int) -> float:

    ref, _ = train_reference(get_model("tiny"), batch, 32, steps, "synthetic", 0, LR, "sgd")
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    got = load_full_model_state(ckpt, get_model("tiny"))
    return max((got[k] - ref[k]).abs().max().item() for k in ref)


def _scheduler(tmp_path):

    db, runs, table = str(tmp_path / "m.duckdb"), tmp_path / "runs", tmp_path / "speed.csv"
    table.write_text(TABLE)

    def round_():
        return scheduler_flow(
            db, NODES, "jct", speed_table=str(table), policy_options=POLICY, runs_dir=str(runs), train=TrainConfig(timeout_s=600.0),
            executor="slurm",
        )  # fmt: skip

    return db, runs, round_


def _until_done(db, jobs, round_, deadline_s=400.0):
    t_end = time.monotonic() + deadline_s
    while time.monotonic() < t_end:
        states = {j: get_job(db, j)["state"] for j in jobs}
        if set(states.values()) <= {"finished", "failed"}:
            return states
        round_()
        time.sleep(1.0)
    return {j: get_job(db, j)["state"] for j in jobs}


def _stop_runners(pids):
    for pid in pids:
        group.send(pid, signal.SIGTERM)


def test_scheduler_on_slurm_shrinks_the_first_job_for_the_second_and_both_finish(tmp_path, slurm):

    db, runs, round_ = _scheduler(tmp_path)
    # a foreign job holds a node (its output nowhere, not slurm-<id>.out in the working directory)
    slurm.run("sbatch", "--job-name=someone-else", "--nodes=1", "--output=/dev/null", "--wrap", "sleep 300")
    wait_until(lambda: "RUNNING" in slurm.run("squeue", "-h", "-o", "%T"), "the foreign job to run", 30)
    submit_job(db, "tiny", 32, 150, job_id="a", seq=32, train=TRAIN_S)
    pids = []
    try:
        first = round_()
        assert first.actions == [("a", "start", "1xcpu/1")], first  # the other node is busy: never touched
        pids += [x["runner_pid"] for x in first.applied if x.get("runner_pid")]
        slurm.run("scancel", "--name=someone-else")
        wait_until(lambda: len(rank0_rows(runs / "a")) >= 3, "job a's first steps", 120)
        grown = round_()  # the node is free now: a grows onto both
        assert grown.actions == [("a", "grow", "2xcpu/2")], grown
        launches = lambda: len(list((runs / "a").glob("slurm-*.out")))  # noqa: E731
        at_grow = len(rank0_rows(runs / "a"))
        wait_until(lambda: launches() >= 2 and len(rank0_rows(runs / "a")) > at_grow + 2, "a on two nodes", 120)
        submit_job(db, "tiny", 8, 20, job_id="b", seq=32, train=TRAIN_S)
        second = round_()
        pids += [x["runner_pid"] for x in second.applied if x.get("runner_pid")]
        assert sorted(second.actions) == [("a", "shrink", "1xcpu/1"), ("b", "start", "1xcpu/1")], second
        states = _until_done(db, ("a", "b"), round_)
    finally:
        _stop_runners(pids)
    assert states == {"a": "finished", "b": "finished"}, (states, (runs / "a" / "job.log").read_text()[-3000:])
    rows = rank0_rows(runs / "a")
    assert [r["step"] for r in rows] == list(range(150)), "a trained every step once, in order"
    reasons = " | ".join(e["reason"] or "" for e in job_events(db, "a").to_dicts())
    assert "2xcpu/2" in reasons and "1xcpu/1" in reasons
    assert _params_error(runs / "a", 150, 32) < ATOL
    assert _params_error(runs / "b", 20, 8) < ATOL
    assert len(list((runs / "a").glob("slurm-*.out"))) >= 3  # one sbatch job a launch: 1 node, 2 nodes, 1 node


def test_a_node_set_down_mid_run_resumes_the_job_from_its_checkpoint_on_the_nodes_left(tmp_path, slurm):

    db, runs, round_ = _scheduler(tmp_path)
    submit_job(db, "tiny", 32, 60, job_id="d", seq=32, train=TRAIN_S)
    pids = []
    try:
        first = round_()
        assert first.actions == [("d", "start", "2xcpu/2")], first  # nobody waits: both nodes
        pids += [x["runner_pid"] for x in first.applied if x.get("runner_pid")]
        wait_until(lambda: len(rank0_rows(runs / "d")) >= 15, "job d past its first checkpoint", 150)
        slurm.run("scontrol", "update", "nodename=n2", "state=down", "reason=meshplan-test")
        states = _until_done(db, ("d",), lambda: None, 300)
    finally:
        _stop_runners(pids)
        slurm.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
    assert states == {"d": "finished"}, (states, (runs / "d" / "job.log").read_text()[-3000:])
    reasons = [e["reason"] or "" for e in job_events(db, "d").to_dicts()]
    lost = next(r for r in reasons if "lost" in r)
    assert "re-planning on 1xcpu/1" in lost, reasons
    steps = [r["step"] for r in rank0_rows(runs / "d")]
    back = [b for a, b in zip(steps, steps[1:], strict=False) if b <= a]
    assert len(back) == 1 and back[0] % 10 == 0, steps  # once, to a checkpoint (every 10 steps)
    assert steps[-1] == 59 and _params_error(runs / "d", 60, 32) < ATOL


def test_ctrl_c_on_a_slurm_train_cancels_the_job_and_returns_with_one_line(tmp_path, slurm):
    """Ctrl-C (SIGINT to the command's process group, as a terminal sends it): the sbatch job is
    scancel'ed, Prefect's temporary server (a session of its own) is still up to record the crash, the
    run row is closed as killed and the command prints one line — no httpx.ConnectError, no wait."""
    cmd = [
        sys.executable, "-m", "cli", "--state-dir", str(tmp_path), *SGD, "train", "--plan", str(_plan(tmp_path)),
        "--executor", "slurm", "--nnodes", "2", "--nproc-per-node", "1", "--steps", "100000", "--run-id", "i",
    ]  # fmt: skip
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"), OMP_NUM_THREADS="1")
    env.pop("PREFECT_API_URL", None)
    proc = procs.start(cmd, env=env, capture=True)
    try:
        wait_until(lambda: len(rank0_rows(tmp_path / "runs" / "i")) >= 2, "training on Slurm", 150)
        t0 = time.monotonic()
        group.send(proc, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [x for x in err.splitlines() if x.strip()]
    assert proc.returncode == 130 and took <= 10, (proc.returncode, took, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: interrupted") and "ConnectError" not in err, err
    assert slurm.run("squeue", "-h").strip() == ""
    with duckdb.connect(str(tmp_path / "meshplan.duckdb"), read_only=True) as con:
        assert con.execute("select status from runs").fetchall() == [("killed",)]
