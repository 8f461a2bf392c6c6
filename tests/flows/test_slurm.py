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

import duckdb
import pytest

from tests.support.cli import meshplan
from tests.support.slurm import SlurmCluster, slurm_missing
from tests.worker.conftest import plan_dict
from tests.worker.test_train_dist import assert_matches_reference

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
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=debug", "#SBATCH --time=00:05:00"):
        assert line in script
    assert '--node-rank "$SLURM_NODEID"' in script and "torch.distributed.run" in script
    assert (tmp_path / "runs" / "dry" / "sbatch.sh").read_text() == script
    assert slurm.run("squeue", "-h").strip() == ""


def test_two_node_plan_trains_through_slurm_and_matches_one_process(tmp_path, slurm):
    out = meshplan(
        tmp_path, *SGD, "train", "--plan", str(_plan(tmp_path)), "--executor", "slurm", "--nnodes", "2",
        "--nproc-per-node", "1", "--steps", "3", "--run-id", "s", timeout=280,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    run_dir = tmp_path / "runs" / "s"
    assert_matches_reference(run_dir, "tiny", 3)
    with duckdb.connect(str(tmp_path / "meshplan.duckdb"), read_only=True) as con:
        status, executor, job_id = con.execute("select status, executor, slurm_job_id from runs").fetchall()[0]
    assert (status, executor) == ("completed", "slurm") and job_id.isdigit()
    assert f"slurm job {job_id}" in out.stdout
    # one agent on each node: the job's output names both nodes' ranks, node-major (rank 0 on n1)
    ranks = {json.loads(f.read_text().splitlines()[0])["rank"] for f in (run_dir / "telemetry").glob("rank_*.jsonl")}
    assert ranks == {0, 1}
    assert (run_dir / f"slurm-{job_id}.out").is_file()


def test_a_run_past_its_timeout_is_cancelled(tmp_path, slurm):
    out = meshplan(
        tmp_path, *SGD, "--set", "train.timeout_s=4", "train", "--plan", str(_plan(tmp_path)), "--executor", "slurm",
        "--nnodes", "2", "--nproc-per-node", "1", "--steps", "100000", "--run-id", "t", timeout=200,
    )  # fmt: skip
    assert out.returncode != 0
    assert "cancelled" in out.stdout + out.stderr
    assert slurm.run("squeue", "-h").strip() == ""  # scancel'd: nothing left queued or running


def test_discovery_measures_two_allocated_nodes_into_one_snapshot(tmp_path, slurm):
    out = meshplan(
        tmp_path, "--set", "discover.repeats=2", "--set", "discover.message_sizes=[1024, 65536]",
        "--set", "discover.matmul_size=128", "discover", "--executor", "slurm", "--nodes", "2", "--num-ranks", "1",
        "--json", timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    summary = json.loads(out.stdout)
    assert (summary["num_nodes"], summary["num_devices"], summary["source"]) == (2, 2, "probe")
    assert {d["node"] for d in summary["devices"]} == {"n1", "n2"}  # Slurm's node names, not the shared hostname
    assert any(f["link_class"] == "inter-node" for f in summary["fits"]), summary["fits"]
