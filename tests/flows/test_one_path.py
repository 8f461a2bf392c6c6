"""One path per stage: `meshplan plan` (subprocess, real DuckDB file) and plan_flow (a real Prefect
flow run) rank the same plans for the same inputs, and every search shares one time-budget default."""

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.specs.config import SearchConfig

ROOT = Path(__file__).parents[2]

pytestmark = pytest.mark.flow

# Two GPU kinds on two nodes: small enough that the search completes well inside the default budget
# (a search the clock cut could rank differently from one run to the next, whichever path ran it).
SMALL_MIXED = """
name = "small-mixed"

[[nodes]]
name = "a100"
device = "A100-SXM4-40GB"
num_devices = 2
intra_link = "nvlink3"
inter_link = "eth-100g"

[[nodes]]
name = "t4"
device = "T4"
num_devices = 2
intra_link = "pcie3"
inter_link = "eth-100g"
"""


def cli(tmp_path, *args, timeout=300):
    cmd = [sys.executable, "-m", "cli", "--state-dir", str(tmp_path / "state"), *args]
    env = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


def stored_ranking(db, key):
    from storage.plans import plans_frame

    frame = plans_frame(db, key)
    rows = sorted(frame.filter(frame["baseline"] == "").iter_rows(named=True), key=lambda r: r["rank"])
    return [(r["plan_fingerprint"], r["step_time_s"]) for r in rows]


def test_plan_cli_and_plan_flow_return_the_same_ranking(tmp_path):
    from flows.plan import plan_flow

    cluster = tmp_path / "small-mixed.toml"
    cluster.write_text(SMALL_MIXED)
    # every option left at its default but the batch: the CLI's defaults are RunConfig's, the flow's too
    p = cli(tmp_path, "plan", "--model", "gpt2-small", "--cluster", str(cluster), "--global-batch", "16", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["stats"]["complete"], doc["search"]
    assert doc["dtype"] == "bf16" and doc["calibration"] is None  # a cluster file of GPUs: the datasheet model
    from planner.specs.plan import parse_plan

    plans = [parse_plan(q, "meshplan plan --json") for q in doc["plans"]]
    cli_ranking = [(q.fingerprint(), q.predicted.step_time_s) for q in plans]
    assert [f for f, _ in cli_ranking] == [r["fingerprint"] for r in doc["ranking"]][: len(plans)]  # then baselines
    assert len(cli_ranking) >= 2

    flow_db = str(tmp_path / "flow.duckdb")  # its own file: the flow's rows are its own, not the CLI's
    out = plan_flow(flow_db, "gpt2-small", SearchConfig(global_batch=16), str(cluster))
    assert out.feasible and out.complete
    assert out.search_key == doc["search_key"]
    flow_ranking = stored_ranking(flow_db, out.search_key)
    assert [f for f, _ in flow_ranking] == [f for f, _ in cli_ranking]
    assert [t for _, t in flow_ranking] == pytest.approx([t for _, t in cli_ranking], rel=1e-12)
    # and the CLI's own stored rows agree with what it printed
    assert stored_ranking(tmp_path / "state" / "meshplan.duckdb", doc["search_key"]) == cli_ranking


def test_every_search_shares_one_time_budget_default():
    # plan_flow and the pipeline take SearchConfig whole: its default is theirs
    from flows.replan import monitor_config
    from flows.scheduler import scheduler_flow
    from planner.replan.monitor import MonitorConfig
    from planner.replan.options import replan
    from planner.scheduler.speed import PlannerSpeed
    from planner.search import search
    from planner.specs.config import SEARCH_BUDGET_S, ReplanConfig, SearchConfig

    def default(fn, name):
        return inspect.signature(fn).parameters[name].default

    budgets = {
        "SearchConfig": SearchConfig().time_budget_s,
        "ReplanConfig": ReplanConfig().search_budget_s,
        "search": default(search, "time_budget_s"),
        "scheduler_flow": default(scheduler_flow.fn, "time_budget_s"),
        "PlannerSpeed": default(PlannerSpeed.__init__, "time_budget_s"),
        "replan": default(replan, "search_budget_s"),
        "monitor_config": default(monitor_config, "search_budget_s"),
        "MonitorConfig": MonitorConfig().search_budget_s,
    }
    assert budgets == dict.fromkeys(budgets, SEARCH_BUDGET_S)
