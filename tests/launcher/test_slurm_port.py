"""The Slurm batch script's rendezvous port is one free on the head node when the job starts.

It was `20000 + SLURM_JOB_ID % 20000`: two clusters on one machine (two test runs at once), whose job
ids both start at 1, put both jobs' rendezvous on port 20001 and one failed with EADDRINUSE. The
script now probes 20000–39999 from a random start (launcher/slurm.py `_FREE_PORT`), run here by bash
as Slurm runs it.
"""

from __future__ import annotations

import contextlib
import io
import random
import socket
import subprocess
import sys

from launcher.launch import Launch
from launcher.slurm import _FREE_PORT, sbatch_script
from planner.specs.runspec import RunSpec
from tests.support.runspec import all_off_default


def _listen_in_range() -> socket.socket:
    """A socket listening on a port of 20000–39999 (20001 when it is free: job 1's old port)."""
    for port in (20001, *range(20002, 40000)):
        s = socket.socket()
        try:
            s.bind(("", port))
        except OSError:
            s.close()
            continue
        s.listen()
        return s
    raise RuntimeError("no free port in 20000-39999")


def _port_lines() -> str:
    launch = Launch(plan_path="p.json", run_dir="/r/run", run_id="x", spec=RunSpec(**all_off_default(RunSpec)))
    script = sbatch_script(launch, python=sys.executable)
    start = script.index("MESHPLAN_PORT=$(")
    end = script.index("export MESHPLAN_PORT", start)
    return "set -euo pipefail\n" + script[start:end] + "export MESHPLAN_PORT\n"


def test_the_batch_script_gives_job_1_a_free_port_not_one_another_job_holds():
    held = _listen_in_range()
    try:
        taken = held.getsockname()[1]
        script = _port_lines() + '\necho "$MESHPLAN_PORT"\n'
        ports = []
        for _ in range(3):
            out = subprocess.run(
                ["bash", "-c", script], env={"SLURM_JOB_ID": "1", "PATH": "/usr/bin:/bin"},
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            ports.append(int(out.stdout.split()[-1]))
        assert all(20000 <= p < 40000 and p != taken for p in ports), (taken, ports)
        assert len(set(ports)) > 1, ports  # a random start: the same job id does not always get one port
    finally:
        held.close()


def test_the_probe_skips_a_port_in_use(monkeypatch):
    held = _listen_in_range()
    try:
        taken = held.getsockname()[1]
        monkeypatch.setattr(random, "randrange", lambda n: taken - 20000)  # start the probe on the taken port
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(_FREE_PORT, {})  # noqa: S102 - the script's own text, as `python -c` runs it
        assert int(out.getvalue()) != taken and 20000 <= int(out.getvalue()) < 40000
    finally:
        held.close()
