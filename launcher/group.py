"""One way to start and stop a group of processes: training ranks, a profiler, a network bench (stdlib only).

Every group starts in a session of its own with a fresh tag in its environment (`MESHPLAN_JOB`),
plus any labels the caller adds (a training launch adds its run folder and generation:
`MESHPLAN_RUN`, `MESHPLAN_GENERATION`). The environment is inherited by every descendant and
survives re-parenting, so a process is found by its tag even after its parent died: torchrun
starts each rank in a session of its own, and a SIGKILLed runner leaves its agent and ranks under
pid 1. Stopping is always the same: SIGTERM, then SIGKILL, then /proc is read again until none of
them is alive (`stop`, `stop_labelled`) — a group is never reported gone while a member lives.
Whatever this process starts also carries its lifeline label (launcher/lifeline.py), so a SIGKILL
of the command takes its groups down too. `run` is the captured, timed form: on a timeout, or when the caller is interrupted (Ctrl-C, the
SIGTERM handler of an entry point raising SystemExit), the group is stopped before the exception
travels on, so nothing outlives the command that started it.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import signal
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

from launcher.lifeline import LIFELINE_TAG

JOB_TAG = "MESHPLAN_JOB"  # a fresh value per started group
RUN_TAG = "MESHPLAN_RUN"  # a training launch's run folder (resolved path): every generation of a run shares it
GEN_TAG = "MESHPLAN_GENERATION"  # the launch's generation (launcher/control.py begin_generation)
Process = subprocess.Popen  # what `start` returns (the group's leader): callers need not import subprocess
Finished = subprocess.CompletedProcess  # what `run` returns
_job_tags: dict[int, str] = {}  # group leader pid -> its tag, until stop / forget


def _live_processes() -> dict[int, int]:
    """pid -> parent pid of every live process (zombies excluded); empty off Linux."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else []:
        if not d.name.isdigit():
            continue
        try:
            state, ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[:2]  # after "(comm)"
        except (OSError, ValueError, IndexError):
            continue
        if state not in ("Z", "X"):  # dead, waiting to be reaped
            parent[int(d.name)] = int(ppid)
    return parent


def labelled(key: str, value: str) -> set[int]:
    """Live processes whose environment holds `key=value` (this process excluded)."""
    needle = f"{key}={value}".encode()
    found = set()
    for pid in _live_processes():
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.add(pid)
        except OSError:
            continue
    return found - {os.getpid()}


def job_processes(pid: int, tag: str | None = None) -> set[int]:
    """Live processes of the group started as `pid`: its descendants by parent links, and every
    process whose environment holds the group's tag (a rank after its agent died), never another
    group's process."""
    parent = _live_processes()
    tree, frontier = {pid}, {pid}
    while frontier:
        frontier = {c for c, p in parent.items() if p in frontier} - tree
        tree |= frontier
    return (labelled(JOB_TAG, tag) if tag else set()) | (tree - {pid})


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), or None once it is dead or a zombie: pids get reused."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _kill_until_gone(pids: dict[int, int | None], find, deadline_s: float) -> None:
    """SIGKILL `pids` (pid -> start time) and whatever `find()` returns until none is alive (at most deadline_s)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        left = find() | {p for p, t in pids.items() if t and start_time(p) == t}
        left -= {os.getpid()}
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, the group's process group AND every process of it; return once all are dead.

    The members are listed before anything is signalled (by parent links while the leader lives)
    and again by the group's tag after it died. A SIGKILLed process takes a moment to die (longer
    on a busy machine, a frozen one too), so the last step repeats until /proc shows none of them
    alive (at most 10 s)."""
    tag = _job_tags.pop(proc.pid, None)
    listed = {p: start_time(p) for p in job_processes(proc.pid, tag)}
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    _kill_until_gone(listed, lambda: job_processes(proc.pid, tag), 10.0)


def send(proc: subprocess.Popen | int, sig: int) -> None:
    """Send `sig` to the process group `proc` leads (a Popen from `start`, or the pid of a group
    leader this process holds no handle on, such as a job's runner read from its row): what a
    terminal's Ctrl-C does is `send(proc, signal.SIGINT)`. A group already gone is no error."""
    try:
        os.killpg(proc if isinstance(proc, int) else proc.pid, sig)
    except ProcessLookupError:
        pass


