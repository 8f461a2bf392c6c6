"""Calibrated runtime figures (table `runtime_calibrations`, migration 0014) and the measured steps
of meshplan's own completed runs they can be fitted on."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from planner.cost.runtimes import Figures
from storage.db import connect

# steps of a run left out of its measured step time: the first ones warm up allocators and caches
WARMUP_STEPS = 1


def save_figures(
    db_path: str | Path,
    device_kind: str,
    runtime: str,
    figures: Figures,
    run_ids: list[str],
    source: str,
    mape_before: float | None,
    mape_after: float | None,
) -> str:
    """Store one calibration; the newest per (device_kind, runtime) is in force. Returns its id."""
    cid = uuid.uuid4().hex[:12]
    with connect(db_path) as con:
        con.execute(
            "INSERT INTO runtime_calibrations (id, device_kind, runtime, kernel_scale, microbatch_s, runs, run_ids,"
            " source, mape_before, mape_after) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                cid,
                device_kind,
                runtime,
                figures.kernel_scale,
                figures.microbatch_s,
                figures.runs,
                json.dumps(run_ids),
                source,
                mape_before,
                mape_after,
            ],
        )
    return cid


def load_figures(db_path: str | Path, device_kind: str, runtime: str) -> Figures | None:
    """The calibration in force for (device_kind, runtime), or None."""
    if not Path(db_path).exists():
        return None
    with connect(db_path) as con:
        row = con.execute(
            "SELECT kernel_scale, microbatch_s, runs, source FROM runtime_calibrations"
            " WHERE device_kind = ? AND runtime = ? ORDER BY created_at DESC, id LIMIT 1",
            [device_kind, runtime],
        ).fetchone()
    if row is None:
        return None
    return Figures(row[0], row[1], row[2], row[3])


def list_figures(db_path: str | Path) -> list[dict]:
    """Every calibration in force (newest per device kind and runtime), with its provenance."""
    if not Path(db_path).exists():
        return []
    with connect(db_path) as con:
        cur = con.execute(
            "SELECT device_kind, runtime, kernel_scale, microbatch_s, runs, run_ids, source, mape_before, mape_after,"
            " CAST(created_at AS VARCHAR) AS created_at FROM runtime_calibrations"
            " QUALIFY row_number() OVER (PARTITION BY device_kind, runtime ORDER BY created_at DESC, id) = 1"
            " ORDER BY device_kind, runtime"
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def completed_run_steps(db_path: str | Path) -> list[dict]:
    """meshplan's completed runs: plan JSON, model and the median measured step time (the slowest
    rank's, warm-up steps left out) from their telemetry."""
    if not Path(db_path).exists():
        return []
    with connect(db_path) as con:
        cur = con.execute(
            """WITH per_step AS (SELECT run_id, step, max(step_time_s) AS t FROM step_metrics GROUP BY run_id, step),
                    ranked AS (SELECT *, row_number() OVER (PARTITION BY run_id ORDER BY step) AS k,
                                      count(*) OVER (PARTITION BY run_id) AS n FROM per_step)
               SELECT r.run_id, r.plan_json, r.model, median(s.t) AS step_s, count(*) AS steps
               FROM runs r JOIN ranked s USING (run_id)
               WHERE r.status = 'completed' AND (s.k > ? OR s.n <= ?)
               GROUP BY r.run_id, r.plan_json, r.model ORDER BY r.run_id""",
            [WARMUP_STEPS, WARMUP_STEPS],
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
