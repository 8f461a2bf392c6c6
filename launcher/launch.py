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
caller is interrupted the whole group (agent and ranks) is stopped (launcher/group.py, the one way
every subprocess runner starts and stops its group), so no rank outlives its run. Every process of
a launch carries its run folder and generation in its environment (`launch_env`), so the next
launch of that folder stops an earlier generation by label even after its runner was SIGKILLed.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import rundir
from launcher.group import GEN_TAG, RUN_TAG, _job_tags, forget, job_processes, start, stop  # noqa: F401
from planner.errors import MeshplanError
from planner.specs.config import TrainConfig
from planner.specs.runspec import RankSite, RunSpec, rank_argv

_TRAIN = TrainConfig()


@dataclass(frozen=True)
class Launch:
    """One launch: what the ranks are told (`spec`), where (plan file, run folder, generation) and on
    which topology (ranks per node, nodes, rendezvous, restarts)."""

    plan_path: str
    run_dir: str
    run_id: str
    spec: RunSpec = RunSpec()  # everything a rank is told, written onto its command line whole
    nproc_per_node: int = 2  # two CPU ranks (tests, benches); the flows pass the plan's ranks per node
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = _TRAIN.rdzv_endpoint
    max_restarts: int = _TRAIN.max_restarts  # safe with gloo thanks to the per-attempt store prefix in worker.train
    control_from_version: int = 0
    generation: int = 0  # this launch's generation (launcher/control.py); ranks exit once it is superseded
    local_nodes: bool = False  # every node's runner on this machine, loopback master (run_local_nodes)

    def site(self) -> RankSite:
        return RankSite(
            plan=self.plan_path,
            run_dir=self.run_dir,
            run_id=self.run_id,
            generation=self.generation,
            control_from_version=self.control_from_version,
        )


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
    return cmd + rank_command(launch)


def rank_command(launch: Launch) -> list[str]:
    """What torchrun (or a batch script's torchrun) starts on each rank: `-m worker.train` and the
    launch's site and RunSpec (planner/specs/runspec.py), whole."""
    return ["-m", "worker.train", *rank_argv(launch.site(), launch.spec)]


LOOPBACK = "127.0.0.1"
# starting and stopping the ranks' process group is launcher/group.py's, for every subprocess runner alike
kill_group, job_exited = stop, forget


def launch_env(launch: Launch) -> dict[str, str]:
    """The labels every process of this launch carries: its run folder and generation, so the next
    launch of the run folder finds (and stops) them by label even when their runner is gone."""
    return {RUN_TAG: run_label(launch.run_dir), GEN_TAG: str(launch.generation)}


def run_label(run_dir: str | Path) -> str:
    return str(Path(run_dir).resolve())


def _popen_logged(
    cmd: list[str], log_path: Path, extra_env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen:
    return start(cmd, log_path, extra_env, pass_fds)


def start_logged(
    cmd: list[str], log_path: Path, extra_env: dict[str, str] | None = None, detached: bool = False
) -> subprocess.Popen:
    """Start `cmd` in its own process group, output appended to `log_path`; the caller waits, and then
    calls `job_exited` (or `kill_group` to take it down). `extra_env` is added to this environment;
    `detached`: it outlives this command (launcher/group.start)."""
    return start(cmd, log_path, extra_env, detached=detached)


def run_logged(
    cmd: list[str],
    log_path: Path,
    timeout_s: float,
    on_poll: Callable[[], None] | None = None,
    poll_s: float = 0.5,
    extra_env: dict[str, str] | None = None,
) -> tuple[int, float]:
    """Run `cmd` in its own process group, output appended to `log_path`; (returncode, wall seconds).

    While it runs, `on_poll` (when given: the train task's progress display) is called every `poll_s`.
    Raises TimeoutError after killing the group when it runs past `timeout_s`.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    proc = _popen_logged(cmd, log_path, extra_env)
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


node_log = rundir.node_log


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
            env, fds = launch_env(launch), (fd,) if r == 0 else ()
            procs.append(_popen_logged(cmd, node_log(launch.run_dir, r), env, fds))
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
