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
from tests.support.cli import session_prefect_api

LISTINGS = [("gpus",), ("models",), ("db",), ("jobs",), ("jobs", "--events")]


def _cli(tmp_path, *args):
    # a command that runs a flow (discover) reports to the session's Prefect server instead of starting one
    env = dict(os.environ, COLUMNS="80", OMP_NUM_THREADS="1", PREFECT_API_URL=session_prefect_api())
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


PHILLY = "examples/clusters/philly-mixed-1280.toml"  # three kinds, the longest names of the catalog


def test_plan_estimate_and_discover_tables_stay_whole_at_80_columns(tmp_path):
    """The tables users read most: the ranked plans (a mixed 1,280-GPU cluster), a plan's price and memory
    per stage, a recorded cluster's devices and links: no "…", no line over 80, every kind named whole."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    best = tmp_path / "best.json"
    outs = {
        "plan": _cli(tmp_path, "plan", "--model", "llama3-8b", "--cluster", str(root / PHILLY), "--out", str(best)),
        "estimate": _cli(tmp_path, "estimate", "--plan", str(best), "--cluster", str(root / PHILLY)),
        "discover": _cli(tmp_path, "discover", "--cluster", str(root / PHILLY)),
    }
    for name, out in outs.items():
        assert "…" not in out, (name, out)
        lines = [line for line in out.splitlines() if str(tmp_path) not in line]  # a path may be long
        assert all(len(line) <= 80 for line in lines), (name, out)
    assert "V100-SXM2-32GB" in outs["estimate"] and outs["plan"].splitlines()[1].split()[:2] == ["#", "layout"]
    kinds = {"A100-SXM4-40GB", "V100-SXM2-32GB", "A40", "A10"}
    assert kinds <= set(outs["discover"].split()), outs["discover"]
