"""Hardware snapshots in a real DuckDB file: round trip, idempotent re-save, re-runnable migrations."""

import json
from pathlib import Path

import pytest

from planner.measure.discovery import cluster_from_snapshot, snapshot_fingerprint
from planner.specs.cluster import parse_cluster_toml
from storage import db
from storage.hardware import find_snapshot, list_snapshots, load_snapshot, save_snapshot

ROOT = Path(__file__).parents[2]
SNAPSHOT = json.loads((ROOT / "tests" / "data" / "netbench_cpu_2ranks.json").read_text())


def _save_probe(path):
    fp = snapshot_fingerprint(SNAPSHOT)
    save_snapshot(path, fp, cluster_from_snapshot(SNAPSHOT), "probe", SNAPSHOT)
    return fp


def _counts(path) -> dict[str, int]:
    tables = ["hardware_snapshots", "hardware_devices", "hardware_links", "hardware_measurements", "hardware_fits"]
    with db.connect(path) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in tables}


def test_probe_snapshot_round_trips(tmp_path):
    path = tmp_path / "hw.duckdb"
    fp = _save_probe(path)
    snap = load_snapshot(path, fp)
    assert snap.cluster == cluster_from_snapshot(SNAPSHOT)
    assert snap.source == "probe" and snap.fingerprint == fp
    assert snap.devices.height == 2 and set(snap.devices["kind"]) == {"cpu"}
    assert snap.devices["measured_flop_per_s"].min() > 0
    assert snap.measurements.height == len(SNAPSHOT["measurements"])
    assert set(snap.fits["op"]) == {"send_recv", "all_reduce", "all_gather", "reduce_scatter"}
    assert set(snap.links["link_class"]) == {"intra-node", "inter-node"}


def test_resaving_a_snapshot_does_not_duplicate_rows(tmp_path):
    path = tmp_path / "hw.duckdb"
    _save_probe(path)
    before = _counts(path)
    _save_probe(path)
    _save_probe(path)
    assert _counts(path) == before
    assert before["hardware_snapshots"] == 1 and before["hardware_measurements"] == len(SNAPSHOT["measurements"])


def test_resave_with_fewer_measurements_replaces_the_old_ones(tmp_path):
    path = tmp_path / "hw.duckdb"
    fp = _save_probe(path)
    smaller = {**SNAPSHOT, "measurements": [m for m in SNAPSHOT["measurements"] if m["op"] == "send_recv"]}
    save_snapshot(path, fp, cluster_from_snapshot(smaller), "probe", smaller)
    snap = load_snapshot(path, fp)
    assert set(snap.measurements["op"]) == {"send_recv"} and set(snap.fits["op"]) == {"send_recv"}


def test_file_cluster_is_recorded_with_source_file(tmp_path):
    path = tmp_path / "hw.duckdb"
    cluster = parse_cluster_toml((ROOT / "examples" / "clusters" / "mixed-a100-v100-t4.toml").read_text())
    save_snapshot(path, "file-" + cluster.fingerprint(), cluster, "file")
    snap = load_snapshot(path, "file-" + cluster.fingerprint())
    assert snap.cluster == cluster and snap.source == "file"
    assert snap.devices.height == 16 and snap.devices["measured_flop_per_s"].null_count() == 16
    assert snap.measurements.height == 0


def test_find_and_list_snapshots(tmp_path):
    path = tmp_path / "hw.duckdb"
    assert find_snapshot(path, "hw-nothing") is None  # no file yet: nothing found, nothing created
    fp = _save_probe(path)
    assert find_snapshot(path, fp).fingerprint == fp
    assert find_snapshot(path, "hw-other") is None
    listing = list_snapshots(path)
    assert listing["fingerprint"].to_list() == [fp] and listing["num_devices"].to_list() == [2]
    with pytest.raises(KeyError, match=fp):
        load_snapshot(path, "hw-other")


def test_hardware_migration_reruns_safely(tmp_path):
    path = tmp_path / "hw.duckdb"
    _save_probe(path)
    db._migrated.clear()
    with db.connect(path) as con:
        assert db.migrate(con) == 0
        versions = [v for (v,) in con.execute("SELECT version FROM schema_version").fetchall()]
        # Re-running the SQL itself is harmless too (CREATE ... IF NOT EXISTS).
        sql = next(s for v, _, s in db.migrations() if v == 2)
        con.execute(sql)
    assert 2 in versions and versions.count(2) == 1
    assert _counts(path)["hardware_snapshots"] == 1


def test_storage_hardware_imports_no_prefect_or_torch():
    import subprocess
    import sys

    code = "import sys, storage.hardware; print(sorted({m.split('.')[0] for m in sys.modules} & {'prefect', 'torch'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
