"""A real Slurm cluster on this machine for tests: one `slurmctld` and two `slurmd` nodes.

Debian's slurm-wlm, no munge (`auth/none`), every path under one temporary folder, its own ports, so it
touches no system service and nothing of another test's cluster. The nodes are this host twice
(`slurmd -N n1`, `-N n2`, each with its own port and spool, the "multiple slurmd" set-up); each
node's `NodeAddr` is 127.0.0.1, so the ranks of a job on both rendezvous over loopback. Clients
(sbatch, squeue, scontrol, scancel) find it through `SLURM_CONF`, which `SlurmCluster.env` holds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher import group
from tests.support.procs import start as start_process

SLURM_BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")


def slurm_missing() -> str | None:
    """Why a local Slurm cannot be started here (None when it can)."""
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm"
    if os.geteuid() != 0:
        return "slurmd must run as root here (SlurmUser=root, no system service)"
    return None


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class SlurmCluster:
    root: Path
    nodes: tuple[str, ...] = ("n1", "n2")
    cpus: int = 1  # one rank a node: the tests' jobs ask for one task a node, and this machine has 2 cores
    features: str = "cpu"  # the node kind meshplan reads (typed GPU gres does not register on these fake nodes)
    procs: list[group.Process] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_conf(self) -> None:
        host = socket.gethostname()
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        for d in ("spool", "state", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        lines = [
            "ClusterName=meshplan-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "AuthType=auth/none",
            "CredType=cred/none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MinJobAge=600",  # finished jobs stay visible to `scontrol show job` for 10 minutes
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}/%n",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd-%n.log'}",
        ]
        for name, port in zip(self.nodes, node_ports, strict=True):
            lines.append(
                f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                f"CPUs={self.cpus} RealMemory=2000 Features={self.features} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
        )
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self, timeout_s: float = 60.0, tries: int = 3) -> None:
        """Start the daemons on fresh free ports; a daemon that exits (its port taken by another
        process between the probe and its bind: another test run's cluster) starts them all again
        on new ports, up to `tries` times."""
        for attempt in range(1, tries + 1):
            why = self._start_once(timeout_s)
            if why is None:
                return
            self.stop()
            if attempt == tries:
                raise RuntimeError(f"the test Slurm cluster did not come up ({why}); logs in {self.root / 'log'}")

    def _start_once(self, timeout_s: float) -> str | None:
        self.write_conf()
        log = self.root / "log" / "daemons.out"
        self.procs.append(
            start_process([_bin("slurmctld"), "-D", "-i", "-f", str(self.conf)], env=self.env, log_path=log)
        )
        for name in self.nodes:
            self.procs.append(
                start_process([_bin("slurmd"), "-D", "-f", str(self.conf), "-N", name], env=self.env, log_path=log)
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.idle_nodes() == set(self.nodes):
                return None
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead:
                return f"{dead[0][0]} exited"
            time.sleep(0.5)
        return f"not up in {timeout_s:.0f} s"

    def run(self, *cmd: str, check: bool = True) -> str:
        out = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=30)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip()}")
        return out.stdout

    def idle_nodes(self) -> set[str]:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True, timeout=10
        )
        return {n for n, state in (line.split() for line in out.stdout.splitlines() if line.strip()) if state == "idle"}

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                group.send(p, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                group.send(p, signal.SIGKILL)
                p.wait(timeout=5)
            group.forget(p)
        self.procs.clear()
