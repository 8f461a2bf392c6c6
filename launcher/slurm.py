"""The Slurm executor: a launch as one sbatch job, followed to its end, cancelled when we stop.

A launch (launcher.launch.Launch) on N nodes becomes one batch script (`sbatch_script`):
- `--nodes N --ntasks-per-node 1`: one torchrun agent a node, started by `srun`;
- the rendezvous on the first allocated node (`scontrol show hostnames $SLURM_JOB_NODELIST`, its
  `NodeAddr`), on a port free there when the job starts: the batch script runs on that node and
  probes 20000–39999 from a random point (`_FREE_PORT`), so two jobs on one head node (or two test
  clusters on one machine, whose job ids both start at 1) do not meet on one port;
- torchrun's *static* rendezvous with `--node-rank $SLURM_NODEID`, as the several-node path of
  launcher.launch: it numbers global ranks node-major (node_rank × nproc + local_rank) and in the
  allocation's node order, deterministically — the plan's device ids are those global ranks, so a
  stage lands on the node the plan put it on (c10d's dynamic rendezvous numbers nodes in the order
  they join);
- NCCL or gloo as the plan's device says (worker.train picks it); on a loopback cluster (nodes whose
  address is 127.x, as in the tests) gloo and NCCL are pinned to `lo`;
- every node first checks it sees the run folder: the ranks read the plan, write telemetry and
  checkpoints there, so it must be on storage every node shares; a node that does not see it exits
  3 with a line saying so (`NOT_SHARED_EXIT`).
The script is what a user may also submit by hand (`meshplan train --executor slurm --dry-run`
prints it). `run_slurm` submits it (`sbatch --parsable`), follows it with `squeue`, reads its end
with `scontrol show job` (or `sacct` where accounting runs), and `scancel`s it on timeout or
interruption, returning only once Slurm no longer lists it.

Stdlib only, like launcher.launch: the flow process imports it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import rundir
from launcher.launch import Launch, rank_command
from planner.errors import MeshplanError
from planner.specs.config import SLURM_COMMAND_TIMEOUT_S
from planner.specs.slurm import SLURM_DEFAULTS, SlurmOptions

NOT_SHARED_EXIT = 3
_SLURM_FAILED = ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


class SlurmPreempted(RuntimeError):
    """Slurm ended the job to give its nodes to another (state PREEMPTED): not the job's failure."""


class SlurmError(MeshplanError):
    """sbatch refused the job, or a Slurm command is missing."""


def sbatch_script(launch: Launch, opts: SlurmOptions = SLURM_DEFAULTS, python: str = sys.executable) -> str:
    """The batch script of a training launch (one task a node; see the module docstring)."""
    return batch_script(
        f"meshplan-{launch.run_id}", launch.nnodes, launch.nproc_per_node, launch.run_dir, rank_command(launch), opts,
        must_see=launch.plan_path, max_restarts=launch.max_restarts, python=python,
    )  # fmt: skip


