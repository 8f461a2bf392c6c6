"""`meshplan train --plan plan.json --dry-run`: a mixed GPU plan's exact layout runs on local CPU ranks
(real torchrun/gloo, real Prefect flow, real DuckDB), and a plan the runtime refuses never launches."""

import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.flow

# The example mixed cluster's three kinds (examples/clusters/mixed-a100-v100-t4.toml), fewer of each:
# its own top plan for gpt3-13b uses all 16 GPUs, too many ranks for CI's 2 cores.
MINI_MIXED = """
name = "mini-mixed"

[[nodes]]
name = "a100"
device = "A100-SXM4-40GB"
num_devices = 2
intra_link = "nvlink3"
inter_link = "eth-100g"

[[nodes]]
name = "v100"
device = "V100-SXM2-32GB"
num_devices = 1
intra_link = "nvlink2"
inter_link = "eth-100g"

[[nodes]]
name = "t4"
device = "T4"
num_devices = 2
intra_link = "pcie3"
inter_link = "eth-100g"
"""

# gpt2-small has 12 heads: tp 8 cannot cut whole heads, which the runtime contract refuses
REFUSED = {
    "model": "gpt2-small",
    "cluster": "c",
    "global_batch_size": 8,
    "seq_len": 1024,
    "micro_batch_size": 1,
    "stages": [{"layer_start": 0, "layer_end": 12, "device_ids": list(range(8)), "tp": 8}],
    "batch_shares": [8],
}


def cli(tmp_path, *args, timeout=300):
    """`meshplan ARGS` as a user runs it, reporting to the test's Prefect server (as to a `meshplan ui`
    one) rather than starting an ephemeral server of its own: that start is most of a CLI flow's time."""
    from prefect.settings import PREFECT_API_URL

    cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp_path / "state"), *args]
    env = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1", "PREFECT_API_URL": PREFECT_API_URL.value()}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


@pytest.mark.dist
def test_the_top_plan_for_a_mixed_cluster_dry_runs_its_layout_on_cpu_ranks(tmp_path):
    from planner.runtime import launch_problems, rank_map
    from planner.specs.cluster import parse_cluster_toml
    from planner.specs.model import get_model
    from planner.specs.plan import parse_plan_json
    from storage.runs import load_run, step_metrics

    cluster = tmp_path / "mini-mixed.toml"
    cluster.write_text(MINI_MIXED)
    best = tmp_path / "plan.json"
    p = cli(
        tmp_path, "plan", "--model", "gpt3-6.7b", "--cluster", str(cluster), "--global-batch", "8", "--out", str(best)
    )
    assert p.returncode == 0, p.stderr
    plan = parse_plan_json(best.read_text())
    kind = {d.id: d.kind for d in parse_cluster_toml(MINI_MIXED).devices()}
    stage_kinds = [{kind[d] for d in s.device_ids} for s in plan.stages[: plan.pp]]
    assert plan.pp >= 2 and len(set().union(*stage_kinds)) >= 2, stage_kinds  # kinds on different stages
    assert launch_problems(plan, plan.num_devices, get_model("gpt3-6.7b")) == ()

    t0 = time.monotonic()
    d = cli(tmp_path, "train", "--plan", str(best), "--dry-run", "--json", timeout=600)
    wall_s = time.monotonic() - t0
    assert d.returncode == 0, d.stderr[-4000:]
    out = json.loads(d.stdout)
    assert out["ok"] and out["steps_done"] == out["steps"] == 2 and out["world_size"] == plan.num_devices
    assert out["plan"] == plan.fingerprint() and out["schedule"] == plan.schedule
    assert out["num_microbatches"] == [plan.num_microbatches(r) for r in range(plan.dp)]
    assert [s["device_ids"] for s in out["stages"]] == [list(s.device_ids) for s in plan.stages[: plan.pp]]
    assert [tuple(s["layers"]) for s in out["stages"]] == [(s.layer_start, s.layer_end) for s in plan.stages]

    # what ran, from the telemetry the launcher's ranks wrote and the flow ingested
    db = tmp_path / "state" / "meshplan.duckdb"
    rows = step_metrics(db, out["run_id"]).to_dicts()
    slots = {s.rank: s for s in rank_map(plan)}
    assert {(r["rank"], r["step"]) for r in rows} == {(k, step) for k in slots for step in range(2)}
    for r in rows:
        s = slots[r["rank"]]
        assert (r["stage"], r["replica"], r["tp_index"]) == (s.stage, s.replica, s.tp_index)
        assert r["num_microbatches"] == plan.num_microbatches(s.replica)
    assert all(r["loss"] is not None for r in rows if r["stage"] == plan.pp - 1)
    assert load_run(db, out["run_id"])["status"] == "completed"
    # the launched plan is the user's layout at the scaled model's sequence length
    ran = parse_plan_json((tmp_path / "state" / "runs" / out["run_id"] / "plan.json").read_text())
    assert (ran.stages, ran.batch_shares, ran.schedule, ran.micro_batch_size) == (
        plan.stages,
        plan.batch_shares,
        plan.schedule,
        plan.micro_batch_size,
    )
    print(f"dry run: {out['world_size']} ranks, {wall_s:.1f} s for the command, {out['wall_s']:.1f} s torchrun")


def test_a_plan_the_runtime_refuses_is_refused_with_its_reason_before_launching(tmp_path):
    bad = tmp_path / "refused.json"
    bad.write_text(json.dumps(REFUSED))
    d = cli(tmp_path, "train", "--plan", str(bad), "--dry-run")
    assert d.returncode == 1
    assert d.stderr.strip().count("\n") == 0 and "stages[0].tp" in d.stderr and "heads=12" in d.stderr, d.stderr
    assert not (tmp_path / "state" / "runs").exists()  # nothing was launched


def test_the_dry_run_flow_refuses_it_too(tmp_path):
    from flows.dryrun import dry_run_flow
    from flows.requests import TrainRequest
    from planner.errors import MeshplanError

    bad = tmp_path / "refused.json"
    bad.write_text(json.dumps(REFUSED))
    with pytest.raises(MeshplanError, match="heads=12"):
        dry_run_flow(str(tmp_path / "m.duckdb"), TrainRequest(plan_path=str(bad), runs_dir=str(tmp_path / "runs")))
    assert not (tmp_path / "runs").exists()
