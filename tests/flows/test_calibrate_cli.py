"""`meshplan calibrate` as a user runs it: a runs file (good and bad), `--show`, the label in
`estimate`, and a CPU run's own telemetry calibrating the next estimate of its plan."""

import json
from pathlib import Path

import pytest

from planner.search import search
from planner.specs.cluster import parse_cluster_toml
from planner.specs.model import get_model
from storage.db import query
from tests.support.cli import meshplan, session_prefect_api

HEAD = "run_id,layers,hidden,heads,seq_len,vocab,global_batch,micro_batch,tp,pp,dp,gpu,num_gpus,gpus_per_node,iteration_time_s"
ROWS = [
    "a,24,2048,16,2048,50304,64,4,1,1,8,A100-SXM4-80GB,8,8,2.9",
    "b,24,2048,16,2048,50304,64,2,2,1,4,A100-SXM4-80GB,8,8,3.4",
    "c,24,2048,16,2048,50304,64,1,1,2,4,A100-SXM4-80GB,8,8,3.6",
]
CLUSTER_8 = """name = "a100x8"
[[nodes]]
name = "n"
device = "A100-SXM4-80GB"
num_devices = 8
intra_link = "nvlink3"
inter_link = "ib-hdr"
"""


def test_a_runs_file_calibrates_a_runtime_and_estimate_says_so_a_bad_one_stores_nothing(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([HEAD, ROWS[0], ROWS[1].replace("A100-SXM4-80GB", "B300-XL")]) + "\n")
    p = meshplan(tmp_path, "calibrate", "--runs", str(bad), "--runtime", "megatron")
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("error: runs file row 3, gpu") and "B300-XL" in p.stderr
    good = tmp_path / "runs.csv"
    good.write_text("\n".join([HEAD, *ROWS]) + "\n")
    p = meshplan(tmp_path, "calibrate", "--runs", str(good), "--runtime", "megatron", "--json")
    assert p.returncode == 0, p.stderr
    (fit,) = json.loads(p.stdout)
    assert (fit["device_kind"], fit["runtime"], fit["runs"]) == ("A100-SXM4-80GB", "megatron", 3)
    assert fit["mape_after"] < fit["mape_before"]
    stored = query(
        tmp_path / "meshplan.duckdb", "SELECT device_kind, runtime, run_ids, source FROM runtime_calibrations"
    )
    assert stored.height == 1 and json.loads(stored["run_ids"][0]) == ["a", "b", "c"]  # the bad file stored nothing
    show = meshplan(tmp_path, "calibrate", "--show")
    assert "calibrated: 3 runs, A100-SXM4-80GB/megatron" in show.stdout, show.stdout
    (tmp_path / "c.toml").write_text(CLUSTER_8)
    cluster = parse_cluster_toml(CLUSTER_8, "c.toml")
    plan = search(get_model("tiny"), cluster, global_batch=8, top_k=1, time_budget_s=5.0, baselines=False).best
    (tmp_path / "p.json").write_text(plan.to_json())
    est = ["estimate", "--plan", str(tmp_path / "p.json"), "--cluster", str(tmp_path / "c.toml")]
    p = meshplan(tmp_path, *est, "--runtime", "megatron")
    assert p.returncode == 0 and "calibrated: 3 runs, A100-SXM4-80GB/megatron" in p.stdout, p.stdout + p.stderr


@pytest.mark.dist
def test_one_cpu_runs_own_telemetry_is_too_few_to_calibrate_and_stores_nothing(tmp_path):
    # one tiny run used to store a per-micro-batch cost of −7 ms and flip the best plan (issue #42):
    # calibration now needs 3 distinct runs per device kind and says so in one line
    cfile = "tests/data/cpu-2ranks.toml"
    cluster = parse_cluster_toml(Path(cfile).read_text(), cfile)
    plan = search(get_model("tiny"), cluster, global_batch=4, top_k=1, time_budget_s=5.0, baselines=False).best
    (tmp_path / "p.json").write_text(plan.to_json())
    train = ["train", "--plan", str(tmp_path / "p.json"), "--steps", "4", "--data", "synthetic", "--no-replan"]
    p = meshplan(tmp_path, *train, "--json", timeout=600, prefect_api_url=session_prefect_api())
    assert p.returncode == 0, p.stderr[-3000:]
    db = tmp_path / "meshplan.duckdb"
    p = meshplan(tmp_path, "calibrate", "--cluster", cfile, "--json")
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert "cpu/meshplan: 1 distinct run, calibration needs at least 3" in p.stderr and "nothing stored" in p.stderr
    est = ["estimate", "--plan", str(tmp_path / "p.json"), "--cluster", cfile, "--json"]
    assert json.loads(meshplan(tmp_path, *est).stdout)["runtime_figures"] == "uncalibrated: cpu/meshplan"
    assert query(db, "SELECT count(*) AS n FROM runtime_calibrations")["n"][0] == 0
