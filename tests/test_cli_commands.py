"""cli.main.COMMANDS, the table a process loads only its command's module by, names every command
each module registers, and `meshplan plan` loads neither the other commands' modules nor `train`'s
generated flags (pydantic's RunOptions)."""

import importlib
import json
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


def test_the_overview_is_the_real_commands_one_and_loads_none_of_them():
    """`meshplan --help` (and a typo) is answered from cli.main.SUMMARIES without importing a command
    module: what it prints is what the real commands print, and no command module or RunOptions loads."""
    # in a fresh process: the suite's earlier in-process CLI runs leave state on cli.app.app behind
    compare = (
        "import json; from typer.testing import CliRunner; from cli.main import load_commands, overview_app; "
        "r = CliRunner(); out = []\n"
        "for args in (['--help'], ['plna'], []):\n"
        "    s = r.invoke(overview_app(), args, env={'COLUMNS': '100'}); "
        "a = r.invoke(load_commands(), args, env={'COLUMNS': '100'}); "
        "out.append([args, s.output, s.exit_code, a.output, a.exit_code])\n"
        "print(json.dumps(out))"
    )
    got = subprocess.run([sys.executable, "-c", compare], capture_output=True, text=True, check=True, cwd=ROOT)
    for args, stand_out, stand_rc, real_out, real_rc in json.loads(got.stdout):
        assert (stand_out, stand_rc) == (real_out, real_rc), args
    code = (
        "import sys; from cli.main import run_cli; run_cli(['--help']); "
        "print(','.join(sorted(m for m in sys.modules if m.startswith(('cli.commands', 'planner.specs.runspec', "
        "'pydantic', 'flows.queries')))), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "Search parallel plans" in out.stdout
    assert out.stderr.strip() == ""
