"""The FaultSpec the flow holds is the one every rank parses: one `--faults` argument, no environment."""

from __future__ import annotations

from launcher.launch import Launch, torchrun_command
from planner.specs.faults import FaultSpec
from worker.options import parse_options


def _rank_argv(cmd: list[str]) -> list[str]:
    """The arguments torchrun hands each rank: everything after `-m worker.train`."""
    i = cmd.index("worker.train")
    assert cmd[i - 1] == "-m"
    return cmd[i + 1 :]


def test_the_rank_parses_the_launchs_faults_whole():
    spec = FaultSpec(slow_rank=1, slow_factor=2.0, slow_from_step=5, link_rank=0, link_s_per_msg=0.03, kill_rank=1)
    cmd = torchrun_command(Launch(plan_path="p.json", run_dir="r", run_id="x", steps=3, faults=spec))
    assert cmd.count("--faults") == 1
    assert parse_options(_rank_argv(cmd)).faults == spec


def test_no_faults_means_no_argument_and_none_parsed(monkeypatch):
    monkeypatch.setenv("MESHPLAN_FAULT", "1:1")  # the old environment switch is read by nobody
    cmd = torchrun_command(Launch(plan_path="p.json", run_dir="r", run_id="x", steps=3))
    assert "--faults" not in cmd
    assert not parse_options(_rank_argv(cmd)).faults.any_on
