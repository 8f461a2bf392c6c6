"""CLI conventions end to end (subprocess, as a user runs them): --model dimensions or a model TOML,
`meshplan export`, `meshplan compare`, --json numbers with units, tables that fit 80 columns in a pipe."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
MIXED = ROOT / "examples" / "clusters" / "mixed-a100-v100-t4.toml"
MODEL_TOML = ROOT / "examples" / "models" / "llama-7b-like.toml"
CUSTOM = ["--model", "custom", "--layers", "8", "--hidden", "512", "--heads", "8"]


def run(tmp_path, *args, columns=None):
    cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp_path / "state"), *args]
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["OMP_NUM_THREADS"] = "1"
    if columns:
        env["COLUMNS"] = str(columns)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


def _plan(tmp_path, out, *model):
    p = run(
        tmp_path,
        "plan",
        *model,
        "--cluster",
        str(MIXED),
        "--global-batch",
        "16",
        "--budget",
        "2",
        "--out",
        out.name,  # cwd is tmp_path: a short path in the output
    )
    assert p.returncode == 0, p.stderr
    return p


def test_custom_dimensions_plan_then_estimate_needs_the_same_model(tmp_path):
    out = tmp_path / "custom.json"
    p = _plan(tmp_path, out, *CUSTOM)
    for line in p.stdout.splitlines():  # a pipe: rich's width is 80
        assert len(line) <= 80, line
    assert "step" in p.stdout and "×meg" in p.stdout and "…" not in p.stdout  # every cell whole
    plan = json.loads(out.read_text())
    assert plan["model"] == "custom" and plan["stages"][-1]["layer_end"] == 8
    missing = run(tmp_path, "estimate", "--plan", str(out), "--cluster", str(MIXED))
    assert missing.returncode == 1 and "custom model" in missing.stderr and "Traceback" not in missing.stderr
    other = run(tmp_path, "estimate", "--plan", str(out), "--cluster", str(MIXED), *CUSTOM[:-1], "16")
    assert other.returncode == 1 and "not the plan's model" in other.stderr
    ok = run(tmp_path, "estimate", "--plan", str(out), "--cluster", str(MIXED), *CUSTOM, "--json")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["step_time_s"] > 0 and all(isinstance(v, int) for v in doc["peak_memory_bytes"])


def test_bad_dimensions_name_the_option(tmp_path):
    p = run(tmp_path, "plan", "--model", "custom", "--layers", "8", "--hidden", "500", "--heads", "8")
    assert p.returncode == 1 and p.stderr.startswith("error: --hidden=500") and "Traceback" not in p.stderr
    p = run(tmp_path, "plan", "--model", "custom", "--layers", "0", "--hidden", "512", "--heads", "8")
    assert p.returncode == 1 and p.stderr.startswith("error: --layers=0")
    p = run(tmp_path, "plan", "--model", "custom", "--hidden", "512", "--heads", "8")
    assert p.returncode == 1 and p.stderr.startswith("error: --layers=None")
    p = run(tmp_path, "plan", "--model", "gpt2-small", "--layers", "8")
    assert p.returncode == 1 and "--model custom" in p.stderr


def test_model_toml_export_and_compare(tmp_path):
    out = tmp_path / "llama.json"
    _plan(tmp_path, out, "--model", str(MODEL_TOML))
    assert json.loads(out.read_text())["model"] == "llama-7b-like"
    meg = run(tmp_path, "export", "--format", "megatron", str(out), "--model", str(MODEL_TOML))
    assert meg.returncode == 0, meg.stderr
    assert "--num-layers 32" in meg.stdout and "--num-query-groups 8" in meg.stdout and "--swiglu" in meg.stdout
    tt = run(tmp_path, "export", "--format", "torchtitan", str(out))
    assert tt.returncode == 0 and "[parallelism]" in tt.stdout and "pipeline_parallel_degree" in tt.stdout
    bad = run(tmp_path, "export", "--format", "deepspeed", str(out))
    assert bad.returncode == 1 and "--format" in bad.stderr
    # compare prices a plan against the estimate of each: same numbers as `meshplan estimate`
    other = tmp_path / "other.json"
    _plan(tmp_path, other, "--model", str(MODEL_TOML))
    cmp_ = run(tmp_path, "compare", str(out), str(other), "--cluster", str(MIXED), "--model", str(MODEL_TOML), "--json")
    assert cmp_.returncode == 0, cmp_.stderr
    doc = json.loads(cmp_.stdout)
    est = run(tmp_path, "estimate", "--plan", str(out), "--cluster", str(MIXED), "--model", str(MODEL_TOML), "--json")
    assert doc["plans"][0]["step_time_s"] == json.loads(est.stdout)["step_time_s"]
    assert doc["speedup_b_over_a"] == doc["plans"][0]["step_time_s"] / doc["plans"][1]["step_time_s"]
    table = run(tmp_path, "compare", str(out), str(other), "--cluster", str(MIXED), "--model", str(MODEL_TOML))
    assert table.returncode == 0 and "step ms" in table.stdout
    assert all(len(line) <= 80 for line in table.stdout.splitlines())


def test_plan_json_ranking_has_numbers_with_units_not_display_strings(tmp_path):
    p = run(
        tmp_path,
        "plan",
        "--model",
        "gpt2-small",
        "--cluster",
        str(MIXED),
        "--global-batch",
        "16",
        "--budget",
        "2",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    for row in json.loads(p.stdout)["ranking"]:
        assert "memory" not in row and "step_s" not in row
        assert isinstance(row["peak_memory_bytes"], int) and isinstance(row["memory_capacity_bytes"], int)
        assert row["step_time_s"] > 0
