"""Open the DuckDB file briefly, apply migrations once, retry when another process holds the lock."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import duckdb
import polars as pl

LOCK_WAIT_S = 60.0
_migrated: set[str] = set()


class StoreLockedError(RuntimeError):
    """Another process kept the DuckDB file locked for longer than the wait allowed."""


def _open(path: Path, read_only: bool, wait_s: float) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + wait_s
    delay = 0.01
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                if "lock" in str(exc).lower():
                    raise StoreLockedError(
                        f"{path} stayed locked by another process for {wait_s:.0f} s; wait for it to finish"
                    ) from exc
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.5)


@contextmanager
def connect(
    path: str | Path, read_only: bool = False, wait_s: float = LOCK_WAIT_S
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection to the store at `path`, migrated to the latest schema."""
    path = Path(path)
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.exists():
        raise FileNotFoundError(f"no meshplan database at {path}; run `meshplan discover` first")
    con = _open(path, read_only, wait_s)
    try:
        if not read_only and str(path.resolve()) not in _migrated:
            migrate(con)
            _migrated.add(str(path.resolve()))
        yield con
    finally:
        con.close()


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every storage/schema/NNNN_name.sql, in order."""
    out = []
    for f in resources.files("storage.schema").iterdir():
        if f.name.endswith(".sql"):
            version = int(f.name.split("_", 1)[0])
            out.append((version, f.name, f.read_text()))
    return sorted(out)


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Apply pending migrations, each in its own transaction; safe to run any number of times."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)"
    )
    done = {v for (v,) in con.execute("SELECT version FROM schema_version").fetchall()}
    applied = 0
    for version, name, sql in migrations():
        if version in done:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(sql)
            con.execute("INSERT INTO schema_version VALUES (?, ?, now())", [version, name])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        applied += 1
    return applied


def schema_version(path: str | Path) -> int:
    with connect(path) as con:
        return con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchall()[0][0]


def query(path: str | Path, sql: str, params: list | None = None) -> pl.DataFrame:
    """Run a read query and return a polars frame."""
    with connect(path) as con:
        return con.sql(sql, params=params).pl() if params else con.sql(sql).pl()


def tables(path: str | Path) -> pl.DataFrame:
    with connect(path) as con:
        return con.sql(
            "SELECT t.table_name AS table, t.estimated_size AS rows, t.column_count AS columns "
            "FROM duckdb_tables() t ORDER BY t.table_name"
        ).pl()
