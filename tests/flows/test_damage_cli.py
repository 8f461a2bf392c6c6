"""Damage is named, never a traceback: a damaged DuckDB file, a dropped table, a write without --write.

On a real DuckDB file: each damaged case answers in one line (the file, what is wrong, `meshplan db
--restore`), exits 1, and the backup brings the queue back with nothing deleted. A few commands run
as real CLI processes; the rest run `cli.main.main` in this process (the same code, no interpreter
start per command).
"""

from pathlib import Path
from types import SimpleNamespace

import pytest

from planner.specs.model import get_model
from storage import db
from storage.jobs import submit_job
from tests.support.cli import meshplan, meshplan_main

MIXED = "examples/clusters/mixed-a100-v100-t4.toml"


def _one_line_error(out, *expected: str) -> str:
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr + out.stdout
    lines = [ln for ln in out.stderr.splitlines() if ln.strip() and "EventsWorker" not in ln]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _in_process(capsys, monkeypatch, tmp_path: Path, *args: str) -> SimpleNamespace:
    """`meshplan --state-dir tmp_path ARGS` through cli.main.main in this process (tests/support/cli)."""
    rc, out, err = meshplan_main(monkeypatch, capsys, "--state-dir", str(tmp_path), *args)
    return SimpleNamespace(returncode=rc, stdout=out, stderr=err)


def _queue(tmp_path: Path) -> Path:
    path = tmp_path / "meshplan.duckdb"
    submit_job(path, get_model("tiny"), 8, 4, job_id="ja")
    return path


def _job_ids(path: Path) -> list[str]:
    return db.query(path, "SELECT job_id FROM jobs ORDER BY job_id", read_only=True)["job_id"].to_list()


def test_a_damaged_store_is_named_by_every_command_and_the_backup_restores_it(tmp_path, capsys, monkeypatch):
    path = _queue(tmp_path)
    out = meshplan(tmp_path, "db", "--write", "UPDATE jobs SET priority = 5")  # backs the file up first
    assert out.returncode == 0 and "backed up" in out.stdout, out.stderr
    garbage = b"\x13\x37" * 40_000
    path.write_bytes(garbage)

    expected = (str(path), "is damaged", "not a DuckDB database", "db --restore")
    _one_line_error(meshplan(tmp_path, "jobs"), *expected)
    for args in (
        ["plan", "--model", "tiny", "--cluster", MIXED],
        ["estimate", "--plan", "tests/data/plan_v1.json", "--cluster", MIXED],
        ["db"],
        ["db", "SELECT * FROM jobs"],
        ["submit", "--model", "tiny", "--global-batch", "8", "--iterations", "2"],
    ):
        _one_line_error(_in_process(capsys, monkeypatch, tmp_path, *args), *expected)

    out = meshplan(tmp_path, "db", "--restore")
    assert out.returncode == 0, out.stderr
    backup = db.backups(path)[0]
    assert f"from backup {backup}" in out.stdout and "before-db-write" in backup.name
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("meshplan.duckdb.replaced-")]
    assert len(aside) == 1 and aside[0].read_bytes() == garbage  # the damaged file kept, not deleted
    assert _job_ids(path) == ["ja"]  # the queue is back


def test_a_truncated_store_is_named_with_the_way_out(tmp_path, capsys, monkeypatch):
    path = _queue(tmp_path)
    path.write_bytes(path.read_bytes()[:20_000])  # cut inside the catalog (DuckDB reads blocks lazily)
    db._migrated.clear()
    with pytest.raises(db.StoreDamagedError, match="truncated") as err:
        _job_ids(path)
    assert str(path) in str(err.value) and "no backup exists; move it away" in str(err.value)
    _one_line_error(_in_process(capsys, monkeypatch, tmp_path, "jobs"), str(path), "truncated", "move it away")


def test_db_is_read_only_unless_write_and_a_dropped_table_is_named(tmp_path, capsys, monkeypatch):
    path = _queue(tmp_path)
    cli = lambda *args: _in_process(capsys, monkeypatch, tmp_path, *args)  # noqa: E731
    _one_line_error(cli("db", "DROP TABLE jobs"), "DROP TABLE jobs", "add --write")
    assert _job_ids(path) == ["ja"]  # not dropped

    out = cli("db", "--write", "DROP TABLE jobs")
    assert out.returncode == 0, out.stderr
    _one_line_error(meshplan(tmp_path, "jobs"), str(path), "table jobs is missing", "db --restore")

    out = cli("db", "--restore")
    assert out.returncode == 0 and "restored" in out.stdout, out.stderr
    assert _job_ids(path) == ["ja"]


def test_migrations_back_up_an_existing_store_only_when_they_apply(tmp_path):
    path = tmp_path / "m.duckdb"
    with db.connect(path):
        pass
    assert db.backups(path) == []  # a new store has nothing to lose
    db._migrated.clear()
    with db.connect(path):
        pass
    assert db.backups(path) == []  # nothing to apply: no copy
    with db.connect(path) as con:  # the store as a release before migration 16 left it
        con.execute("DELETE FROM schema_version WHERE version = 16")
        con.execute("DROP TABLE run_events")
    db._migrated.clear()
    with db.connect(path) as con:
        assert con.execute("SELECT count(*) FROM schema_version WHERE version = 16").fetchall() == [(1,)]
    (copy,) = db.backups(path)
    assert "before-migration" in copy.name
    with db.connect(copy, read_only=True) as con:  # the copy is the store before the migration
        assert con.execute("SELECT count(*) FROM schema_version WHERE version = 16").fetchall() == [(0,)]
