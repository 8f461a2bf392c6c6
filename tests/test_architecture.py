"""The house's arrows hold: import-linter checks every contract in pyproject.toml, and the CLI's
`--help` path, and the core in a fresh interpreter, load nothing heavy."""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = {"prefect", "duckdb", "torch"}


def _loaded(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print(','.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return set(out.strip().split(","))


def test_every_import_contract_of_the_design_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_importing_every_core_module_loads_no_prefect_duckdb_or_torch():
    mods = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "planner").rglob("*.py")
    )
    assert "planner.search.oracle" in mods and "planner.cost.estimate" in mods
    assert not _loaded("; ".join(f"import {m}" for m in mods)) & HEAVY


def test_cli_help_imports_nothing_heavy():
    # `meshplan --help` registers every command (cli.main.load_commands with no command named)
    assert not _loaded("import cli.main; cli.main.load_commands()") & (HEAVY | {"numpy", "polars", "storage", "tasks"})

    # of the core, only the option bounds (planner/limits.py: constants, no imports) and the training
    # options `train` and `submit` generate their flags from (planner/specs/runspec.py and its imports:
    # pydantic, no model, plan or catalog)
    code = "import sys, cli.main; cli.main.load_commands(); print(','.join(sorted(m for m in sys.modules if m.startswith('planner'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    runspec = {"planner.specs", "planner.specs.runspec", "planner.specs.faults", "planner.errors", "planner.validation"}
    assert set(out.strip().split(",")) <= {"planner", "planner.limits", *runspec}, out


def test_no_lower_room_names_a_flow_or_the_cli_module_in_a_string():
    """An arrow import-linter cannot see: `python -m flows.job` started by a task, or b"flows.job"
    looked for in /proc. A lower room may start `worker.*` by name, never a module of flows or cli."""
    upward = re.compile(r"^(flows|cli)(\.\w+)+$")
    found = []
    for room in ("planner", "rundir", "storage", "launcher", "worker", "tasks"):
        for path in (ROOT / room).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
                    text = node.value.decode(errors="replace") if isinstance(node.value, bytes) else node.value
                    if upward.match(text.strip()):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, found


def test_storage_loads_no_prefect_or_torch():
    assert not _loaded("import storage.db, storage.files") & {"prefect", "torch"}


def test_code_is_lint_clean_and_formatted_as_ruff_formats_it():
    ruff = Path(sys.executable).with_name("ruff")
    for args in (["check", "."], ["format", "--check", "."]):
        proc = subprocess.run([str(ruff), *args], capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, f"ruff {' '.join(args)}:\n{proc.stdout[-3000:]}"
