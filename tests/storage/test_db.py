"""The DuckDB store: migrations apply once and re-run safely; a locked file is waited for."""

import sys
import time

import pytest

from launcher import group
from storage import db
from tests.support import procs


def test_migrations_apply_once_and_rerun_safely(tmp_path):
    path = tmp_path / "m.duckdb"
    with db.connect(path) as con:
        first = con.execute("SELECT count(*) FROM schema_version").fetchall()[0][0]
        assert first == len(db.migrations())
        assert db.migrate(con) == 0  # a second run applies nothing
    # a fresh process-level cache: connect again, still one row per migration
    db._migrated.clear()
    with db.connect(path) as con:
        rows = con.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
    assert [r[0] for r in rows] == [m[0] for m in db.migrations()]
    assert db.schema_version(path) == max(m[0] for m in db.migrations())


def test_migration_versions_are_unique_and_named():
    versions = [m[0] for m in db.migrations()]
    assert len(versions) == len(set(versions)) and versions[0] == 1


def _hold_lock(path, seconds: float) -> group.Process:
    """Another process that holds the DuckDB file open (and so locked) for `seconds`."""
    code = (
        "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('ready', flush=True); "
        "time.sleep(float(sys.argv[2])); con.close()"
    )
    p = procs.start([sys.executable, "-c", code, str(path), str(seconds)], capture=True, show_stderr=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_locked_file_is_waited_for_then_opened(tmp_path):
    path = tmp_path / "l.duckdb"
    with db.connect(path):
        pass
    p = _hold_lock(path, 1.5)
    t0 = time.monotonic()
    with db.connect(path, wait_s=30) as con:
        assert con.execute("SELECT 1").fetchall() == [(1,)]
    assert time.monotonic() - t0 > 0.5  # it really waited for the other process
    p.wait()


def test_lock_held_too_long_is_a_clear_error(tmp_path):
    path = tmp_path / "l2.duckdb"
    p = _hold_lock(path, 4)
    try:
        with pytest.raises(db.StoreLockedError, match="locked"):
            with db.connect(path, wait_s=0.3):
                pass
    finally:
        p.wait()