def batch_script(
    job_name: str,
    nnodes: int,
    nproc_per_node: int,
    run_dir: str | Path,
    worker: list[str],
    opts: SlurmOptions = SLURM_DEFAULTS,
    must_see: str | None = None,
    max_restarts: int = 0,
    python: str = sys.executable,
) -> str:
    """A batch script running `python -m torch.distributed.run ... WORKER` on `nnodes` nodes, one agent
    a node (`worker`: `-m module ARGS`); every node first checks it sees `must_see` (a file in the
    run folder), and the job's output goes to `run_dir/slurm-<job id>.out`."""
    if nnodes < 1:
        raise MeshplanError("--nnodes", nnodes, "give at least 1 node")
    run_dir = Path(run_dir)
    torchrun = [
        shlex.quote(python), "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", '"$SLURM_NODEID"',
        "--master-addr", '"$MESHPLAN_HEAD_ADDR"', "--master-port", '"$MESHPLAN_PORT"',
        "--nproc-per-node", str(nproc_per_node), "--max-restarts", str(max_restarts),
    ]  # fmt: skip
    sbatch = [
        f"--job-name={opts.job_name or job_name}",
        f"--nodes={nnodes}",
        "--ntasks-per-node=1",
        f"--output={rundir.slurm_log(run_dir, '%j')}",
    ]
    sbatch += [f"--partition={opts.partition}"] if opts.partition else []
    sbatch += [f"--account={opts.account}"] if opts.account else []
    sbatch += [f"--time={opts.time_limit}"] if opts.time_limit else []
    sbatch += [f"--nodelist={opts.nodelist}"] if opts.nodelist else []
    sbatch += [f"--constraint={opts.constraint}"] if opts.constraint else []
    sbatch += [f"--gres={opts.gres}"] if opts.gres else []
    sbatch += [] if opts.requeue is None else ["--requeue" if opts.requeue else "--no-requeue"]
    check = shlex.quote(must_see or str(run_dir))
    lines = [
        "#!/bin/bash",
        f"# {job_name}: {nnodes} node(s) x {nproc_per_node} rank(s), written by meshplan (launcher/slurm.py)",
        *(f"#SBATCH {s}" for s in sbatch),
        "set -euo pipefail",
        f"cd {shlex.quote(os.getcwd())}",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MESHPLAN_HEAD_ADDR=$(scontrol show node \"$head_node\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
        f"MESHPLAN_PORT=$({shlex.quote(python)} -c {shlex.quote(_FREE_PORT)})",  # `export X=$(...)` would hide a failure
        "export MESHPLAN_PORT",
        'echo "meshplan: rendezvous on $MESHPLAN_HEAD_ADDR:$MESHPLAN_PORT"',
        'case "$MESHPLAN_HEAD_ADDR" in 127.*|localhost) export GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo ;; esac',
        "meshplan_node() {  # on every node: the run folder must be there, then its torchrun agent",
        f"  if [ ! -e {check} ]; then",
        f'    echo "meshplan: node $(hostname) ($SLURMD_NODENAME) does not see {check}:'
        f' put the run folder on storage every node shares (meshplan --state-dir / train --runs-dir)" >&2',
        f"    exit {NOT_SHARED_EXIT}",
        "  fi",
        '  export MESHPLAN_NODE_NAME="${SLURMD_NODENAME:-$(hostname)}"  # the node as Slurm names it (--nodelist)',
        "  exec " + " ".join([*torchrun, *(shlex.quote(w) for w in worker)]),
        "}",
        "export -f meshplan_node",
        "srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c meshplan_node",
    ]
    return "\n".join(lines) + "\n"


# run by the batch script on the first allocated node (where Slurm runs it, and where the rendezvous
# listens): a port of 20000-39999 nobody listens on, from a random start (the job id alone gave two
# overlapping clusters' job 1 the same port: EADDRINUSE)
_FREE_PORT = """
import random, socket
start = random.randrange(20000)
for k in range(20000):
    port = 20000 + (start + k) % 20000
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            continue
    print(port)
    break
else:
    raise SystemExit("meshplan: no free port in 20000-39999 on the head node")
""".strip()


def _slurm(*cmd: str, timeout_s: float = SLURM_COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise SlurmError(
            "--executor", "slurm", f"`{cmd[0]}` is not on PATH: run on a Slurm login node, or use --executor local"
        ) from None


def submit(script_path: Path) -> str:
    """sbatch the script; the job id."""
    out = _slurm("sbatch", "--parsable", str(script_path))
    if out.returncode != 0:
        raise SlurmError("--executor", "slurm", f"sbatch refused the job: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip().split(";")[0]


def job_state(job_id: str) -> tuple[str, int | None]:
    """(state, exit code or None while it runs): squeue while Slurm lists the job, then its record."""
    q = _slurm("squeue", "-h", "-j", job_id, "-o", "%T")
    if q.returncode == 0 and q.stdout.strip():
        return q.stdout.strip().split()[0], None
    show = _slurm("scontrol", "show", "job", job_id)
    fields = dict(f.split("=", 1) for f in show.stdout.split() if "=" in f) if show.returncode == 0 else {}
    if "JobState" not in fields:  # purged from slurmctld's memory: accounting, where it runs
        acct = _slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode")
        line = acct.stdout.strip().splitlines()[0] if acct.returncode == 0 and acct.stdout.strip() else ""
        if not line:
            return "UNKNOWN", 1
        state, code = line.split("|")
        fields = {"JobState": state.split()[0], "ExitCode": code}
    state = fields["JobState"]
    if state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"):
        return state, None
    code, _, sig = fields.get("ExitCode", "0:0").partition(":")
    rc = int(code) if code.isdigit() else 1
    if state == "COMPLETED":
        return state, rc
    return state, rc or (128 + int(sig) if sig.isdigit() and int(sig) else 1)


def cancel(job_id: str, wait_s: float = 60.0) -> None:
    """scancel the job and wait until Slurm lists it no more (its processes are gone on every node)."""
    _slurm("scancel", job_id)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        q = _slurm("squeue", "-h", "-j", job_id, "-o", "%T")
        if q.returncode != 0 or not q.stdout.strip():
            return
        time.sleep(0.5)


@dataclass(frozen=True)
class SlurmResult:
    job_id: str
    state: str
    returncode: int
    wall_s: float


def run_slurm(
    launch: Launch,
    opts: SlurmOptions,
    timeout_s: float,
    on_submit: Callable[[str], None] | None = None,
    on_poll: Callable[[], None] | None = None,
    poll_s: float = 0.5,
) -> SlurmResult:
    """Submit a training launch as a batch job (its script kept as `run_dir/sbatch.sh`) and follow it."""
    script = rundir.sbatch_path(launch.run_dir)
    script.write_text(sbatch_script(launch, opts))
    return run_batch(script, timeout_s, on_submit, on_poll, poll_s)


def run_batch(
    script: Path,
    timeout_s: float,
    on_submit: Callable[[str], None] | None = None,
    on_poll: Callable[[], None] | None = None,
    poll_s: float = 0.5,
) -> SlurmResult:
    """sbatch `script` and follow the job to its end; `on_submit(job_id)` once sbatch took it. Raises
    TimeoutError past `timeout_s` (the job cancelled); an interruption cancels it too."""
    t0 = time.monotonic()
    job_id = submit(script)
    try:
        if on_submit is not None:
            on_submit(job_id)
        while True:
            state, rc = job_state(job_id)
            if rc is not None:
                return SlurmResult(job_id, state, rc, time.monotonic() - t0)
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"slurm job {job_id} ran past {timeout_s:.0f} s; it was cancelled (scancel)")
            if on_poll is not None:
                on_poll()
            time.sleep(poll_s)
    except BaseException:  # timed out, interrupted (Ctrl-C, flow cancelled): the job goes with us
        cancel(job_id)
        raise


UNAVAILABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER", "MAINT", "INVAL", "UNKNOWN", "REBOOT", "FUTURE")


@dataclass(frozen=True)
class SlurmNode:
    """One node as `scontrol show nodes` reports it."""

    name: str
    state: str  # e.g. IDLE, ALLOCATED, MIXED, DOWN*, IDLE+DRAIN
    cpus: int
    gpus: int  # gres gpu count (0: none)
    gpu_type: str | None  # gres gpu type (gpu:a100:8 -> a100)
    features: tuple[str, ...]

    @property
    def available(self) -> bool:
        """Up and schedulable: not down, drained, failing, unresponsive, powered off or in maintenance."""
        flags = self.state.upper().replace("*", "+NOT_RESPONDING").split("+")
        return not any(f.startswith(u) for f in flags for u in UNAVAILABLE)


def _fields(line: str) -> dict[str, str]:
    return dict(f.split("=", 1) for f in line.split() if "=" in f)


def slurm_nodes(partition: str | None = None) -> list[SlurmNode]:
    """The cluster's nodes (of `partition`), in Slurm's order."""
    out = _slurm("scontrol", "show", "nodes", "-o")
    if out.returncode != 0:
        raise SlurmError("--executor", "slurm", f"scontrol show nodes failed: {out.stderr.strip()}")
    nodes = []
    for line in out.stdout.splitlines():
        f = _fields(line)
        if "NodeName" not in f or (partition and partition not in f.get("Partitions", "").split(",")):
            continue
        gpus, gpu_type = 0, None
        for g in f.get("Gres", "(null)").split(","):
            parts = g.split("(")[0].split(":")
            if parts[0] == "gpu" and len(parts) >= 2:
                gpus += int(parts[-1]) if parts[-1].isdigit() else 0
                gpu_type = parts[1] if len(parts) == 3 else gpu_type
        feats = tuple(x for x in f.get("AvailableFeatures", "(null)").split(",") if x and x != "(null)")
        nodes.append(
            SlurmNode(f["NodeName"], f.get("State", "UNKNOWN"), int(f.get("CPUTot", "0")), gpus, gpu_type, feats)
        )
    return nodes


def expand_hostlist(text: str) -> list[str]:
    """`n[1-2],gpu7` -> ['n1', 'n2', 'gpu7'] (scontrol show hostnames)."""
    if not text or text in ("(null)", "None"):
        return []
    out = _slurm("scontrol", "show", "hostnames", text)
    return out.stdout.split() if out.returncode == 0 else []


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    name: str
    state: str
    nodes: tuple[str, ...]


def slurm_jobs() -> list[SlurmJob]:
    """Jobs Slurm lists now (pending, running, completing), with the nodes each holds."""
    out = _slurm("squeue", "-h", "-o", "%i|%j|%T|%N")
    if out.returncode != 0:
        raise SlurmError("--executor", "slurm", f"squeue failed: {out.stderr.strip()}")
    jobs = []
    for line in out.stdout.splitlines():
        if line.count("|") == 3:
            job_id, name, state, nodes = line.split("|")
            jobs.append(SlurmJob(job_id, name, state, tuple(expand_hostlist(nodes))))
    return jobs


def job_nodes(job_id: str) -> list[str]:
    """The nodes a job ran on, in its allocation's order (node rank order), while Slurm remembers it."""
    show = _slurm("scontrol", "show", "job", job_id)
    return expand_hostlist(_fields(show.stdout).get("NodeList", "")) if show.returncode == 0 else []


def lost_node_rank(job_id: str) -> int:
    """The node rank (index in the job's node list) of the first of its nodes Slurm now reports
    unavailable; -1 when none is (or Slurm no longer remembers the job)."""
    nodes = job_nodes(job_id)
    down = {n.name for n in slurm_nodes() if not n.available}
    return next((i for i, name in enumerate(nodes) if name in down), -1)


def job_log(run_dir: str | Path, job_id: str) -> Path:
    """The batch job's output (every node's torchrun, through srun)."""
    return rundir.slurm_log(run_dir, job_id)
