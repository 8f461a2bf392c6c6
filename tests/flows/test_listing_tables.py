"""Every listing command, at 80 columns in a pipe (captured stdout: rich's width is $COLUMNS): a header row,
no name cut to "…", no line wider than 80; and --format json/csv carry every row."""

import csv
import io
import json
import os
import subprocess
import sys

import pytest

from planner.specs.catalog import CATALOG
from planner.specs.model import PRESETS

LISTINGS = [("gpus",), ("models",), ("db",), ("jobs",), ("jobs", "--events")]


def _cli(tmp_path, *args):
    env = dict(os.environ, COLUMNS="80", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp_path), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    from storage.jobs import cancel_job, submit_job

    path = tmp_path_factory.mktemp("state")
    db = path / "meshplan.duckdb"
    submit_job(db, "llama3-405b", 64, 10, job_id="a-job-with-a-long-name-that-must-stay-whole")
    submit_job(db, "tiny-llama", 64, 10, job_id="b")
    cancel_job(db, "b")
    return path


@pytest.mark.parametrize("args", LISTINGS, ids=" ".join)
def test_a_listing_stays_whole_at_80_columns_in_a_pipe(state, args):
    out = _cli(state, *args)
    assert "…" not in out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    lines = out.splitlines()
    names = {
        "gpus": CATALOG,
        "models": PRESETS,
        "db": ["configs", "jobs", "layer_profiles", "schema_version", "step_metrics"],  # first, last, between
        "jobs": ["a-job-with-a-long-name-that-must-stay-whole", "b"],
    }[args[0]]
    first = {"gpus": "name", "models": "name", "db": "table", "jobs": "job_id"}[args[0]]
    assert lines[1].split()[0] == first  # a title, then the header row
    cells = {line.split()[0] for line in lines[2:] if line.strip()}
    assert set(names) <= cells  # every name whole, no row hidden
    if args == ("db",):  # every table: 17 and counting
        assert len([c for c in cells if c.islower()]) >= 17


@pytest.mark.parametrize(
    "args, rows", [(("gpus", "csv"), len(CATALOG)), (("models", "csv"), len(PRESETS)), (("jobs", "json"), 2)]
)
def test_json_and_csv_carry_every_row(state, args, rows):
    out = _cli(state, args[0], "--format", args[1])
    table = json.loads(out) if args[1] == "json" else list(csv.DictReader(io.StringIO(out)))
    assert len(table) == rows and all(r[next(iter(r))] for r in table)


def test_an_unknown_format_is_one_line_naming_the_flag():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "cli", "gpus", "--format", "xml"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0 and "--format" in p.stderr and "csv" in p.stderr
