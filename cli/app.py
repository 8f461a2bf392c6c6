"""The typer app and what every command shares: config loading, state paths, Prefect settings.

Command modules (cli/commands/*.py) import only typer, this module and the training options their
flags are generated from (planner/specs/runspec.py, pydantic) at top level, so `meshplan --help`
answers without importing torch, Prefect or DuckDB.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from planner.specs.config import RunConfig
    from rundir import StateDir

app = typer.Typer(
    name="meshplan",
    help="Plan and run large-transformer training on the mixed GPUs you actually have.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@dataclass
class Globals:
    config_file: Path | None = None
    overrides: list[str] = field(default_factory=list)
    state_dir: Path | None = None
    db: Path | None = None


G = Globals()


@app.callback()
def _globals(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="meshplan TOML config file")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a config field: section.key=value")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="state folder (DuckDB file, Prefect home, runs)")] = None,
    db: Annotated[Path | None, typer.Option(help="DuckDB file (default <state-dir>/meshplan.duckdb)")] = None,
) -> None:
    G.config_file, G.overrides, G.state_dir, G.db = config, list(set_ or []), state_dir, db


def load_settings(extra: list[str] | None = None, flags: dict[str, str] | None = None) -> RunConfig:
    """The RunConfig: embedded defaults < config file < --set < command options (`extra`).

    `flags` maps a config field a command option sets ("search.global_batch") to that option
    ("--global-batch"): a bad value is then named by the flag the user typed, not as `--set`."""
    from planner.errors import MeshplanError
    from planner.specs.config import load_config

    if extra and flags:
        try:
            load_config(None, list(extra), origin="--set")
        except MeshplanError as exc:
            key = str(exc.field).split(": ", 1)[-1]
            if key in flags:
                raise MeshplanError(flags[key], exc.value, exc.fix) from None
            raise

    text = None
    if G.config_file is not None:
        from planner.inputs import read_input

        text = read_input(G.config_file, "--config", "config", "a meshplan TOML file")
    if G.overrides and extra:
        # the file and --set alone first: a bad --set value is refused even where a command option
        # sets the same field after it (--set search.global_batch=abc beside --global-batch 8)
        load_config(text, list(G.overrides), origin="--set")
    overrides = list(G.overrides) + list(extra or [])
    if G.state_dir is not None:
        overrides.append(f"state.dir={_toml_str(str(G.state_dir))}")
    if G.db is not None:
        overrides.append(f"state.db={_toml_str(str(G.db))}")
    return load_config(text, overrides, origin=str(G.config_file or "--set"))


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def state(cfg: RunConfig) -> StateDir:
    """The state folder's paths (rundir/state.py), resolved once from `--state-dir` / `--db` (or the
    config's `[state]`); a `--db` that is not a DuckDB file (a directory, a CSV) is refused here,
    before anything is stored."""
    from planner.errors import MeshplanError
    from rundir import StateDir, db_problem

    if cfg.state.db:
        problem = db_problem(cfg.state.db)
        if problem:
            raise MeshplanError("--db" if G.db is not None else "state.db", cfg.state.db, problem)
    return StateDir.of(cfg.state.dir, cfg.state.db or None)


def check_id(flag: str, value: str | None) -> None:
    """A run or job id names a folder in the state folder's runs/: refuse one that could leave it."""
    from planner.errors import MeshplanError
    from rundir import id_problem

    problem = None if value is None else id_problem(value)
    if problem:
        raise MeshplanError(flag, value, problem)


def db_path(cfg: RunConfig) -> Path:
    return state(cfg).db


MIN_FREE_BYTES = 64 << 20  # a train's working room in the state folder: DuckDB's WAL, Prefect's SQLite, a run's files
SMALL_WRITE_BYTES = 8 << 20  # plan, submit: a few DuckDB pages and a plan file


def _free_bytes(path: Path) -> tuple[Path, int]:
    """(the nearest existing folder of `path`, bytes free there)."""
    import shutil

    here = path
    while not here.exists() and here != here.parent:
        here = here.parent
    return here, shutil.disk_usage(here).free


