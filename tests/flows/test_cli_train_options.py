"""Every training option reaches the ranks from `meshplan train` without a flag of its own: each
RunOptions field, set with `--set train.<name>=` (tests/support/runspec.py: off its default, from its
type), is on the rank command line of the batch script `--executor slurm --dry-run` writes. A field
added to RunOptions is covered here without editing this test."""

from __future__ import annotations

import json
import shlex

from planner.specs.runspec import RunOptions, RunSpec
from tests.support.cli import meshplan
from tests.support.runspec import all_off_default
from tests.worker.conftest import plan_dict
from worker.options import parse_args


def test_every_train_option_set_on_the_cli_reaches_the_rank_command_line(tmp_path):
    plan = tmp_path / "dp2.json"
    plan.write_text(json.dumps(plan_dict([(0, 4)], dp=2)))
    values = all_off_default(RunOptions)
    sets = [a for k, v in values.items() for a in ("--set", f"train.{k}={json.dumps(v)}")]
    out = meshplan(
        tmp_path, *sets, "train", "--plan", str(plan), "--executor", "slurm", "--dry-run", "--run-id", "opts",
        "--nproc-per-node", "2", "--resume", "none",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if "worker.train" in line)
    cmd = shlex.split(line)
    args = parse_args(cmd[cmd.index("worker.train") + 1 :])
    assert args.run == RunSpec(**values, resume="none")
