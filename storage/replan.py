"""Re-planning decisions (table `replan_decisions`): what was detected, priced, chosen and why.

Every decision is stored, `keep` included, so a run's history shows why it did (not) switch.
`decision_id` numbers a run's decisions; saving with an explicit id is an upsert (a retried task
never duplicates a row), without one the next free id is taken.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from storage.db import connect

_FIELDS = (
    "step",
    "source",
    "detections",
    "options",
    "keep_step_time_s",
    "measured_step_time_s",
    "chosen_action",
    "net_gain_s",
    "reason",
    "acted",
    "control_version",
    "new_plan_json",
)


def save_decision(db_path: str | Path, run_id: str, record: dict[str, Any], decision_id: int | None = None) -> int:
    """Store one decision record (keys as in `_FIELDS`; detections/options as lists); returns its id."""
    values = [json.dumps(record[k]) if k in ("detections", "options") else record.get(k) for k in _FIELDS]
    with connect(db_path) as con:
        if decision_id is None:
            decision_id = con.execute(
                "SELECT coalesce(max(decision_id) + 1, 0) FROM replan_decisions WHERE run_id = ?", [run_id]
            ).fetchall()[0][0]
        cols = ", ".join(_FIELDS)
        con.execute(
            f"INSERT OR REPLACE INTO replan_decisions (run_id, decision_id, {cols}) "
            f"VALUES (?, ?, {', '.join('?' for _ in _FIELDS)})",
            [run_id, decision_id, *values],
        )
    return int(decision_id)


def load_decisions(db_path: str | Path, run_id: str) -> pl.DataFrame:
    with connect(db_path) as con:
        return con.sql("SELECT * FROM replan_decisions WHERE run_id = ? ORDER BY decision_id", params=[run_id]).pl()


def run_plan_json(db_path: str | Path, run_id: str) -> str | None:
    """The plan a run was (last) launched with."""
    with connect(db_path) as con:
        rows = con.execute("SELECT plan_json FROM runs WHERE run_id = ?", [run_id]).fetchall()
    return rows[0][0] if rows else None
