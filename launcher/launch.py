"""Build and run the torchrun command for worker.train (stdlib only: the flow process imports it).

One node: `python -m worker.agent ARGS` (worker/agent.py) — torchrun with a static
rendezvous whose store listens on 127.0.0.1 only, on a port this launch already holds (so concurrent
runs never collide), and gloo/NCCL on the loopback interface. Not `--standalone`: its store (like any
torchrun store, whatever host it is given) listens on every interface ([::]), unauthenticated.
Several nodes: torchrun's static rendezvous (`--nnodes N --node-rank R --master-addr HOST
--master-port PORT`), because it numbers global ranks node-major (node_rank * nproc + local_rank)
— deterministic, which the plan needs since its device ids are global ranks. Run the same command
on every node with its own --node-rank; the run folder must be on storage every node shares.
Several nodes all on this machine (`Launch.local_nodes`: a CPU "cluster" of simulated nodes, a
job whose allocation spans them): `run_local_nodes` starts one runner per node here, each
`python -m worker.agent --nodes N --node-rank R ...`, node 0's store on a loopback socket this
process bound and handed to it, and waits for all of them; when one node's runner fails the
others are taken down at once (their ranks would only wait for it), and `NodeFailed` names it.

The launcher runs in its own session/process group with an outer timeout; on timeout or when the
caller is interrupted the whole group (agent and ranks) is killed, so no rank outlives its run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from planner.errors import MeshplanError
from planner.specs.faults import NO_FAULTS, FaultSpec


@dataclass(frozen=True)
class Launch:
    plan_path: str
    run_dir: str
    run_id: str
    steps: int
    nproc_per_node: int = 2
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = "127.0.0.1:29500"
    max_restarts: int = 0  # safe with gloo thanks to the per-attempt store prefix in worker.train
    model: str = ""
    model_json: str = ""  # a ModelSpec JSON file instead of a preset (a dry run's scaled-down model)
    data: str = "text"
    lr: float = 3e-3
    optimizer: str = "adamw"
    seed: int = 0
    checkpoint_every: int = 0
    resume: str = "auto"
    collective_timeout_s: float = 300.0
    faults: FaultSpec = NO_FAULTS  # fault injection, passed whole as `--faults JSON` (worker/faults.py)
    control_from_version: int = 0
    local_nodes: bool = False  # every node's runner on this machine, loopback master (run_local_nodes)


class NodeFailed(RuntimeError):
    """One node's runner of a several-node launch on this machine exited non-zero (or was killed)."""

    def __init__(self, node_rank: int, returncode: int, log_path: Path) -> None:
        self.node_rank, self.returncode, self.log_path = node_rank, returncode, str(log_path)
        super().__init__(f"node {node_rank}'s torchrun exited {returncode} ({log_path}):\n{log_tail(log_path)}")

    def __reduce__(self):  # Prefect pickles a task's exception with its arguments
        return (NodeFailed, (self.node_rank, self.returncode, Path(self.log_path)))


