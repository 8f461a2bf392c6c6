"""A single-node job listens on loopback only, and two at once never collide.

Launched the way the train task launches it (launcher.launch: torchrun_command + start_logged). Once
both jobs' ranks have logged steps (so the agent's store and every rank's gloo pairs are up), every
listening TCP socket owned by a job's processes (agent and ranks) must be bound to 127.0.0.0/8 or
::1 — never 0.0.0.0 or [::], which `--standalone` gave the store. The ranks must also run with
gloo pinned to `lo`: here the hostname resolves to 127.0.0.1, so their sockets alone could not
tell; on a host whose name resolves to its LAN address gloo would listen there.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import struct
from pathlib import Path

import pytest

from launcher.launch import Launch, job_processes, kill_group, start_logged, torchrun_command
from planner.specs.runspec import RunSpec
from tests.worker.conftest import wait_for_steps

pytestmark = pytest.mark.dist


def _listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of each listening TCP socket that one of `pids` holds (Linux /proc)."""
    owner = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    owner[target[8:-1]] = pid
        except OSError:
            continue
    found = []
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in owner:  # 0A: LISTEN; [9] is the inode
                continue
            addr_hex, port_hex = fields[1].split(":")
            words = struct.unpack(f"{len(addr_hex) // 8}I", bytes.fromhex(addr_hex))  # host-order 32-bit words
            addr = socket.inet_ntop(family, struct.pack(f"!{len(words)}I", *words))
            found.append((owner[fields[9]], addr, int(port_hex, 16)))
    return found


def _is_loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def test_two_single_node_jobs_at_once_listen_on_loopback_only(tmp_path, make_plan):
    procs = []
    try:
        for job in ("a", "b"):  # started together: each holds its own port from the start
            run_dir = tmp_path / job
            run_dir.mkdir()
            (run_dir / "plan.json").write_text(json.dumps(make_plan([(0, 2), (2, 4)])))
            launch = Launch(
                plan_path=str(run_dir / "plan.json"),
                run_dir=str(run_dir),
                run_id=job,
                spec=RunSpec(steps=1_000_000, data="synthetic", optimizer="sgd", lr=0.1, checkpoint_every=0),
            )
            procs.append(start_logged(torchrun_command(launch), run_dir / "torchrun.log"))
        for job in ("a", "b"):
            wait_for_steps(tmp_path / job, 2)
        store_ports = []
        for proc, job in zip(procs, ("a", "b"), strict=True):
            assert proc.poll() is None, (tmp_path / job / "torchrun.log").read_text()[-3000:]
            ranks = job_processes(proc.pid)  # the agent is alive, so its children are all found
            sockets = _listening(ranks | {proc.pid})
            print(job, sorted(sockets))
            listeners = {pid for pid, _, _ in sockets}
            assert proc.pid in listeners and len(listeners & ranks) == 2, f"no store or gloo listening: {sockets}"
            assert all(_is_loopback(addr) for _, addr, _ in sockets), f"job {job} listens beyond loopback: {sockets}"
            store_ports += [port for pid, _, port in sockets if pid == proc.pid]
            for pid in ranks:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                assert b"GLOO_SOCKET_IFNAME=lo" in env and b"MASTER_ADDR=127.0.0.1" in env
        assert len(store_ports) == len(set(store_ports)) == 2, store_ports
    finally:
        for proc in procs:
            kill_group(proc)


def test_two_nodes_on_this_machine_listen_on_loopback_only_and_a_lost_node_takes_the_other_down(tmp_path, make_plan):
    """run_local_nodes (a job spanning two simulated nodes): node 0's agent holds the store on the
    127.0.0.1 socket the launcher bound, node 1's agent connects to it, and every socket either
    node's processes listen on is loopback. SIGKILLing node 1's agent then ends the launch with
    NodeFailed naming node 1, and node 0's agent and both ranks are gone when it returns."""
    import signal
    import threading

    from launcher.launch import NodeFailed, run_local_nodes

    (tmp_path / "plan.json").write_text(json.dumps(make_plan([(0, 2), (2, 4)])))
    launch = Launch(
        plan_path=str(tmp_path / "plan.json"),
        run_dir=str(tmp_path),
        run_id="nodes",
        spec=RunSpec(steps=1_000_000, data="synthetic", optimizer="sgd", lr=0.1, checkpoint_every=0),
        nproc_per_node=1,
        nnodes=2,
        local_nodes=True,
    )
    out: dict = {}

    def run() -> None:
        try:
            run_local_nodes(launch, timeout_s=300.0)
        except BaseException as exc:  # noqa: BLE001 - the test reads what ended it
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    agents: dict[int, int] = {}
    try:
        wait_for_steps(tmp_path, 2)
        job = _run_processes(tmp_path)
        for pid in job:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"worker.agent" in argv:
                agents[int(argv[argv.index(b"--node-rank") + 1])] = pid
        assert sorted(agents) == [0, 1], job
        sockets = _listening(set(job))
        assert agents[0] in {pid for pid, _, _ in sockets}, f"node 0's agent holds no store: {sockets}"
        assert agents[1] not in {pid for pid, _, _ in sockets}, "node 1's agent must not listen"
        assert all(_is_loopback(addr) for _, addr, _ in sockets), f"listens beyond loopback: {sockets}"
        os.kill(agents[1], signal.SIGKILL)
    finally:
        thread.join(timeout=120)
    err = out.get("error")
    assert isinstance(err, NodeFailed) and err.node_rank == 1 and err.returncode == -signal.SIGKILL, err
    assert not _run_processes(tmp_path), "a node's agent or rank outlived the launch"


def _run_processes(run_dir: Path) -> list[int]:
    """Live processes whose command line names `run_dir` (agents and ranks of the launch)."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and str(run_dir).encode() in (d / "cmdline").read_bytes():
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(d.name))
        except OSError:
            continue
    return found
