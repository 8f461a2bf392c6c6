"""The local probe: identity from the OS, speeds measured (positive, plausible), no Prefect or DuckDB inside."""

import subprocess
import sys

import pytest

from worker import probe


def test_node_name_is_the_hostname_unless_overridden(monkeypatch):
    import socket

    monkeypatch.delenv(probe.NODE_NAME_ENV, raising=False)
    assert probe.node_name() == socket.gethostname()
    monkeypatch.setenv(probe.NODE_NAME_ENV, "sim-a")
    assert probe.node_name() == "sim-a" and probe.host_info()["node"] == "sim-a"


def test_host_info_reads_cores_memory_and_cpu_model():
    info = probe.host_info()
    assert info["num_cores"] >= 1 and info["memory_bytes"] > 2**28 and info["cpu_model"]


def test_cpu_matmul_and_copy_are_measured():
    flop, dtype, size = probe.measure_matmul_flop_per_s("cpu", size=128, repeats=3)
    assert dtype == "fp32" and size == 128
    assert 1e7 < flop < 1e13  # one core: between 10 MFLOP/s and 10 TFLOP/s
    bw = probe.measure_memory_bandwidth_bytes_per_s("cpu", nbytes=8 << 20, repeats=3)
    assert 1e7 < bw < 1e12


def test_median_time_uses_the_median_of_repeats():
    import itertools
    import time

    delays = itertools.cycle([0.0, 0.02, 0.0])
    t = probe.median_time_s(lambda: time.sleep(next(delays)), "cpu", repeats=3, warmup=0)
    assert t < 0.015


@pytest.mark.parametrize("module", ["worker.probe", "worker.netbench"])
def test_worker_modules_import_no_prefect_or_duckdb(module):
    code = f"import sys, {module}; print(sorted({{m.split('.')[0] for m in sys.modules}} & {{'prefect', 'duckdb'}}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