def torchrun_command(
    launch: Launch, python: str = sys.executable, local_node: tuple[int, int, int | None] | None = None
) -> list[str]:
    """The node's command; `local_node` = (node_rank, master port, listening fd or None) for one of
    several nodes on this machine (`launch.local_nodes`, run_local_nodes)."""
    runner = "worker.agent" if launch.nnodes == 1 or local_node else "torch.distributed.run"
    cmd = [python, "-m", runner]
    if local_node is not None:
        node_rank, port, fd = local_node
        cmd += ["--nodes", str(launch.nnodes), "--node-rank", str(node_rank), "--master-port", str(port)]
        cmd += ["--listen-fd", str(fd)] if fd is not None else []
        cmd += ["--"]
    cmd += ["--nproc-per-node", str(launch.nproc_per_node), "--max-restarts", str(launch.max_restarts)]
    if launch.nnodes > 1 and local_node is None:
        host, sep, port = launch.rdzv_endpoint.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise MeshplanError("--rdzv-endpoint", launch.rdzv_endpoint, "write it as HOST:PORT, e.g. 10.0.0.1:29500")
        if not 0 <= launch.node_rank < launch.nnodes:
            raise MeshplanError("--node-rank", launch.node_rank, f"must be in 0..{launch.nnodes - 1}")
        cmd += [
            "--nnodes",
            str(launch.nnodes),
            "--node-rank",
            str(launch.node_rank),
            "--master-addr",
            host,
            "--master-port",
            port,
        ]
    cmd += [
        "-m",
        "worker.train",
        "--plan",
        launch.plan_path,
        "--run-dir",
        launch.run_dir,
        "--run-id",
        launch.run_id,
        "--steps",
        str(launch.steps),
        "--data",
        launch.data,
        "--lr",
        repr(launch.lr),
        "--optimizer",
        launch.optimizer,
        "--seed",
        str(launch.seed),
        "--checkpoint-every",
        str(launch.checkpoint_every),
        "--resume",
        launch.resume,
        "--timeout-s",
        repr(launch.collective_timeout_s),
    ]
    if launch.model:
        cmd += ["--model", launch.model]
    if launch.model_json:
        cmd += ["--model-json", launch.model_json]
    if launch.faults.any_on:
        cmd += ["--faults", launch.faults.to_arg()]
    if launch.control_from_version:
        cmd += ["--control-from-version", str(launch.control_from_version)]
    return cmd


LOOPBACK = "127.0.0.1"
JOB_TAG = "MESHPLAN_JOB"  # start_logged/run_logged put a fresh value in each job's environment
_job_tags: dict[int, str] = {}  # launcher pid -> its job's tag, until kill_group


def job_processes(pid: int, tag: str | None = None) -> set[int]:
    """Live processes of the job launched as `pid` (Linux /proc; empty elsewhere), zombies excluded.

    Its descendants by parent links, and every process whose environment holds the job's tag: that
    also finds a rank after its agent died (re-parented; in a session of its own), and never
    another job's process."""
    parent: dict[int, int] = {}
    found: set[int] = set()
    needle = f"{JOB_TAG}={tag}".encode() if tag else None
    for d in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else []:
        try:
            if not d.name.isdigit():
                continue
            state, ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[:2]  # after "(comm)"
            if state in ("Z", "X"):  # dead, waiting to be reaped
                continue
            parent[int(d.name)] = int(ppid)
            if needle and needle in (d / "environ").read_bytes().split(b"\0"):
                found.add(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = {pid}, {pid}
    while frontier:
        frontier = {c for c, p in parent.items() if p in frontier} - tree
        tree |= frontier
    return found | (tree - {pid})


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, the launcher's process group AND every rank under it; return once all are dead.

    torchrun starts each rank in a session of its own, so killing the launcher's group alone would
    orphan the ranks — and a frozen rank never acts on the agent's SIGTERM. The ranks are listed
    before anything is signalled (found by parent links while the agent lives) and again by the
    job's tag after it died. A SIGKILLed process takes a moment to die (longer on a busy machine;
    a frozen one too), so the last step repeats until /proc shows none of them alive (at most 10 s):
    returning earlier let a frozen rank be seen alive after the kill."""
    tag = _job_tags.pop(proc.pid, None)
    listed = {p: _start_time(p) for p in job_processes(proc.pid, tag)}  # pid -> start time: pids get reused
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
    deadline = time.monotonic() + 10.0  # the agent stops its ranks when it can; these are the ones it could not
    while time.monotonic() < deadline:
        left = job_processes(proc.pid, tag) | {p for p, t in listed.items() if t and _start_time(p) == t}
        if not left - {os.getpid()}:
            break
        for pid in left - {os.getpid()}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        time.sleep(0.05)


def _start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), or None once it is dead or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _popen_logged(
    cmd: list[str], log_path: Path, extra_env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen:
    """Start `cmd` in its own session/process group, output appended to `log_path`, tagged for kill_group."""
    tag = uuid.uuid4().hex
    env = {**os.environ, **(extra_env or {}), JOB_TAG: tag}
    env.setdefault("OMP_NUM_THREADS", "1")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, pass_fds=pass_fds
        )
    _job_tags[proc.pid] = tag
    return proc


def start_logged(cmd: list[str], log_path: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `cmd` in its own process group, output appended to `log_path`; the caller waits, and then
    calls `job_exited` (or `kill_group` to take it down). `extra_env` is added to this environment."""
    return _popen_logged(cmd, log_path, extra_env)


