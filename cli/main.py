"""`meshplan`: entry point. Loads command modules and turns user mistakes into one-line errors."""

from __future__ import annotations

import importlib
import signal
import sys
from typing import Any

# each module registers its commands on cli.app.app when imported; none imports anything heavy at top
# level. A process imports only the module of the command it runs (`meshplan plan` does not build
# `train`'s generated flags); `meshplan --help`, an unknown command, or `from cli.main import app`
# import them all. tests/test_cli_commands.py checks this table against what the modules register.
COMMANDS: dict[str, str] = {
    "calibrate": "calibrate",
    "compare": "compare",
    "data": "data",
    "export-weights": "data",
    "discover": "discover",
    "export": "export",
    "gpus": "inspect",
    "models": "inspect",
    "db": "inspect",
    "submit": "jobs",
    "jobs": "jobs",
    "cancel": "jobs",
    "schedule-cluster": "jobs",
    "plan": "plan",
    "estimate": "plan",
    "profile": "profile",
    "replan": "replan",
    "replan-every": "replan",
    "schedule": "replan",
    "run": "run",
    "serve-plan": "serve",
    "serve-simulate": "serve",
    "serve": "serve",
    "simulate": "simulate",
    "train": "train",
    "ui": "ui",
}


# The overview `meshplan --help` prints: every command's summary (the first paragraph of its help), in
# the order the modules register them, hidden ones marked. A command line that names no command
# (`meshplan`, `meshplan --help`, a typo) is answered by stand-ins made from this table, importing no
# command module (nor pydantic's RunOptions, which `train`'s flags are generated from): half the
# start-up. tests/test_cli_commands.py checks the overview is the one the real commands print.
SUMMARIES: dict[str, str] = {
    "calibrate": "Fit a runtime's figures (kernel quality, per-micro-batch cost) per device kind on measured runs.",
    "compare": "Price two plans on the same cluster and show their step-time terms and memory side by side.",
    "export-weights": "Consolidate a run's checkpoint (any layout) into Hugging Face weights that transformers loads.",
    "discover": "Discover the hardware: probe compute, memory and network (torchrun), or record a cluster file.",
    "export": "Print a plan in torchtitan's or Megatron-LM's terms; what they cannot say is warned about on stderr.",
    "gpus": "List the GPU catalog (datasheet figures and their sources).",
    "models": "List the model presets.",
    "db": "Show the tables of the meshplan database, or run a SQL query on it (read-only unless --write).",
    "submit": "Queue a training job for the cluster scheduler (training options default to the config's train section).",
    "jobs": "List the queue's jobs (and their transitions).",
    "cancel": "Cancel a queued or running job (recorded as a transition).",
    "schedule-cluster": "Serve scheduler_flow as a deployment on the `meshplan ui` server: one round every --every (Ctrl-C stops).",
    "plan": "Search parallel plans; rank them by predicted step time against two baselines.",
    "estimate": "Price a plan: step-time breakdown, tokens/s, MFU, memory per stage, feasibility.",
    "profile": "Profile layers (forward/backward time, memory) into the database; estimate devices not present.",
    "replan": "Detect stragglers in a run's telemetry, price keep / rebalance / relayout and record the decision.",
    "replan-every": "Re-plan a run on an interval: serves replan_flow as a deployment on the `meshplan ui` server (Ctrl-C stops).",
    "schedule": "Deprecated name of `replan-every`.",
    "run": "Run the whole pipeline on this machine and print a summary of what each stage did.",
    "serve-plan": "Search a placement and compare it with selective replication and one model per group.",
    "serve-simulate": "Per-model SLO attainment, p50/p99 latency and goodput of a placement in the simulator.",
    "serve": "Serve a placement on torch ranks: HTTP POST /models/<name> on 127.0.0.1, latencies into DuckDB.",
    "simulate": "Replay a trace round by round and report JCT, queueing, makespan and utilisation per policy.",
    "train": "Train under a plan with torchrun; telemetry goes to the database, predicted vs measured is reported.",
    "ui": "Start the Prefect UI for this state folder; meshplan commands run meanwhile report to it.",
    "data": "Prepare training data: tokenized, packed, split, with a manifest.",
}
HIDDEN = frozenset({"schedule"})


def load_commands(argv: list[str] | None = None) -> Any:
    """Register the commands `argv` may run on cli.app.app (all of them when `argv` is None) and
    return the app; when `argv` names none, the overview's stand-ins (overview_app). Every word of
    `argv` that is a command name loads its module, so an option value that happens to be one
    (`--config plan`) only loads one more module."""
    if argv is not None and not any(a in COMMANDS for a in argv):
        return overview_app()
    mods = sorted({COMMANDS[a] for a in argv if a in COMMANDS}) if argv is not None else []
    for mod in mods or sorted(set(COMMANDS.values())):
        importlib.import_module(f"cli.commands.{mod}")
    from cli.app import app

    return app


