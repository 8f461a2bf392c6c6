"""Open the DuckDB file briefly, apply migrations once, retry when another process holds the lock.

Turns: DuckDB's lock on the file refuses at once (no queue), so a process polling for it can starve
while another writes back to back — each gap between that one's connections shorter than the
poll's sleep (two writers under load: one waited past LOCK_WAIT_S and failed). A connection first
takes its turn (`_turn`): a blocking flock on `<file>.lock` (shared for read-only, exclusive for a
writer), taken while holding a turnstile, an flock on `<file>.turn`, so a process that has just let
go cannot take it back ahead of one already waiting (Linux wakes flock waiters but does not queue
them: the one that let go, still running, won the race). DuckDB's own lock stays the guard against
other programs (polled in `_open`).

Damage is named, never a traceback: a file DuckDB cannot read (garbage, truncated, bad checksums)
or a table of the schema that is gone raises StoreDamagedError — the file, what is wrong, and how
to recover — which the CLI prints as one line. Recovery needs a copy: the file is backed up to
`<folder>/backups/` before migrations change an existing file and before `meshplan db --write`,
and `restore` (`meshplan db --restore`) brings the newest copy back, keeping the damaged file aside.
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

import rundir

if TYPE_CHECKING:  # polars is imported by the reads that return frames, not by `meshplan plan`
    import polars as pl

LOCK_WAIT_S = 60.0
KEEP_BACKUPS = 3  # per database file; each is a whole copy
_migrated: set[str] = set()
# what DuckDB says when the bytes of the file, not the query, are wrong
_DAMAGE = ("not a valid duckdb database", "could not read enough bytes", "checksum", "corrupt", "invalid block")
_MISSING_TABLE = re.compile(r"Table with name (\w+) does not exist")


class StoreLockedError(RuntimeError):
    """Another process kept the DuckDB file locked for longer than the wait allowed."""


class StoreDamagedError(RuntimeError):
    """The DuckDB file cannot be used as it is; the message names the file, the damage and the way out."""

    def __init__(self, path: Path, what: str) -> None:
        self.path, self.what = path, what
        super().__init__(f"{path} is damaged ({what}); {recovery_hint(path)}")


def backup_dir(path: Path) -> Path:
    return rundir.backups_dir(path)


def backups(path: str | Path) -> list[Path]:
    """Backups of the database at `path`, newest first."""
    path = Path(path)
    found = backup_dir(path).glob(f"{path.stem}-*.duckdb")
    return sorted(found, key=lambda p: p.name, reverse=True)


def recovery_hint(path: Path) -> str:
    found = backups(path)
    if found:
        return f"run `meshplan db --restore` to bring back the backup {found[0].name} (the damaged file is kept aside)"
    return f"no backup exists; move it away (mv {path} {path}.damaged) and rerun to start an empty store"


def _damage(path: Path, exc: Exception) -> StoreDamagedError | None:
    """The StoreDamagedError `exc` means, or None when it is an ordinary query error."""
    text = str(exc)
    missing = _MISSING_TABLE.search(text) if isinstance(exc, duckdb.CatalogException) else None
    if missing and missing.group(1) in schema_tables():
        return StoreDamagedError(path, f"table {missing.group(1)} is missing")
    low = text.lower()
    if "not a valid duckdb" in low:
        first = "not a DuckDB database file: garbage or overwritten bytes"
    elif "could not read enough bytes" in low:
        first = "truncated: DuckDB could not read enough bytes"
    else:
        first = re.sub(r'"[^"]*"', "the file", text.splitlines()[0] if text else type(exc).__name__)
    if isinstance(exc, duckdb.IOException | duckdb.InternalException | duckdb.SerializationException) and any(
        m in text.lower() for m in _DAMAGE
    ):
        return StoreDamagedError(path, first.removeprefix("IO Error: "))
    return None


def schema_tables() -> set[str]:
    """Tables the migrations create: one of them missing means the file lost it."""
    return {m.lower() for _, _, sql in migrations() for m in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", sql)}


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
                damage = _damage(path, exc)
                if damage is not None:
                    raise damage from None
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.5)


_held: dict[str, list[int]] = {}  # lock file -> [its descriptor, connections of this process in the turn]
_held_guard = threading.Lock()


@contextmanager
def _turn(path: Path, read_only: bool, wait_s: float) -> Iterator[None]:
    """This process's turn at the store among meshplan processes (see the module docstring).

    Shared by this process's threads (a connection opened while another of this process is open, as
    DuckDB itself allows, joins its turn); a folder where the lock files cannot be made leaves
    DuckDB's lock alone."""
    path = path.resolve()  # one key per file however it is spelled: a nested turn joins, never waits on itself
    key = str(path.with_name(path.name + ".lock"))
    with _held_guard:
        entry = _held.get(key)
        if entry:
            entry[1] += 1
    if not entry:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        try:
            fd = os.open(key, flags, 0o644)
        except OSError:
            yield
            return
        try:
            turnstile = os.open(str(path.with_name(path.name + ".turn")), flags, 0o644)
        except OSError:
            os.close(fd)
            yield
            return
        if not _take(fd, turnstile, fcntl.LOCK_SH if read_only else fcntl.LOCK_EX, wait_s):
            raise StoreLockedError(f"{path} stayed locked by another process for {wait_s:.0f} s; wait for it to finish")
        os.close(turnstile)
        with _held_guard:
            entry = _held.get(key)
            if entry:  # another thread of this process got its turn meanwhile (both shared): join it
                entry[1] += 1
                os.close(fd)
            else:
                _held[key] = [fd, 1]
    try:
        yield
    finally:
        with _held_guard:
            entry = _held[key]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[key]
                os.close(entry[0])  # lets go of the flock


