"""bench/gpu_check.py --device cpu: discovery, a profile, a short run and its calibration (refused: one run), on CPU ranks,
the path a CUDA machine runs (small: one plan, two steps)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.dist
def test_gpu_check_runs_its_whole_path_on_cpu_ranks(tmp_path):
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "bench/gpu_check.py", "--device", "cpu", "--plans", "1", "--steps", "2"]
    # its five commands report to the test session's Prefect server: no temporary server started per command
    cmd += ["--prefect-api-url", PREFECT_API_URL.value()]
    cmd += ["--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "out")]
    # the smallest measurements that still run every stage (the bench's defaults measure properly)
    for kv in ("discover.repeats=1", "discover.message_sizes=[1024, 65536]", "discover.matmul_size=128",
               "profile.mbs=[1, 2]", "profile.tp=[1]", "profile.recompute=[false]", "profile.repeats=2",
               "profile.min_block_s=0.01"):  # fmt: skip
        cmd += ["--set", kv]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    (row,) = json.loads((tmp_path / "out/gpu_check_cpu.json").read_text())
    assert row["step_s"] > 0 and row["peak_gib"] > 0 and row["catalog_s"] > 0 and row["predicted_s"] > 0
    # one run is too few to fit on (issue #42: calibration that cannot hurt): refused, nothing stored, said
    assert row["calibrated_figures"] == "uncalibrated: cpu/meshplan"
    assert row["calibrated_s"] == row["predicted_s"]
    report = (tmp_path / "out/gpu_check_cpu.md").read_text()
    assert "| catalog s | profiled s | calibrated s | measured s |" in report
    assert "calibration refused:" in report and "at least 3" in report
