"""The pure core stays pure: importing planner loads no Prefect, DuckDB or torch."""

import subprocess
import sys

FORBIDDEN = ("prefect", "duckdb", "torch")


def _loaded(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print(','.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.strip().split(","))


def test_import_planner_loads_no_prefect_duckdb_or_torch():
    import pkgutil

    import planner

    mods = [f"planner.{m.name}" for m in pkgutil.walk_packages(planner.__path__)]
    loaded = _loaded("; ".join(f"import {m}" for m in mods))
    assert not loaded & set(FORBIDDEN), loaded & set(FORBIDDEN)


def test_storage_loads_no_prefect_or_torch():
    loaded = _loaded("import storage.db")
    assert "prefect" not in loaded and "torch" not in loaded


def test_cli_help_imports_nothing_heavy():
    loaded = _loaded("import flows.cli")
    assert not loaded & set(FORBIDDEN), loaded & set(FORBIDDEN)