def _take(fd: int, turnstile: int, mode: int, wait_s: float) -> bool:
    """flock `fd` in `mode` through the turnstile, waiting up to `wait_s`; False when it timed out
    (the descriptors then belong to the waiter left behind, which closes them once it returns)."""
    try:  # nobody waiting and nobody holding: at once
        fcntl.flock(turnstile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    # a blocking flock cannot time out, and SIGALRM is not for the threads Prefect runs tasks in:
    # the waiting is a helper thread's
    got, guard, abandoned = threading.Event(), threading.Lock(), [False]

    def wait() -> None:
        fcntl.flock(turnstile, fcntl.LOCK_EX)  # in the queue: whoever comes next waits behind us
        fcntl.flock(fd, mode)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        with guard:
            if abandoned[0]:
                os.close(fd)
                os.close(turnstile)
            else:
                got.set()

    threading.Thread(target=wait, name="meshplan-store-turn", daemon=True).start()
    if got.wait(wait_s):
        return True
    with guard:
        if got.is_set():
            return True
        abandoned[0] = True
    return False


@contextmanager
def connect(
    path: str | Path, read_only: bool = False, wait_s: float = LOCK_WAIT_S
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection to the store at `path`, migrated to the latest schema.

    Raises StoreDamagedError when the file (on open or in any query run on it) turns out damaged."""
    path = Path(path)
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.exists():
        raise FileNotFoundError(f"no meshplan database at {path}; run `meshplan discover` first")
    deadline = time.monotonic() + wait_s
    with _turn(path, read_only, wait_s):
        existed = path.is_file() and path.stat().st_size > 0
        con = _open(path, read_only, max(0.0, deadline - time.monotonic()))
        with _connection(con, path, read_only, existed) as c:
            yield c


@contextmanager
def _connection(
    con: duckdb.DuckDBPyConnection, path: Path, read_only: bool, existed: bool
) -> Iterator[duckdb.DuckDBPyConnection]:
    try:
        if not read_only and str(path.resolve()) not in _migrated:
            migrate(con, before=(lambda: backup(con, path, "before-migration")) if existed else None)
            _migrated.add(str(path.resolve()))
        yield con
    except duckdb.Error as exc:
        damage = _damage(path, exc)
        if damage is not None:
            raise damage from None
        raise
    finally:
        con.close()


def backup(con: duckdb.DuckDBPyConnection, path: str | Path, reason: str) -> Path:
    """Copy the database at `path` (open read-write on `con`, so nobody else writes it) to backups/.

    CHECKPOINT first folds the write-ahead log into the file, so the copy is the whole database.
    Only the newest KEEP_BACKUPS copies are kept."""
    path = Path(path)
    con.execute("CHECKPOINT")
    folder = backup_dir(path)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S") + f"{time.time() % 1:.6f}"[1:].replace(".", "")
    dst = folder / f"{path.stem}-{stamp}-{reason}.duckdb"
    tmp = dst.with_name("." + dst.name)
    shutil.copyfile(path, tmp)
    tmp.replace(dst)  # a backup is whole or absent, never half-copied
    for old in backups(path)[KEEP_BACKUPS:]:
        old.unlink(missing_ok=True)
    return dst


def restore(path: str | Path) -> tuple[Path, Path | None]:
    """Put the newest backup in place of the database at `path`; (backup used, where the old file went).

    The replaced file (and its write-ahead log) is renamed aside, never deleted: nothing is lost."""
    path = Path(path)
    found = backups(path)
    if not found:
        raise FileNotFoundError(
            f"no backup of {path} in {backup_dir(path)}; move the file away to start an empty store"
        )
    aside = None
    if path.exists():
        aside = path.with_name(f"{path.name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}")
        path.replace(aside)
        wal = path.with_name(path.name + ".wal")
        if wal.exists():
            wal.replace(aside.with_name(aside.name + ".wal"))
    tmp = path.with_name("." + path.name + ".restoring")
    shutil.copyfile(found[0], tmp)
    tmp.replace(path)
    _migrated.discard(str(path.resolve()))
    return found[0], aside


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every storage/schema/NNNN_name.sql, in order."""
    out = []
    for f in resources.files("storage.schema").iterdir():
        if f.name.endswith(".sql"):
            version = int(f.name.split("_", 1)[0])
            out.append((version, f.name, f.read_text()))
    return sorted(out)


def migrate(con: duckdb.DuckDBPyConnection, before: Callable[[], object] | None = None) -> int:
    """Apply pending migrations, each in its own transaction; safe to run any number of times.

    `before` runs once, only when some migration is about to be applied (connect: the backup)."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)"
    )
    done = {v for (v,) in con.execute("SELECT version FROM schema_version").fetchall()}
    applied = 0
    for version, name, sql in migrations():
        if version in done:
            continue
        if before is not None and done:  # an empty store (no versions yet) has nothing to back up
            before()
            before = None
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


def query(
    path: str | Path,
    sql: str,
    params: list | None = None,
    read_only: bool = False,
    max_rows: int | None = None,
    timeout_s: float | None = None,
) -> pl.DataFrame:
    """Run a query and return a polars frame (`read_only`: DuckDB refuses any write).

    `max_rows`: fetch at most that many rows (a user's query: the rows beyond are never computed
    where DuckDB can stop early); `timeout_s`: interrupt the statement after that long (a TimeoutError)."""
    import threading

    with connect(path, read_only=read_only) as con:
        timer = threading.Timer(timeout_s, con.interrupt) if timeout_s else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            rel = con.sql(sql, params=params) if params else con.sql(sql)
            if rel is None:
                import polars as pl

                return pl.DataFrame()  # a statement (DROP, UPDATE) returns nothing
            return (rel.limit(max_rows) if max_rows is not None else rel).pl()
        except duckdb.InterruptException:
            raise TimeoutError(f"the query ran past {timeout_s:g} s and was stopped") from None
        finally:
            if timer is not None:
                timer.cancel()


def tables(path: str | Path) -> pl.DataFrame:
    with connect(path, read_only=True) as con:
        return con.sql(
            "SELECT t.table_name AS table, t.estimated_size AS rows, t.column_count AS columns "
            "FROM duckdb_tables() t ORDER BY t.table_name"
        ).pl()