def stop_labelled(key: str, value: str, term_wait_s: float = 5.0) -> int:
    """Stop every process labelled `key=value` (whoever started it, alive parent or not): SIGTERM,
    up to `term_wait_s` to exit, then SIGKILL until /proc shows none. Returns how many there were."""
    listed = {p: start_time(p) for p in labelled(key, value)}
    for pid in listed:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + term_wait_s
    while time.monotonic() < deadline and any(t and start_time(p) == t for p, t in listed.items()):
        time.sleep(0.05)
    _kill_until_gone(listed, lambda: labelled(key, value), 10.0)
    return len(listed)


def start(
    cmd: list[str],
    log_path: Path | None = None,
    extra_env: dict[str, str] | None = None,
    pass_fds: tuple[int, ...] = (),
    cwd: str | Path | None = None,
    capture: bool = False,
    show_stderr: bool = False,
    detached: bool = False,
    drop_env: tuple[str, ...] = (),
    merge_stderr: bool = False,
    quiet: bool = False,
) -> subprocess.Popen:
    """Start `cmd` as a tagged group in its own session: output appended to `log_path`, or captured
    (`capture`: stdout, and stderr unless `show_stderr`; `merge_stderr`: stderr into stdout's pipe),
    or inherited (`quiet`: discarded instead). Wait for it, then call
    `forget` — or `stop` to take it down. `detached`: it outlives this command (no lifeline label,
    launcher/lifeline.py) — only what something else tracks, such as a job's runner. `drop_env`:
    names of this process's environment the group must not inherit (a Prefect server must not be
    told to talk to an API: it is one)."""
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    env = {**env, **(extra_env or {}), JOB_TAG: tag}
    if detached:
        env.pop(LIFELINE_TAG, None)
    env.setdefault("OMP_NUM_THREADS", "1")
    kw: dict = {"env": env, "start_new_session": True, "pass_fds": pass_fds, "cwd": cwd}
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("a") as log:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **kw)
    elif capture:
        err = subprocess.STDOUT if merge_stderr else None if show_stderr else subprocess.PIPE
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, **kw)
    else:
        out = subprocess.DEVNULL if quiet else None
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, **kw)
    _job_tags[proc.pid] = tag
    return proc


def _own_session(module: object) -> None:
    """Make `module` start its subprocesses in a session of their own (its `subprocess` name only)."""
    shim = types.SimpleNamespace(**vars(subprocess))
    shim.Popen = functools.partial(subprocess.Popen, start_new_session=True)
    module.subprocess = shim  # type: ignore[attr-defined]


class _SessionHook(importlib.abc.MetaPathFinder):
    """Patches one module as it is imported (so that a module costly to import is only paid for by
    a command that imports it anyway)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run(module)
            _own_session(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def own_sessions_for(module_name: str) -> None:
    """The processes a third-party module starts itself (through its `subprocess` name) start in a
    session of their own, as this module's groups do: a Ctrl-C at the terminal reaches this command
    alone, which then stops them in order. Applied now if the module is imported, else when it is."""
    if module_name in sys.modules:
        _own_session(sys.modules[module_name])
    elif not any(isinstance(f, _SessionHook) and f.name == module_name for f in sys.meta_path):
        sys.meta_path.insert(0, _SessionHook(module_name))


def forget(proc: subprocess.Popen) -> None:
    """Forget the tag of a group that exited by itself (stop forgets it when it stops the group)."""
    _job_tags.pop(proc.pid, None)


def run(
    cmd: list[str],
    timeout_s: float,
    what: str,
    extra_env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    show_stderr: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` as a group with its output captured; past `timeout_s` raises TimeoutError naming
    `what`, after stopping the group. Interrupted (KeyboardInterrupt, SystemExit), it stops the
    group too before the exception travels on."""
    proc = start(cmd, extra_env=extra_env, cwd=cwd, capture=True, show_stderr=show_stderr)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop(proc)
        proc.communicate()
        raise TimeoutError(f"{what} ran past {timeout_s:.0f} s and was stopped: {' '.join(cmd)}") from None
    except BaseException:
        stop(proc)
        raise
    forget(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err or "")
