"""Serving requests (table `serve_requests`): written by the request front end, read by reports."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from storage.db import connect

COLUMNS = ("run_id", "request_id", "model", "grp", "phase", "arrival_s", "latency_s", "status", "slo_s")


def record_requests(db_path: str | Path, rows: list[dict]) -> int:
    """Insert (or replace, by run id and request id) request rows; returns how many."""
    if not rows:
        return 0
    with connect(db_path) as con:
        con.executemany(
            f"INSERT OR REPLACE INTO serve_requests ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
            [[r.get(c) for c in COLUMNS] for r in rows],
        )
    return len(rows)


def serve_requests(db_path: str | Path, run_id: str | None = None) -> pl.DataFrame:
    with connect(db_path) as con:
        sql = f"SELECT {', '.join(COLUMNS)} FROM serve_requests"
        if run_id is None:
            return con.sql(sql + " ORDER BY run_id, request_id").pl()
        return con.sql(sql + " WHERE run_id = ? ORDER BY request_id", params=[run_id]).pl()