def overview_app() -> Any:
    """cli.app.app's settings and global options with a stand-in per command (SUMMARIES): what a
    command line naming no command needs, its help, `Missing command` or `No such command` with
    the close names, without importing the commands."""
    import copy

    from cli.app import app

    overview = copy.copy(app)
    overview.registered_commands, overview.registered_groups = [], []
    for name, summary in SUMMARIES.items():
        overview.command(name, help=summary, hidden=name in HIDDEN)(_stand_in)
    return overview


def _stand_in() -> None:
    raise RuntimeError("a stand-in command ran: a command line naming a command loads its module (cli.main.COMMANDS)")


def __getattr__(name: str) -> Any:
    """`from cli.main import app`: the app with every command registered (tests, typer's CliRunner)."""
    if name == "app":
        return load_commands()
    raise AttributeError(name)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; every user mistake (a bad option value or type too, not only a MeshplanError) is
    one line on stderr and exit 1, so scripts see one convention. Anything else is a bug and keeps
    its traceback."""
    # SIGTERM must unwind normally so an ephemeral Prefect server child is stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # SIGKILL runs no handler: a watchdog stops what this command started once it is gone (launcher/lifeline.py)
    from flows.lifeline import tie_children

    tie_children()
    try:
        rc = run_cli(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        rc = 130
    if rc == 130:  # Ctrl-C (typer turns it into exit 130): what it started is stopped, its run row closed
        print(INTERRUPTED, file=sys.stderr)
    sys.exit(rc)


INTERRUPTED = "error: interrupted (Ctrl-C): what it started was stopped, a run it launched is closed as killed"


_BUILT: dict[str, Any] = {}


def run_cli(argv: list[str]) -> int:
    """The CLI on `argv`, in this process; returns the exit code (the fuzz tests call it directly)."""
    from typer.main import get_command

    if not argv:  # `meshplan` alone: the overview, not an error
        argv = ["--help"]
    app = load_commands(argv)
    # typer builds the click command from the registered commands; built again only when a command
    # module registered more (one process running many lines: the fuzz, tests)
    key = tuple(id(c) for c in app.registered_commands)
    if _BUILT.get("key") != key:
        _BUILT.update(key=key, command=get_command(app))
    command = _BUILT["command"]
    try:
        rc = command.main(args=argv, prog_name="meshplan", standalone_mode=False)
    except Exception as exc:
        line = user_error_line(exc, argv)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 1
    return rc if isinstance(rc, int) else 0


def user_error_line(exc: BaseException, argv: list[str]) -> str | None:
    """The one line for a user's mistake, or None when `exc` is not one."""
    # typer 0.29 vendors click: its usage errors live in typer._click (BadParameter, Abort are public)
    from typer import Abort, BadParameter
    from typer._click.exceptions import ClickException, MissingParameter, UsageError

    from cli.app import disk_full_line
    from planner.errors import MeshplanError

    full = disk_full_line(exc)
    if full is not None:
        return full
    late = prefect_start_line(exc)
    if late is not None:
        return late
    if isinstance(exc, MissingParameter) and exc.param is not None:
        return f"{_flag_of(exc.param)}: required; see {_help(argv)}"
    if isinstance(exc, BadParameter) and exc.param is not None:
        flag = _flag_of(exc.param)
        value = _typed_value(flag, argv)
        shown = f"{flag}={value!r}" if value is not None else flag
        message = exc.message.rstrip(".")
        return f"{shown}: {message[:1].lower()}{message[1:]}; see {_help(argv)}"
    if isinstance(exc, UsageError):
        return f"{exc.format_message().rstrip('.')}; see {_help(argv)}"
    if isinstance(exc, ClickException):
        return exc.format_message()
    if isinstance(exc, Abort):
        return "aborted"
    if isinstance(exc, MeshplanError | FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError):
        return str(exc)
    if type(exc).__name__ in {"StoreLockedError", "StoreDamagedError", "UserError"}:
        return str(exc)
    return None


def prefect_start_line(exc: BaseException) -> str | None:
    """The one line for Prefect's temporary server not answering within its startup allowance (a busy
    machine: its first start migrates a fresh SQLite DB; a port another process took first), or None."""
    import os

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, RuntimeError) and "ephemeral Prefect API server" in str(seen):
            limit = os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
            return (
                f"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS={limit}: Prefect's temporary server did not "
                "answer in time (the machine is busy); run the command again, raise that setting, or keep "
                "one server up with `meshplan ui` (commands on this state folder then use it)"
            )
        seen = seen.__cause__ or seen.__context__
    return None


def _flag_of(param: object) -> str:
    opts = getattr(param, "opts", None) or [getattr(param, "name", "?")]
    longs = [o for o in opts if o.startswith("--")]
    return (longs or opts)[0]


def _typed_value(flag: str, argv: list[str]) -> str | None:
    """What the user typed after `flag` (`--flag V` or `--flag=V`), the last time they typed it."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1 :]
    return value


def _help(argv: list[str]) -> str:
    """`meshplan CMD --help` for the command the user typed (or `meshplan --help`)."""
    cmd = next((a for a in argv if a in COMMANDS), None)
    return f"`meshplan {cmd} --help`" if cmd else "`meshplan --help`"


if __name__ == "__main__":
    main()
