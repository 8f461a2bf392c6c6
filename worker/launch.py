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
    return cmd


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


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
            _kill_group(proc)
            raise TimeoutError(f"training ran past {timeout_s:.0f} s; its process group was killed") from None
        except BaseException:  # interrupted (Ctrl-C, flow cancelled): take the ranks down with us
            _kill_group(proc)
            raise
    return rc, time.monotonic() - t0


def log_tail(log_path: Path, num_chars: int = 4000) -> str:
    if not log_path.is_file():
        return ""
    text = log_path.read_text(errors="replace")
    return text[-num_chars:]
