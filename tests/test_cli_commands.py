"""cli.main.COMMANDS, the table a process loads only its command's module by, names every command
each module registers, and `meshplan plan` loads neither the other commands' modules nor `train`'s
generated flags (pydantic's RunOptions)."""

import importlib
import subprocess
import sys
from pathlib import Path

from cli.main import COMMANDS, load_commands

ROOT = Path(__file__).resolve().parent.parent


def test_the_command_table_names_every_registered_command_with_its_module():
    app = load_commands()
    registered = {
        (c.name or c.callback.__name__.replace("_", "-")): c.callback.__module__.removeprefix("cli.commands.")
        for c in app.registered_commands
    }
    for g in app.registered_groups:  # `meshplan data prepare`: a group's module is its commands'
        registered[g.name] = g.typer_instance.registered_commands[0].callback.__module__.removeprefix("cli.commands.")
    assert registered == COMMANDS
    assert {p.stem for p in (ROOT / "cli" / "commands").glob("*.py")} >= set(COMMANDS.values())
    assert importlib.import_module("cli.main").app is app


def test_a_command_loads_only_its_own_module():
    code = (
        "import sys; from cli.main import load_commands; load_commands(['--state-dir', 'x', 'plan', '--help']); "
        "print(','.join(sorted(m for m in sys.modules if m.startswith(('cli.commands.', 'planner.specs.runspec')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert set(out.strip().split(",")) <= {"cli.commands.plan", "cli.commands.calibrate", "cli.commands.model_options"}
