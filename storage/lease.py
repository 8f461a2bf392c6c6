"""A named lease in DuckDB (table `leases`, migration 0020): one holder at a time, with an expiry.

The cluster scheduler takes the lease `scheduler` for a round, so two rounds never read, decide and
apply at once (a restarted `schedule-cluster --every` whose Prefect server starts the missed rounds
together, two schedulers on one state folder). Taking it is one transaction: free, expired, or held
by a process of this host that is gone (its pid absent, or reused by another process: the start
time in the holder's name differs) → taken; otherwise refused with the holder's name. Releasing it
records the end of the round, so a round scheduled before then is collapsed into it (`last_end`).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import uuid
from pathlib import Path

from storage.db import connect


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None: gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def utcnow() -> dt.datetime:
    """Now in UTC, naive: how the table's TIMESTAMP columns hold time (whatever the machine's zone)."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def naive_utc(when: dt.datetime) -> dt.datetime:
    """An aware time (Prefect's scheduled start) as the table holds times: naive UTC."""
    return dt.datetime.fromtimestamp(when.timestamp(), dt.UTC).replace(tzinfo=None)


def new_holder() -> str:
    """A name for a holder in this process: host, pid, the pid's start time, and a token (two rounds
    of one process are two holders)."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_ticks(pid)}:{uuid.uuid4().hex[:8]}"


def holder_gone(holder: str) -> bool:
    """True when `holder` is a process of this host that no longer runs; a holder on another host is
    never known to be gone (its expiry decides)."""
    host, pid, ticks, _ = (holder.split(":") + ["", "", "", ""])[:4]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return _start_ticks(int(pid)) != ticks


def acquire(db_path: str | Path, name: str, holder: str, ttl_s: float) -> str | None:
    """Take the lease `name` for `ttl_s` seconds; None when taken, else the live holder that has it.

    Two takers at once (two rounds of one process, each on its own connection) meet in DuckDB's
    optimistic concurrency: the later writer's transaction conflicts and is rolled back, and it
    reads again, now seeing the winner as the holder."""
    import duckdb

    for _ in range(20):
        with connect(db_path) as con:
            try:
                return _acquire_once(con, name, holder, ttl_s)
            except (duckdb.TransactionException, duckdb.ConstraintException):
                try:
                    con.execute("ROLLBACK")
                except duckdb.Error:
                    pass  # DuckDB already aborted it
    raise RuntimeError(f"lease {name!r}: 20 conflicting takers in a row")


def _acquire_once(con, name: str, holder: str, ttl_s: float) -> str | None:
    con.execute("BEGIN TRANSACTION")
    now = utcnow()
    row = con.execute("SELECT holder, expires_at FROM leases WHERE name = ?", [name]).fetchall()
    current, expires = row[0] if row else (None, None)
    expired = expires is None or expires < now
    if current and current != holder and not expired and not holder_gone(current):
        con.execute("ROLLBACK")
        return current
    until = now + dt.timedelta(seconds=ttl_s)
    if row:
        con.execute(
            "UPDATE leases SET holder = ?, acquired_at = ?, expires_at = ? WHERE name = ?",
            [holder, now, until, name],
        )
    else:
        con.execute("INSERT INTO leases VALUES (?, ?, ?, ?, NULL)", [name, holder, now, until])
    con.execute("COMMIT")
    return None


def release(db_path: str | Path, name: str, holder: str) -> None:
    """Let go of the lease (only if `holder` still has it) and record the end of its round (retried when
    a taker's transaction conflicts with it, as in `acquire`)."""
    import duckdb

    for attempt in range(20):
        try:
            with connect(db_path) as con:
                con.execute(
                    "UPDATE leases SET holder = NULL, expires_at = NULL, last_round_end = ? WHERE name = ? AND holder = ?",
                    [utcnow(), name, holder],
                )
            return
        except duckdb.TransactionException:
            if attempt == 19:
                raise


def last_end(db_path: str | Path, name: str) -> dt.datetime | None:
    """When the lease was last released (the end of the latest whole round), naive UTC; None: never."""
    with connect(db_path) as con:
        row = con.execute("SELECT last_round_end FROM leases WHERE name = ?", [name]).fetchall()
    return row[0][0] if row else None
