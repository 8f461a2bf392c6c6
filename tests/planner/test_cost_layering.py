"""The cost model and search stay in the pure core: no Prefect, DuckDB or torch when imported."""

import pkgutil
import subprocess
import sys

import planner.cost
import planner.search


def test_cost_and_search_modules_import_nothing_heavy():
    mods = [f"planner.cost.{m.name}" for m in pkgutil.iter_modules(planner.cost.__path__)]
    mods += [f"planner.search.{m.name}" for m in pkgutil.iter_modules(planner.search.__path__)]
    assert "planner.search.oracle" in mods and "planner.cost.estimate" in mods
    code = (
        "import sys; "
        + "; ".join(f"import {m}" for m in mods)
        + "; print(sorted({m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert not {"prefect", "duckdb", "torch"} & set(eval(out))


def test_plan_command_help_is_instant():
    code = "import sys, flows.cli; print(sorted({m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert not {"prefect", "duckdb", "torch", "numpy", "planner"} & set(eval(out))
