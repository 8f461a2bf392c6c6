"""The state folder, one owner for its layout (stdlib only, like the run folder's).

`--state-dir` and `--db` are resolved once, at the CLI's edge, into a `StateDir`; every other layer
is handed its paths (the database, the runs folder) and asks this module for the folders inside
them, so with `--db` outside `--state-dir` a trained run, a queued job, a served placement and a
discovery all land in the one runs folder.

    <state>/meshplan.duckdb           the database (or wherever --db names)
    <db's folder>/backups/            copies of the database (storage/db.py), beside the file they copy
    <state>/prefect/                  Prefect's home (its SQLite database; storage/: task caches)
    <state>/prefect-server.json       the address of `meshplan ui`'s server (flows/server.py); .log its output
    <state>/models/<fingerprint>.json a custom model's ModelSpec that `meshplan train` hands the ranks
    <state>/runs/<run id>/            a training run, a dry run, a queued job, a serving run
    <state>/runs/discover-<stamp>/    a discovery through Slurm (its nodes share it)
    <state>/runs/profile/             the layer profiler's out files (named by content: a rerun resumes)

A run or job id names a folder inside `runs/`: it is made of a safe alphabet (`SAFE_ID`) and
resolved there (`StateDir.run`), so `../../etc` or `/abs/path` can never escape the state folder.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

DB = "meshplan.duckdb"
RUNS = "runs"
PREFECT = "prefect"
BACKUPS = "backups"
MODELS = "models"
SERVER_FILE = "prefect-server.json"
SERVER_LOG = "prefect-server.log"
PROFILE = "profile"
DISCOVER_PREFIX = "discover-"
# letters, digits, '.', '_', '-'; not starting with '.' or '-' (no `..`, no hidden folder, no flag); ≤ 128
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ID_RULE = "use letters, digits, '.', '_' and '-' (up to 128, starting with a letter or digit)"
DUCKDB_MAGIC = b"DUCK"  # bytes 8..12 of every DuckDB database file


def id_problem(value: str) -> str | None:
    """Why `value` cannot name a run folder (None: it can)."""
    if not isinstance(value, str) or not SAFE_ID.match(value):
        return f"not a safe id: {ID_RULE}"
    return None


def db_problem(path: str | Path) -> str | None:
    """Why `path` cannot be meshplan's database (None: a DuckDB file, an empty file, or absent)."""
    p = Path(path)
    if p.is_dir():
        return "is a directory; name a DuckDB file (e.g. <state-dir>/meshplan.duckdb) or leave --db out"
    if not p.exists():
        return None
    if not p.is_file():
        return "is not a regular file; name a DuckDB file or leave --db out"
    try:
        with p.open("rb") as f:
            head = f.read(12)
    except OSError as exc:
        return f"cannot be read ({exc.strerror}); name a DuckDB file you may read or leave --db out"
    if head and head[8:12] != DUCKDB_MAGIC:
        return "is not a DuckDB database file; name a DuckDB file (or a new path) or leave --db out"
    return None


def backups_dir(db: str | Path) -> Path:
    """Where copies of the database at `db` go: beside it (a backup belongs to its file)."""
    return Path(db).parent / BACKUPS


def inside(parent: str | Path, name: str) -> Path:
    """`parent/name` for an id checked against SAFE_ID; ValueError (naming the id) otherwise.

    The resolved folder is checked to lie inside `parent` too, so no id escapes it whatever the
    alphabet allows."""
    problem = id_problem(name)
    base = Path(parent).resolve()
    path = (base / name).resolve() if problem is None else None
    if path is None or path.parent != base:
        raise ValueError(f"id {name!r}: {problem or 'resolves outside ' + str(base)}")
    return path


@dataclass(frozen=True)
class StateDir:
    """The state folder's paths, resolved once (absolute): the database, the runs folder and the rest."""

    root: Path
    db: Path
    runs: Path

    @classmethod
    def of(cls, state_dir: str | Path, db: str | Path | None = None) -> StateDir:
        """From `--state-dir` and `--db` (empty/None: `<state-dir>/meshplan.duckdb`)."""
        root = Path(state_dir).resolve()
        return cls(root, Path(db).resolve() if db else root / DB, root / RUNS)

    @classmethod
    def of_db(cls, db_path: str | Path, runs_dir: str | Path | None = None) -> StateDir:
        """What a flow is handed: the database and the runs folder (None: the one beside the database,
        where a caller with no state folder — a test, a bench — keeps its runs)."""
        db = Path(db_path).resolve()
        runs = Path(runs_dir).resolve() if runs_dir else db.parent / RUNS
        return cls(runs.parent, db, runs)

    @property
    def prefect_home(self) -> Path:
        return self.root / PREFECT

    @property
    def prefect_storage(self) -> Path:
        return self.prefect_home / "storage"

    @property
    def backups(self) -> Path:
        return backups_dir(self.db)

    @property
    def server_file(self) -> Path:
        return self.root / SERVER_FILE

    @property
    def server_log(self) -> Path:
        return self.root / SERVER_LOG

    def model_file(self, fingerprint: str) -> Path:
        return self.root / MODELS / f"{inside(self.root / MODELS, fingerprint).name}.json"

    def run(self, run_id: str) -> Path:
        """A training run's, dry run's, serving run's or job's folder: runs/<id>, the id checked."""
        return inside(self.runs, run_id)

    def job(self, job_id: str) -> Path:
        return self.run(job_id)

    def discovery(self, stamp: str | None = None) -> Path:
        """A discovery's folder (its bench's snapshot and log), named by the UTC time (default: now)."""
        return self.run(DISCOVER_PREFIX + (stamp or time.strftime("%Y%m%d-%H%M%S", time.gmtime())))

    def profiling(self) -> Path:
        return self.runs / PROFILE
