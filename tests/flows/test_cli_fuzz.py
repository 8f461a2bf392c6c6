"""Property: every `meshplan` command, driven with generated options and files, either succeeds or
exits 1 with one line naming the flag or field — no traceback, no other exit code, no hang — and
the DuckDB file still opens with every job it queued.

In-process (cli.main.run_cli, the console script's own path) with a few examples per command to
stay within CI's time; bench/fuzz_cli.py runs the same generator and oracle with thousands.
Launching commands (train, run, profile, ui) get a value that must be refused before anything
starts; an `ok` from them would mean something launched, and fails the test.
"""

import os

import pytest
from hypothesis import HealthCheck, given, settings

from tests.support.fuzz_cli import COMMANDS, LAUNCHERS, Files, command_line, db_intact, outcome

EXAMPLES = {"gpus": 1, "models": 1}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_cli")
    old = os.getcwd()
    os.chdir(root)  # relative names the generator uses (missing.json) resolve in here
    env = {k: os.environ.get(k) for k in ("PREFECT_HOME", "PREFECT_API_URL")}
    os.environ["PREFECT_HOME"] = str(root / "prefect")
    os.environ.pop("PREFECT_API_URL", None)
    yield Files(root)
    os.chdir(old)
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_succeeds_or_names_the_flag_in_one_line(files, command):
    queued: set[str] = set()

    @settings(
        max_examples=EXAMPLES.get(command, 5),
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(argv=command_line(command, files, cheap=True))
    def check(argv):
        kind, detail = outcome(argv, files, timeout_s=60)
        assert kind != "crash", detail
        if command in LAUNCHERS or command == "discover":  # cheap: a bad --num-ranks
            assert kind == "error", f"{argv}: accepted; this would have launched"
        if command == "submit" and kind == "ok":
            queued.add(detail.splitlines()[-1])

    check()
    assert db_intact(files, queued) is None


def test_the_issues_cases_name_the_flag_typed(files, tmp_path):
    """The inputs issue #31 found accepted or answered in other terms, each now one line naming the flag."""
    cases = {
        ("plan", "--global-batch", "99999999999999999999"): "--global-batch=",
        ("plan", "--global-batch", "-64"): "--global-batch=",
        ("plan", "--global-batch", "abc"): "--global-batch=",
        ("submit", "--model", "tiny", "--iterations", "3", "--global-batch", "999999999999"): "--global-batch=",
        (
            "submit",
            "--model",
            "tiny",
            "--iterations",
            "3",
            "--global-batch",
            "8",
            "--gpu-kinds",
            "h900",
        ): "meshplan gpus",
        (
            "submit",
            "--model",
            "tiny",
            "--iterations",
            "3",
            "--global-batch",
            "8",
            "--deadline-s",
            "-100",
        ): "--deadline-s=",
    }
    for argv, expected in cases.items():
        kind, line = outcome(list(argv), files)
        assert kind == "error" and expected in line, (argv, kind, line)