def need_space(cfg: RunConfig, *more: Path | None, need: int = MIN_FREE_BYTES) -> None:
    """Refuse a command that writes before it writes anything, when the state folder (or an output
    path in `more`) has less than `need` bytes free: one line naming the folder and the room needed."""
    from planner.errors import MeshplanError

    for path in (Path(cfg.state.dir), db_path(cfg).parent, *(p for p in more if p is not None)):
        where, free = _free_bytes(Path(path).resolve())
        if free < need:
            raise MeshplanError(
                "disk",
                str(where),
                f"{free >> 20} MiB free; this command needs at least {need >> 20} MiB there: free space or "
                "pass --state-dir on another disk",
            )


def disk_full_line(exc: BaseException) -> str | None:
    """One line for a full disk met mid-command (ENOSPC anywhere in the exception's chain: an OSError,
    or DuckDB's IO error whose rollback then failed too): the path and the room needed; None otherwise."""
    import errno
    import re

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in text:
            path = getattr(e, "filename", None) or next(iter(re.findall(r'"(/[^"]+)"', text)), None)
            where = f" writing {path}" if path else ""
            free = ""
            if path:
                folder, left = _free_bytes(Path(path).resolve().parent)
                free = f" ({folder} has {left >> 20} MiB free)"
            return (
                f"disk full{where}{free}: meshplan needs at least {MIN_FREE_BYTES >> 20} MiB free there; "
                "free space (or pass --state-dir on another disk) and rerun — a run it started is closed, not running"
            )
        e = e.__cause__ or e.__context__
    return None


def _check_startup_timeout(value: str) -> None:
    """Prefect reads PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as whole seconds; anything else
    is its settings traceback at the first flow run, so it is refused here in one line."""
    from planner.errors import MeshplanError

    if not value.strip().isdigit() or int(value) < 1:
        raise MeshplanError(
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
            value,
            "set it to a whole number of seconds ≥ 1, e.g. 120",
        )


def prefect_env(cfg: RunConfig) -> None:
    """Offline, private Prefect settings; call before the first `import prefect`.

    Prefect's home (its SQLite DB and result storage, where task caches live) goes inside the state
    folder unless the user already chose one; analytics are off so nothing leaves the machine.
    """
    paths = state(cfg)
    paths.prefect_home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(paths.prefect_home))
    os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", str(Path(os.environ["PREFECT_HOME"]) / "storage"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    _check_startup_timeout(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"])
    os.environ.setdefault("PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    _hide_user_error_tracebacks()
    if "PREFECT_API_URL" not in os.environ:
        from flows.server import running_api_url

        url = running_api_url(paths.root)  # a `meshplan ui` server for this state folder
        if url:
            os.environ["PREFECT_API_URL"] = url
        else:  # a Ctrl-C must not reach Prefect's temporary server before the command has used it
            from flows.server import temporary_server_in_own_session

            temporary_server_in_own_session()


class _UserErrorFilter:
    """Drops Prefect's traceback log for a user's mistake: the CLI prints it as one line instead.

    The flow run still ends Failed with the message in Prefect's database and UI.
    """

    def filter(self, record: object) -> bool:
        from planner.errors import MeshplanError

        exc = getattr(record, "exc_info", None)
        if exc and (isinstance(exc[1], MeshplanError) or type(exc[1]).__name__ == "StoreDamagedError"):
            return False
        text = record.getMessage() if hasattr(record, "getMessage") else ""
        # a Ctrl-C is reported once, by the entry point (cli/main.py); the run is Crashed in Prefect's DB
        hidden = ("MeshplanError", "UnknownNameError", "StoreDamagedError", "aborted by an interrupt signal")
        return not any(name in text for name in hidden)


def _hide_user_error_tracebacks() -> None:
    import logging

    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _UserErrorFilter) for f in logger.filters):
            logger.addFilter(_UserErrorFilter())


def check_output(path: Path | None, flag: str, *inputs: Path | str | None) -> None:
    """Refuse an output path that is one of the command's inputs (or the config or DuckDB file), or a
    folder: outputs never overwrite inputs. Checked before any work, so nothing is written."""
    from planner.errors import MeshplanError

    if path is None:
        return
    if path.is_dir():
        raise MeshplanError(flag, str(path), "a folder; pass a file name to write")
    if not path.exists():
        return
    given = [Path(p) for p in (*inputs, G.config_file, G.db) if p is not None]
    if G.state_dir is not None:
        given.append(Path(G.state_dir) / "meshplan.duckdb")
    for p in given:
        try:
            same = p.exists() and path.samefile(p)
        except OSError:
            same = False
        if same:
            raise MeshplanError(flag, str(path), f"that is an input of this command ({p}); write to another file")