def job_exited(proc: subprocess.Popen) -> None:
    """Forget the tag of a job that exited by itself (kill_group forgets it when it kills the job)."""
    _job_tags.pop(proc.pid, None)


def run_logged(
    cmd: list[str], log_path: Path, timeout_s: float, on_poll: Callable[[], None] | None = None, poll_s: float = 0.5
) -> tuple[int, float]:
    """Run `cmd` in its own process group, output appended to `log_path`; (returncode, wall seconds).

    While it runs, `on_poll` (when given: the train task's progress display) is called every `poll_s`.
    Raises TimeoutError after killing the group when it runs past `timeout_s`.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    proc = _popen_logged(cmd, log_path)
    try:
        while True:
            wait_s = deadline - time.monotonic()
            try:  # returns as soon as it exits, so wall seconds are not rounded up to a poll
                rc = proc.wait(timeout=max(0.0, min(wait_s, poll_s) if on_poll else wait_s))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"training ran past {timeout_s:.0f} s; its process group was killed") from None
                if on_poll is not None:
                    on_poll()
    except BaseException:  # timed out, interrupted (Ctrl-C, flow cancelled): take the ranks down with us
        kill_group(proc)
        raise
    job_exited(proc)
    return rc, time.monotonic() - t0


def node_log(run_dir: str | Path, node_rank: int) -> Path:
    """Node 0's torchrun log is the run's `torchrun.log` (as with one node); node R's `torchrun.nodeR.log`."""
    return Path(run_dir) / ("torchrun.log" if node_rank == 0 else f"torchrun.node{node_rank}.log")


def run_local_nodes(
    launch: Launch, timeout_s: float, on_poll: Callable[[], None] | None = None, poll_s: float = 0.5
) -> float:
    """Every node of `launch` on this machine, one runner each (worker.agent, static rendezvous on
    127.0.0.1); wall seconds once all exited 0. Raises NodeFailed for the first node that exits
    non-zero, after taking the other nodes down; TimeoutError past `timeout_s`, all killed."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    listener = socket.create_server((LOOPBACK, 0))  # held until node 0's store takes it: no port race
    port, fd = listener.getsockname()[1], listener.fileno()
    procs: list[subprocess.Popen] = []
    try:
        for r in range(launch.nnodes):
            cmd = torchrun_command(launch, local_node=(r, port, fd if r == 0 else None))
            procs.append(_popen_logged(cmd, node_log(launch.run_dir, r), pass_fds=(fd,) if r == 0 else ()))
            if r == 0:
                listener.close()  # node 0 holds its own copy
        running = dict(enumerate(procs))
        while running:
            exited = {r: rc for r, proc in running.items() if (rc := proc.poll()) is not None}
            failed = sorted((rc >= 0, r, rc) for r, rc in exited.items() if rc != 0)
            if failed:  # the lost node first: killed by a signal, its peers only exit after it with errors
                _, r, rc = failed[0]  # its ranks may outlive their agent: kill_group (below) finds them by tag
                raise NodeFailed(r, rc, node_log(launch.run_dir, r))
            for r in exited:
                job_exited(running.pop(r))
            if time.monotonic() >= deadline:
                raise TimeoutError(f"training ran past {timeout_s:.0f} s; every node's process group was killed")
            if on_poll is not None:
                on_poll()
            time.sleep(min(poll_s, 0.1))
    except BaseException:  # a node failed, timed out, interrupted: no node's ranks outlive the launch
        listener.close()
        for proc in procs:
            if proc.pid in _job_tags:
                kill_group(proc)
        raise
    return time.monotonic() - t0


def log_tail(log_path: Path, num_chars: int = 4000) -> str:
    if not log_path.is_file():
        return ""
    text = log_path.read_text(errors="replace")
    return text[-num_chars:]
