"""Stage 1 on real Prefect flow runs: probing writes a snapshot, a re-run reuses it, files are recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.discover import discover_flow
from planner.errors import MeshplanError
from planner.specs.cluster import parse_cluster_toml
from storage.hardware import list_snapshots, load_snapshot

ROOT = Path(__file__).parents[2]
MIXED = ROOT / "examples" / "clusters" / "mixed-a100-v100-t4.toml"
BAD = 'name = "x"\n[[nodes]]\nname = "a"\ndevice = "A100-SXM4-40GB"\nnum_devices = 0\nintra_link = "nvlink3"\ninter_link = "eth-100g"\n'
SMALL = {"message_sizes": [1024, 65536, 1048576], "repeats": 2, "matmul_size": 256, "timeout_s": 180}


@pytest.mark.flow
@pytest.mark.dist
def test_probe_writes_a_snapshot_and_a_rerun_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_NODE_NAME", "flow-test-node")  # inherited by the torchrun ranks
    db = str(tmp_path / "m.duckdb")
    first = discover_flow(db, num_ranks=2, **SMALL)
    assert first.reused is False and first.source == "probe" and first.num_devices == 2
    snap = load_snapshot(db, first.fingerprint)
    assert snap.cluster.nodes[0].name == "flow-test-node" and snap.cluster.nodes[0].device == "cpu"
    assert snap.measurements.height > 0 and "send_recv" in snap.fits["op"].to_list()

    second = discover_flow(db, num_ranks=2, **SMALL)
    assert second == first.model_copy(update={"reused": True})

    third = discover_flow(db, num_ranks=2, refresh=True, **SMALL)
    assert third.reused is False and third.fingerprint == first.fingerprint
    assert list_snapshots(db).height == 1  # re-measuring replaced the snapshot, it did not add one


@pytest.mark.flow
def test_cluster_file_records_the_described_cluster(tmp_path):
    db = str(tmp_path / "m.duckdb")
    summary = discover_flow(db, cluster_file=str(MIXED))
    expected = parse_cluster_toml(MIXED.read_text())
    assert summary.source == "file" and summary.name == "mixed-a100-v100-t4"
    assert (summary.num_nodes, summary.num_devices) == (4, 16)
    snap = load_snapshot(db, summary.fingerprint)
    assert snap.cluster == expected and snap.source == "file"
    assert sorted(set(snap.devices["kind"])) == ["A100-SXM4-40GB", "T4", "V100-SXM2-32GB"]
    assert discover_flow(db, cluster_file=str(MIXED)).reused is True


@pytest.mark.flow
def test_snapshot_file_from_another_launch_is_ingested(tmp_path):
    db = str(tmp_path / "m.duckdb")
    summary = discover_flow(db, snapshot_file=str(ROOT / "tests" / "data" / "netbench_cpu_2ranks.json"))
    assert summary.source == "probe" and summary.name == "discovered-testnode" and summary.num_devices == 2
    assert load_snapshot(db, summary.fingerprint).measurements.height > 0
    with pytest.raises(MeshplanError, match="snapshot_file"):
        discover_flow(db, snapshot_file=str(tmp_path / "missing.json"))


@pytest.mark.flow
def test_bad_cluster_file_raises_an_error_naming_the_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD)
    with pytest.raises(MeshplanError) as err:
        discover_flow(str(tmp_path / "m.duckdb"), cluster_file=str(bad))
    assert "nodes.0.num_devices" in err.value.field


def test_cli_bad_cluster_file_exits_1_with_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD)
    cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp_path / "state"), "discover", "--cluster", str(bad)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "nodes.0.num_devices" in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout


def test_cli_records_a_cluster_file_and_prints_json(tmp_path):
    import json

    cmd = [
        sys.executable,
        "-m",
        "cli",
        "--state-dir",
        str(tmp_path / "state"),
        "discover",
        "--cluster",
        str(MIXED),
        "--json",
    ]
    from prefect.settings import PREFECT_API_URL

    # Point the CLI at the session's test server instead of starting its own (10-60 s on a busy machine).
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["source"] == "file" and out["reused"] is False and out["num_devices"] == 16
    assert out["cluster"]["name"] == "mixed-a100-v100-t4" and len(out["devices"]) == 16
    assert (tmp_path / "state" / "meshplan.duckdb").is_file()
