"""Training runs and their per-step telemetry (tables `runs`, `step_metrics`, view `run_steps`).

Ranks never touch the database: each writes `<run>/telemetry/rank_*.jsonl` (worker/telemetry.py)
and the flow ingests the files here. Ingesting is an upsert on (run_id, rank, step), so running it
again — after a retry, or mid-run and at the end — never duplicates rows; when a restarted attempt
re-ran a step, the row written last wins.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

import rundir
from planner.specs.plan import Plan
from storage.db import connect

STATUSES = ("running", "completed", "failed")

# Column types of a telemetry line; read_json is told them so a file of all-null losses still loads.
_COLUMNS = {
    "rank": "INTEGER",
    "step": "INTEGER",
    "stage": "INTEGER",
    "replica": "INTEGER",
    "tp_index": "INTEGER",
    "attempt": "INTEGER",
    "num_microbatches": "INTEGER",
    "samples": "INTEGER",
    "tokens": "BIGINT",
    "step_time_s": "DOUBLE",
    "compute_s": "DOUBLE",
    "comm_wait_s": "DOUBLE",
    "optimizer_s": "DOUBLE",
    "loss": "DOUBLE",
    "memory_bytes": "BIGINT",
    "memory_kind": "VARCHAR",
    "wall_time_s": "DOUBLE",
    "control_version": "INTEGER",
    "switch_action": "VARCHAR",
    "checkpoint_s": "DOUBLE",
}


def start_run(db_path: str | Path, run_id: str, plan: Plan, num_steps: int, run_dir: str | Path) -> None:
    """Record (or re-record) a run as running; a re-launched run id keeps its first start time."""
    predicted = plan.predicted.step_time_s if plan.predicted is not None else None
    with connect(db_path) as con:
        con.execute(
            """INSERT INTO runs (run_id, plan_fingerprint, plan_json, model, predicted_step_time_s, status,
                                num_steps, world_size, run_dir)
               VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?)
               ON CONFLICT (run_id) DO UPDATE SET plan_fingerprint = excluded.plan_fingerprint,
                   plan_json = excluded.plan_json, model = excluded.model,
                   predicted_step_time_s = excluded.predicted_step_time_s, status = 'running',
                   num_steps = excluded.num_steps, world_size = excluded.world_size, run_dir = excluded.run_dir,
                   message = NULL, ended_at = NULL""",
            [
                run_id,
                plan.fingerprint(),
                plan.to_json(),
                plan.model,
                predicted,
                num_steps,
                plan.num_devices,
                str(run_dir),
            ],
        )


def finish_run(db_path: str | Path, run_id: str, status: str, message: str | None = None) -> None:
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {STATUSES}")
    with connect(db_path) as con:
        con.execute(
            """UPDATE runs SET status = ?, message = ?, ended_at = now(),
                   restarts = coalesce((SELECT max(attempt) FROM step_metrics WHERE run_id = ?), 0)
               WHERE run_id = ?""",
            [status, message, run_id, run_id],
        )


def telemetry_files(run_dir: str | Path) -> list[str]:
    return [str(p) for p in rundir.telemetry_files(run_dir) if p.stat().st_size > 0]


def set_run_generation(db_path: str | Path, run_id: str, generation: int) -> None:
    """Record the generation of the run's current launch (migration 0013)."""
    with connect(db_path) as con:
        con.execute("UPDATE runs SET generation = ? WHERE run_id = ?", [generation, run_id])


def ingest_step_metrics(db_path: str | Path, run_id: str, run_dir: str | Path) -> int:
    """Upsert every telemetry line of the run folder; returns the number of (rank, step) rows ingested."""
    files = telemetry_files(run_dir)
    if not files:
        return 0
    cols = ", ".join(_COLUMNS)
    spec = "{" + ", ".join(f"'{k}': '{v}'" for k, v in _COLUMNS.items()) + "}"
    with connect(db_path) as con:
        con.execute("BEGIN TRANSACTION")
        try:
            # A step re-run by a restarted attempt appears twice in a file: keep the last-written line.
            con.execute(
                f"""INSERT OR REPLACE INTO step_metrics (run_id, {cols})
                    SELECT ? AS run_id, {cols}
                    FROM read_json(?, format = 'newline_delimited', columns = {spec})
                    QUALIFY row_number() OVER (PARTITION BY rank, step ORDER BY wall_time_s DESC) = 1""",
                [run_id, files],
            )
            n = con.execute("SELECT count(*) FROM step_metrics WHERE run_id = ?", [run_id]).fetchall()[0][0]
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
    return int(n)


def load_run(db_path: str | Path, run_id: str) -> dict | None:
    with connect(db_path) as con:
        rows = con.sql("SELECT * EXCLUDE (plan_json) FROM runs WHERE run_id = ?", params=[run_id]).pl().to_dicts()
    return rows[0] if rows else None


def run_steps(db_path: str | Path, run_id: str) -> pl.DataFrame:
    """Per step: slowest rank's time vs the prediction, global loss, tokens/s (view `run_steps`)."""
    with connect(db_path) as con:
        return con.sql("SELECT * FROM run_steps WHERE run_id = ? ORDER BY step", params=[run_id]).pl()


def step_metrics(db_path: str | Path, run_id: str) -> pl.DataFrame:
    with connect(db_path) as con:
        return con.sql("SELECT * FROM step_metrics WHERE run_id = ? ORDER BY step, rank", params=[run_id]).pl()
