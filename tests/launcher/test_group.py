"""One way to stop a process group (launcher/group.py): nothing it started outlives a timeout or a SIGTERM.

A grandchild in a session of its own (as torchrun starts each rank) is out of reach of a
process-group kill; the group's tag in its environment still finds it. And `meshplan profile`,
SIGTERMed while its profiler subprocess measures, takes `worker.profile_layers` down with it
(before, the profiler kept measuring under pid 1 for over ten minutes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from launcher import group
from tests.support import procs

# a child that starts a grandchild in a session of its own, then waits: a process-group kill misses it
SPAWNER = "import os, time; os.fork() or os.setsid(); time.sleep(300)"
# a child that forks a grandchild in its own process group, then waits: a process-group signal reaches both
FORKER = "import os, time; os.fork(); time.sleep(300)"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_timed_out_group_is_stopped_whole_its_detached_grandchild_included():
    mark = uuid.uuid4().hex
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="spawner ran past 2 s and was stopped"):
        group.run([sys.executable, "-c", SPAWNER], 2.0, "spawner", {"MESHPLAN_TEST_MARK": mark})
    assert not group.labelled("MESHPLAN_TEST_MARK", mark), "nothing of the group is alive"
    assert time.monotonic() - t0 < 30


def test_stop_labelled_finds_processes_whose_parent_is_gone():
    mark = uuid.uuid4().hex
    proc = group.start([sys.executable, "-c", SPAWNER], extra_env={"MESHPLAN_TEST_MARK": mark})
    try:
        deadline = time.monotonic() + 30
        while len(group.labelled("MESHPLAN_TEST_MARK", mark)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # the grandchild is re-parented, as a SIGKILLed runner's ranks are
        proc.wait(timeout=10)
        assert len(group.labelled("MESHPLAN_TEST_MARK", mark)) == 1
        assert group.stop_labelled("MESHPLAN_TEST_MARK", mark) == 1
        assert not group.labelled("MESHPLAN_TEST_MARK", mark)
    finally:
        group.forget(proc)
        for pid in group.labelled("MESHPLAN_TEST_MARK", mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.flow
def test_sigterm_to_meshplan_profile_leaves_no_profiler_alive(tmp_path):
    mark = uuid.uuid4().hex
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"), OMP_NUM_THREADS="1", MESHPLAN_TEST_MARK=mark)
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp_path), "profile", "--model", "gpt2-small"]
    cli = procs.start(cmd, env=env, capture=True)  # stderr read below; stdout (a few lines) unread

    def profilers() -> set[int]:
        return {p for p in group.labelled("MESHPLAN_TEST_MARK", mark) if "worker.profile_layers" in _cmdline(p)}

    try:
        deadline = time.monotonic() + 240
        while not {p for p in profilers() if "--print-device" not in _cmdline(p)} and time.monotonic() < deadline:
            assert cli.poll() is None, cli.stderr.read() if cli.stderr else ""
            time.sleep(0.2)
        assert profilers(), "the profiler subprocess started"
        cli.send_signal(signal.SIGTERM)
        cli.wait(timeout=60)
        assert not profilers(), "SIGTERM to meshplan profile stopped its profiler too"
    finally:
        for pid in group.labelled("MESHPLAN_TEST_MARK", mark) | ({cli.pid} if cli.poll() is None else set()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        cli.wait(timeout=10)


def test_a_group_can_be_started_without_names_of_this_environment(monkeypatch):
    """`drop_env`: a Prefect server started by `meshplan ui` must not inherit PREFECT_API_URL (it is the API)."""
    monkeypatch.setenv("MESHPLAN_TEST_DROPPED", "x")
    monkeypatch.setenv("MESHPLAN_TEST_KEPT", "y")
    code = "import os; print(os.environ.get('MESHPLAN_TEST_DROPPED'), os.environ.get('MESHPLAN_TEST_KEPT'))"
    proc = group.start([sys.executable, "-c", code], capture=True, drop_env=("MESHPLAN_TEST_DROPPED",))
    out, _ = proc.communicate(timeout=30)
    group.forget(proc)
    assert out.split() == ["None", "y"]


def test_a_module_imported_later_starts_its_processes_in_a_session_of_their_own(tmp_path, monkeypatch):
    """`own_sessions_for` (Prefect's temporary server, flows/server.py): the module's `subprocess`
    name's Popen puts every child in a new session, applied when the module is first imported."""
    (tmp_path / "meshplan_late_mod.py").write_text(
        "import subprocess, sys\n"
        "def child():\n"
        "    return subprocess.Popen([sys.executable, '-c', 'import os; print(os.getsid(0) == os.getpid())'],"
        " stdout=subprocess.PIPE, text=True)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    group.own_sessions_for("meshplan_late_mod")
    try:
        import meshplan_late_mod

        assert meshplan_late_mod.child().communicate(timeout=30)[0].strip() == "True"
        assert meshplan_late_mod.subprocess is not subprocess  # the module's name only
    finally:
        sys.modules.pop("meshplan_late_mod", None)


def test_output_is_merged_discarded_or_captured_and_a_group_is_signalled_whole():
    """`merge_stderr` puts stderr in stdout's pipe, `quiet` discards both, and `send` signals the
    whole process group (a terminal's Ctrl-C), by Popen or by the leader's pid."""
    code = "import sys; print('out', flush=True); print('err', file=sys.stderr, flush=True)"
    merged = group.start([sys.executable, "-c", code], capture=True, merge_stderr=True)
    assert merged.communicate(timeout=30) == ("out\nerr\n", None)
    group.forget(merged)
    quiet = group.start([sys.executable, "-c", code], quiet=True)
    assert quiet.wait(timeout=30) == 0 and quiet.stdout is None and quiet.stderr is None
    group.forget(quiet)
    mark = uuid.uuid4().hex
    for how in ("proc", "pid"):
        proc = group.start([sys.executable, "-c", FORKER],
                           extra_env={"MESHPLAN_TEST_MARK": mark})  # fmt: skip
        deadline = time.monotonic() + 30
        while len(group.labelled("MESHPLAN_TEST_MARK", mark)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        group.send(proc if how == "proc" else proc.pid, signal.SIGINT)  # child and grandchild: one group
        assert proc.wait(timeout=30) != 0
        deadline = time.monotonic() + 30
        while group.labelled("MESHPLAN_TEST_MARK", mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not group.labelled("MESHPLAN_TEST_MARK", mark), how
        group.forget(proc)
    group.send(proc.pid, signal.SIGINT)  # a group already gone: no error
