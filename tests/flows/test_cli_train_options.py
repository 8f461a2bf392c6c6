"""Every training option reaches the ranks from `meshplan train`, and a job from `meshplan submit`, with
no CLI edit: each RunOptions field, off its default (tests/support/runspec.py: a value from its type),
set with `--set train.<name>=` or with the flag generated from the field (cli/commands/run_options.py),
is on the rank command line of the batch script `--executor slurm --dry-run` writes, or in the job's
stored options. A field added to RunOptions is covered here without editing this test."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from planner.specs.runspec import RunOptions, RunSpec, flag
from tests.support.cli import meshplan
from tests.support.runspec import all_off_default
from tests.worker.conftest import plan_dict
from worker.options import parse_args

JOB_OPTIONS = [n for n in RunOptions.model_fields if n != "steps"]  # a job's steps are its --iterations


def flags(values: dict[str, Any]) -> list[str]:
    """`--kebab-name VALUE` per field, as a user types the generated flags (`--x` / `--no-x` for a bool)."""
    out: list[str] = []
    for name, value in values.items():
        if isinstance(value, bool):
            out.append(flag(name) if value else f"--no-{flag(name)[2:]}")
        else:
            out += [flag(name), str(value)]
    return out


def sets(values: dict[str, Any]) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"train.{k}={json.dumps(v)}")]


@pytest.mark.parametrize("how", ["set", "flags"])
def test_every_train_option_set_on_the_cli_reaches_the_rank_command_line(tmp_path, how):
    plan = tmp_path / "dp2.json"
    plan.write_text(json.dumps(plan_dict([(0, 4)], dp=2)))
    values = all_off_default(RunOptions)
    given = (sets(values), []) if how == "set" else ([], flags(values))
    out = meshplan(
        tmp_path, *given[0], "train", "--plan", str(plan), "--executor", "slurm", "--dry-run", "--run-id", "opts",
        "--nproc-per-node", "2", "--resume", "none", *given[1],
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if "worker.train" in line)
    cmd = shlex.split(line)
    args = parse_args(cmd[cmd.index("worker.train") + 1 :])
    assert args.run == RunSpec(**values, resume="none")


def test_a_generated_flag_beats_the_config_and_a_bad_value_names_the_flag(tmp_path):
    plan = tmp_path / "dp2.json"
    plan.write_text(json.dumps(plan_dict([(0, 4)], dp=2)))
    base = ["train", "--plan", str(plan), "--executor", "slurm", "--dry-run", "--nproc-per-node", "2"]
    out = meshplan(tmp_path, "--set", "train.grad_clip_norm=2.0", *base, "--run-id", "o", "--grad-clip-norm", "0.5")
    assert out.returncode == 0, out.stderr
    assert "--grad-clip-norm 0.5" in next(line for line in out.stdout.splitlines() if "worker.train" in line)
    for bad in (["--lr", "0"], ["--collective-timeout-s", "nan"], ["--dtype", "fp8"], ["--grad-clip-norm", "-1"]):
        out = meshplan(tmp_path, *base, *bad)
        assert out.returncode == 1 and out.stderr.startswith(f"error: {bad[0]}="), out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr


def test_submit_stores_every_job_option_given_by_its_generated_flag(tmp_path):
    from flows.job import _train_options
    from storage.jobs import get_job

    values = all_off_default(RunOptions, JOB_OPTIONS)
    job = ["submit", "--model", "tiny", "--global-batch", "8", "--iterations", "4", "--job-id", "j"]
    out = meshplan(tmp_path, *job, *flags(values))
    assert out.returncode == 0, out.stderr
    train = get_job(tmp_path / "meshplan.duckdb", "j")["train"]
    assert train == values
    assert _train_options("j", train) == train  # what the job's runner hands to train_flow


def test_help_lists_a_flag_per_option_with_its_description(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # one line per option: descriptions not wrapped
    for command, names in (("train", list(RunOptions.model_fields)), ("submit", JOB_OPTIONS)):
        out = meshplan(tmp_path, command, "--help")
        assert out.returncode == 0, out.stderr
        for name in names:
            assert flag(name) in out.stdout, (command, name)
        line = next(line for line in out.stdout.splitlines() if "--grad-clip-norm" in line)
        assert RunOptions.model_fields["grad_clip_norm"].description in line and "default 0.0" in line
    assert "--steps" not in meshplan(tmp_path, "submit", "--help").stdout
