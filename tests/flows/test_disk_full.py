"""A full disk is one line naming the folder and the room needed (issue #36), and nothing is left
half-written: the state folder on a real 20 MiB tmpfs (skipped where mount is not allowed)."""

from __future__ import annotations

import os
import subprocess

import duckdb
import pytest

from cli.app import disk_full_line
from tests.support.cli import meshplan

pytestmark = pytest.mark.flow
CLUSTER = "tests/data/cpu-2ranks.toml"


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt, leave: int) -> None:
    free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
    with open(mnt / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, free - leave))


def _one_line(p: subprocess.CompletedProcess) -> str:
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 1 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


def test_plan_submit_and_train_on_a_full_state_folder_say_where_and_how_much_and_the_store_still_opens(small_disk):
    state = small_disk / "state"
    ok = meshplan(state, "plan", "--model", "tiny", "--cluster", CLUSTER, "--out", str(small_disk / "p.json"))
    assert ok.returncode == 0, ok.stderr
    assert meshplan(state, "submit", "--model", "tiny", "--global-batch", "8", "--iterations", "5").returncode == 0
    _fill(small_disk, 512 << 10)
    for args, need in (
        (("plan", "--model", "tiny", "--cluster", CLUSTER, "--out", str(small_disk / "q.json")), "8 MiB"),
        (("submit", "--model", "tiny", "--global-batch", "8", "--iterations", "5"), "8 MiB"),
        (("train", "--plan", str(small_disk / "p.json"), "--steps", "2"), "64 MiB"),
    ):
        line = _one_line(meshplan(state, *args))
        assert str(state) in line and "MiB free" in line and f"at least {need}" in line, line
    assert not (small_disk / "q.json").exists() and not (state / "runs").exists()
    with duckdb.connect(str(state / "meshplan.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM jobs").fetchall() == [(1,)]
        assert con.execute("SELECT count(*) FROM runs WHERE status = 'running'").fetchall() == [(0,)]
    listed = meshplan(state, "jobs")
    assert listed.returncode == 0 and "queued" in listed.stdout, listed.stderr


def test_a_disk_filling_mid_command_is_one_line_even_under_a_wrapping_error(small_disk):
    _fill(small_disk, 0)
    try:
        try:
            (small_disk / "out.bin").write_bytes(b"x" * (1 << 20))
        except OSError as exc:
            raise RuntimeError("cannot rollback - no transaction is active") from exc
    except RuntimeError as wrapped:
        line = disk_full_line(wrapped)
    assert line is not None and line.startswith("disk full") and "at least 64 MiB" in line, line
    assert disk_full_line(RuntimeError("other")) is None
