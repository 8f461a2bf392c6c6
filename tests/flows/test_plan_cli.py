"""`meshplan plan` and `meshplan estimate` end to end, as a user runs them (subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
MIXED = ROOT / "examples" / "clusters" / "mixed-a100-v100-t4.toml"


def run(tmp_path, *args, timeout=300):
    cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp_path / "state"), *args]
    env = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


def test_plan_json_ranks_plans_writes_the_best_and_stores_them(tmp_path):
    out = tmp_path / "best.json"
    p = run(
        tmp_path,
        "plan",
        "--model",
        "gpt2-small",
        "--cluster",
        str(MIXED),
        "--global-batch",
        "32",
        "--top",
        "3",
        "--budget",
        "3",
        "--json",
        "--out",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["feasible"] and doc["ranking"][0]["rank"] == 1
    assert "vs_megatron" in doc["ranking"][0] and "vs_uniform" in doc["ranking"][0]
    from planner.specs.plan import parse_plan_json
    from storage.plans import plans_frame

    best = parse_plan_json(out.read_text())
    assert best.fingerprint() == doc["ranking"][0]["fingerprint"]
    assert plans_frame(tmp_path / "state" / "meshplan.duckdb").height >= 1


def test_plan_table_shows_speedups(tmp_path):
    p = run(tmp_path, "plan", "--model", "gpt2-small", "--cluster", str(MIXED), "--global-batch", "16", "--budget", "2")
    assert p.returncode == 0, p.stderr
    assert (
        "×meg" in p.stdout
        and "megatron's/uniform's step time ÷ this plan's" in p.stdout
        and "bottleneck" in p.stdout
        and "shapes" in p.stdout
    )


def test_estimate_prices_the_golden_plan(tmp_path):
    p = run(
        tmp_path,
        "estimate",
        "--cluster",
        str(DATA / "golden-4xT4.toml"),
        "--plan",
        str(DATA / "plan_v1.json"),
        "--json",
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["feasible"] and doc["step_time_s"] > 0 and len(doc["peak_memory_bytes"]) == 2


def test_estimate_of_a_plan_for_another_model_fails_in_one_line(tmp_path):
    p = run(
        tmp_path,
        "estimate",
        "--cluster",
        str(DATA / "golden-4xT4.toml"),
        "--plan",
        str(DATA / "plan_v1.json"),
        "--model",
        "gpt2-small",
    )
    assert p.returncode == 1
    assert p.stderr.strip().count("\n") == 0 and "--model" in p.stderr


def test_estimate_of_a_plan_that_does_not_fit_the_cluster_names_the_field(tmp_path):
    data = json.loads((DATA / "plan_v1.json").read_text())
    data["stages"][1]["device_ids"] = [2, 7]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    p = run(tmp_path, "estimate", "--cluster", str(DATA / "golden-4xT4.toml"), "--plan", str(bad))
    assert p.returncode == 1 and "stages[1].device_ids" in p.stderr


def test_plan_without_a_feasible_layout_explains_why(tmp_path):
    p = run(tmp_path, "plan", "--model", "gpt3-175b", "--cluster", str(MIXED), "--global-batch", "8")
    assert p.returncode == 1
    assert "no feasible plan" in p.stderr and "GiB per device" in p.stderr
