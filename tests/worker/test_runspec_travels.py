"""What the flow's Launch holds is what every rank parses: its RunSpec and site, whole, through the
torchrun command line and through a Slurm batch script; no environment variable carries any of it."""

from __future__ import annotations

import shlex

from launcher.launch import Launch, torchrun_command
from launcher.slurm import sbatch_script
from planner.specs.runspec import RunSpec
from tests.support.runspec import all_off_default
from worker.options import parse_args


def _rank_argv(cmd: list[str]) -> list[str]:
    """The arguments torchrun hands each rank: everything after `-m worker.train`."""
    i = cmd.index("worker.train")
    assert cmd[i - 1] == "-m"
    return cmd[i + 1 :]


def test_the_rank_parses_the_launchs_spec_and_site_whole():
    spec = RunSpec(**all_off_default(RunSpec))
    launch = Launch(plan_path="p.json", run_dir="/r/run", run_id="x", spec=spec, generation=3, control_from_version=2)
    script_line = next(line for line in sbatch_script(launch).splitlines() if "worker.train" in line)
    for cmd in (torchrun_command(launch), shlex.split(script_line)):
        args = parse_args(_rank_argv(cmd))
        assert args.run == spec and args.site == launch.site()


def test_no_faults_means_no_argument_and_none_parsed(monkeypatch):
    monkeypatch.setenv("MESHPLAN_FAULT", "1:1")  # the old environment switch is read by nobody
    cmd = torchrun_command(Launch(plan_path="p.json", run_dir="r", run_id="x"))
    assert "--faults" not in cmd
    args = parse_args(_rank_argv(cmd))
    assert not args.run.faults.any_on and args.run == RunSpec() and args.run_id == "x"
