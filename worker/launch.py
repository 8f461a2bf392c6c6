"""Build and run the torchrun command for worker.train (stdlib only: the flow process imports it).

One node: `--standalone` (a private rendezvous on a free port, so concurrent runs never collide).
Several nodes: torchrun's static rendezvous (`--nnodes N --node-rank R --master-addr HOST
--master-port PORT`), because it numbers global ranks node-major (node_rank * nproc + local_rank)
— deterministic, which the plan needs since its device ids are global ranks. Run the same command
on every node with its own --node-rank; the run folder must be on storage every node shares.

The launcher runs in its own session/process group with an outer timeout; on timeout or when the
caller is interrupted the whole group (agent and ranks) is killed, so no rank outlives its run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from planner.errors import MeshplanError


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
    data: str = "text"
    lr: float = 3e-3
    optimizer: str = "adamw"
    seed: int = 0
    checkpoint_every: int = 0
    resume: str = "auto"
    collective_timeout_s: float = 300.0
    # fault injection (worker/faults.py) and the control channel (worker/control.py)
    slow_rank: int = -1
    slow_factor: float = 1.0
    slow_from_step: int = 0
    slow_link_rank: int = -1
    slow_link_s_per_mib: float = 0.0
    slow_link_s_per_msg: float = 0.0
    slow_link_from_step: int = 0
    control_from_version: int = 0


def torchrun_command(launch: Launch, python: str = sys.executable) -> list[str]:
    cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(launch.nproc_per_node),
           "--max-restarts", str(launch.max_restarts)]  # fmt: skip
    if launch.nnodes == 1:
        cmd.append("--standalone")
    else:
        host, sep, port = launch.rdzv_endpoint.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise MeshplanError("--rdzv-endpoint", launch.rdzv_endpoint, "write it as HOST:PORT, e.g. 10.0.0.1:29500")
        if not 0 <= launch.node_rank < launch.nnodes:
            raise MeshplanError("--node-rank", launch.node_rank, f"must be in 0..{launch.nnodes - 1}")
        cmd += ["--nnodes", str(launch.nnodes), "--node-rank", str(launch.node_rank),
                "--master-addr", host, "--master-port", port]  # fmt: skip
    cmd += ["-m", "worker.train", "--plan", launch.plan_path, "--run-dir", launch.run_dir, "--run-id", launch.run_id,
            "--steps", str(launch.steps), "--data", launch.data, "--lr", repr(launch.lr),
            "--optimizer", launch.optimizer, "--seed", str(launch.seed),
            "--checkpoint-every", str(launch.checkpoint_every), "--resume", launch.resume,
            "--timeout-s", repr(launch.collective_timeout_s)]  # fmt: skip
    if launch.model:
        cmd += ["--model", launch.model]
    if launch.slow_rank >= 0 and launch.slow_factor > 1.0:
        cmd += ["--slow-rank", str(launch.slow_rank), "--slow-factor", repr(launch.slow_factor),
                "--slow-from-step", str(launch.slow_from_step)]  # fmt: skip
    if launch.slow_link_rank >= 0:
        cmd += ["--slow-link-rank", str(launch.slow_link_rank), "--slow-link-s-per-mib",
                repr(launch.slow_link_s_per_mib), "--slow-link-s-per-msg", repr(launch.slow_link_s_per_msg),
                "--slow-link-from-step", str(launch.slow_link_from_step)]  # fmt: skip
    if launch.control_from_version:
        cmd += ["--control-from-version", str(launch.control_from_version)]
    return cmd


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (Linux /proc; [] elsewhere), found by parent links, not groups."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else []:
        try:
            if d.name.isdigit():  # the field after "(comm)" is the state, then the parent pid
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parent.items() if p in frontier]
        found += kids
        frontier = kids
    return found


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, the launcher's process group AND every rank under it.

    torchrun starts each rank in a session of its own, so killing the launcher's group alone would
    orphan the ranks — and a frozen rank never acts on the agent's SIGTERM. The ranks are listed
    before anything is signalled: once the agent dies they are re-parented and no longer findable."""  # fmt: skip
    tree = descendants(proc.pid)
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
    for pid in tree:  # the agent stops its ranks when it can; these are the ones it could not
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


def start_logged(cmd: list[str], log_path: Path) -> subprocess.Popen:
    """Start `cmd` in its own process group, output appended to `log_path`; the caller waits and kills."""
    env = {**os.environ}
    env.setdefault("OMP_NUM_THREADS", "1")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def run_logged(cmd: list[str], log_path: Path, timeout_s: float) -> tuple[int, float]:
    """Run `cmd` in its own process group, output appended to `log_path`; (returncode, wall seconds).

    Raises TimeoutError after killing the group when it runs past `timeout_s`.
    """
    env = {**os.environ}
    env.setdefault("OMP_NUM_THREADS", "1")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with log_path.open("a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise TimeoutError(f"training ran past {timeout_s:.0f} s; its process group was killed") from None
        except BaseException:  # interrupted (Ctrl-C, flow cancelled): take the ranks down with us
            kill_group(proc)
            raise
    return rc, time.monotonic() - t0


def log_tail(log_path: Path, num_chars: int = 4000) -> str:
    if not log_path.is_file():
        return ""
    text = log_path.read_text(errors="replace")
    return text[-num_chars:]
