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
    from storage.jobs import get_job, job_options

    values = all_off_default(RunOptions, JOB_OPTIONS)
    job = ["submit", "--model", "tiny", "--global-batch", "8", "--iterations", "4", "--job-id", "j"]
    out = meshplan(tmp_path, *job, *flags(values))
    assert out.returncode == 0, out.stderr
    assert job_options(get_job(tmp_path / "meshplan.duckdb", "j")) == RunOptions(**values, steps=4)


def test_a_jobs_ranks_get_the_configs_train_options_its_sets_and_the_flag_given_on_submit(tmp_path):
    """[train] in a config file, `--set train.<name>=` and one flag on `submit` that beats both: the
    job stores them merged (typed), and its runner's launch puts every one on its ranks' command line
    (job_flow's request on an allocation of 2 CPU ranks, train_flow's launch, the torchrun command)."""
    from cli.commands.run_options import toml_value
    from flows.job import _request
    from flows.train import prepare_launch
    from launcher.launch import torchrun_command
    from planner.scheduler.types import parse_alloc
    from planner.specs.config import TrainConfig
    from storage.jobs import get_job, job_options

    values = all_off_default(RunOptions, JOB_OPTIONS)
    in_config, in_sets = JOB_OPTIONS[::2], JOB_OPTIONS[1::2]
    config = tmp_path / "c.toml"
    config.write_text("[train]\nlr = 1.5\n" + "".join(f"{n} = {toml_value(values[n])}\n" for n in in_config))
    job = ["submit", "--model", "tiny", "--global-batch", "8", "--iterations", "4", "--job-id", "j"]
    sets_given = sets({n: values[n] for n in in_sets} | {"lr": 0.5})  # lr: config 1.5 < --set 0.5 < --lr 0.25
    out = meshplan(tmp_path, "--config", str(config), *sets_given, *job, "--lr", "0.25")
    assert out.returncode == 0, out.stderr
    row = get_job(tmp_path / "meshplan.duckdb", "j")
    want = RunOptions(**{**values, "lr": 0.25, "steps": 4})
    assert job_options(row) == want

    plan = tmp_path / "dp2.json"
    plan.write_text(json.dumps(plan_dict([(0, 4)], dp=2)))
    run_dir = tmp_path / "runs" / "j"
    launch_knobs = TrainConfig(timeout_s=77.0, max_restarts=1)  # the scheduler's [train]: how the runner launches
    request = _request(job_options(row), launch_knobs, plan, parse_alloc("2xcpu/1"), row, run_dir, 0)
    assert (request.timeout_s, request.max_restarts) == (77.0, 1)
    # the values are each field's type's (`--init /tmp/init-value`): what travels is checked here, the
    # --data / --init folders themselves by tests/flows/test_hf_training.py, so their check is off
    _, _, launch = prepare_launch(str(tmp_path / "meshplan.duckdb"), request, "j", check_files=False)
    cmd = torchrun_command(launch)
    args = parse_args(cmd[cmd.index("worker.train") + 1 :])
    assert args.run == RunSpec(**want.model_dump())


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


def test_every_slurm_setting_reaches_the_batch_script(tmp_path):
    """SlurmOptions (planner/specs/slurm.py) travels whole from `train`'s flags to launcher/slurm.py:
    constraint, gres and requeue were once dropped on the way."""
    plan = tmp_path / "dp2.json"
    plan.write_text(json.dumps(plan_dict([(0, 4)], dp=2)))
    slurm = ["--partition", "p1", "--account", "acc", "--time", "01:00:00", "--nodelist", "n[1-2]"]
    slurm += ["--constraint", "a100", "--gres", "gpu:a100:1", "--no-requeue"]
    base = ["train", "--plan", str(plan), "--executor", "slurm", "--dry-run", "--nproc-per-node", "1", "--nnodes", "2"]
    out = meshplan(tmp_path, *base, "--run-id", "s", *slurm)
    assert out.returncode == 0, out.stderr
    lines = {line for line in out.stdout.splitlines() if line.startswith("#SBATCH")}
    want = {"--partition=p1", "--account=acc", "--time=01:00:00", "--nodelist=n[1-2]", "--constraint=a100"}
    want |= {"--gres=gpu:a100:1", "--no-requeue", "--nodes=2"}
    assert {f"#SBATCH {w}" for w in want} <= lines, lines
