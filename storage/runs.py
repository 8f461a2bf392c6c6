"""Training runs and their per-step telemetry (tables `runs`, `step_metrics`, view `run_steps`).

Ranks never touch the database: each writes `<run>/telemetry/rank_*.jsonl` (worker/telemetry.py)
and the flow ingests the files here. Ingesting is an upsert on (run_id, rank, step), so running it
again — after a retry, or mid-run and at the end — never duplicates rows; when a restarted attempt
re-ran a step, the row written last wins.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

import rundir
from planner.specs.plan import Plan
from storage import lease
from storage.db import connect

STATUSES = ("running", "completed", "failed", "killed")  # killed: its command died (close_dead_runs)

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
    close_dead_runs(db_path)
    with connect(db_path) as con:
        con.execute(
            """INSERT INTO runs (run_id, plan_fingerprint, plan_json, model, predicted_step_time_s, status,
                                num_steps, world_size, run_dir, owner)
               VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, ?)
               ON CONFLICT (run_id) DO UPDATE SET plan_fingerprint = excluded.plan_fingerprint,
                   plan_json = excluded.plan_json, model = excluded.model,
                   predicted_step_time_s = excluded.predicted_step_time_s, status = 'running',
                   num_steps = excluded.num_steps, world_size = excluded.world_size, run_dir = excluded.run_dir,
                   message = NULL, ended_at = NULL, owner = excluded.owner""",
            [
                run_id,
                plan.fingerprint(),
                plan.to_json(),
                plan.model,
                predicted,
                num_steps,
                plan.num_devices,
                str(run_dir),
                lease.new_holder(),  # this process: a later command that finds it gone closes the row
            ],
        )


def close_dead_runs(db_path: str | Path) -> list[str]:
    """Close as `killed` every running row whose owner (the process that launched it) is gone from
    this host — a `meshplan train` SIGKILLed, whose ranks its lifeline stopped. Returns their ids."""
    with connect(db_path) as con:
        rows = con.execute("SELECT run_id, owner FROM runs WHERE status = 'running' AND owner IS NOT NULL").fetchall()
        dead = [run_id for run_id, owner in rows if lease.holder_gone(owner)]
        for run_id in dead:
            con.execute(
                "UPDATE runs SET status = 'killed', ended_at = now(),"
                " message = 'the command that launched it was killed; its processes were stopped with it'"
                " WHERE run_id = ? AND status = 'running'",
                [run_id],
            )
    return dead


def set_run_executor(db_path: str | Path, run_id: str, executor: str, slurm_job_id: str | None = None) -> None:
    """Which executor launched the run, and the Slurm job id when it was Slurm (shown by `meshplan db`)."""
    with connect(db_path) as con:
        con.execute("UPDATE runs SET executor = ?, slurm_job_id = ? WHERE run_id = ?", [executor, slurm_job_id, run_id])


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


def ingest_eval_metrics(db_path: str | Path, run_id: str, run_dir: str | Path) -> int:
    """Upsert the run folder's validation losses (eval.jsonl); returns the run's evaluations stored."""
    path = rundir.eval_log(run_dir)
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
                rows.append(
                    [
                        run_id,
                        int(r["step"]),
                        float(r["val_loss"]),
                        int(r["num_batches"]),
                        int(r["tokens"]),
                        r.get("wall_time_s"),
                    ]
                )
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash mid-write says nothing reliable
    with connect(db_path) as con:
        if rows:
            con.executemany("INSERT OR REPLACE INTO eval_metrics VALUES (?, ?, ?, ?, ?, ?)", rows)
        return int(con.execute("SELECT count(*) FROM eval_metrics WHERE run_id = ?", [run_id]).fetchall()[0][0])


def eval_metrics(db_path: str | Path, run_id: str) -> pl.DataFrame:
    with connect(db_path) as con:
        return con.sql("SELECT * FROM eval_metrics WHERE run_id = ? ORDER BY step", params=[run_id]).pl()


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


def resume_records(run_dir: str | Path) -> list[dict]:
    """The lines of <run>/resume.jsonl (worker/checkpoint.py resume_from), one per (re)start of a rank group."""
    path = rundir.resume_log(run_dir)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash mid-write says nothing reliable
    return out


def events_of(records: list[dict], first: int = 0) -> list[dict]:
    """Run events (table run_events) of resume records; `first` is the first record's line number.

    Why: a restart, a fallback past an unreadable checkpoint and a resume are handled by the ranks;
    these rows are how they reach the console, the run row and the Prefect log instead of vanishing."""
    events = []
    for i, r in enumerate(records, start=first):
        attempt = int(r.get("attempt") or 0)
        found: list[tuple[str, str, int | None, str | None]] = []  # kind, message, step, checkpoint
        if attempt > 0:
            found.append(("restart", f"restart {attempt}: torchrun restarted the ranks after a failure", None, None))
        for bad in r.get("rejected") or []:
            found.append(
                ("fallback", f"checkpoint {bad['checkpoint']} skipped: {bad['reason']}", None, bad["checkpoint"])
            )
        if r.get("fresh_start"):
            found.append(
                ("fresh_start", "every checkpoint is unreadable; started from step 0 (--fresh-start)", 0, None)
            )
        if r.get("checkpoint"):
            found.append(("resume", f"resumed from step {r['step']} ({r['checkpoint']})", r["step"], r["checkpoint"]))
        for k, (kind, message, step, ckpt) in enumerate(found):
            events.append(
                {
                    "seq": i * 100 + k,
                    "attempt": attempt,
                    "kind": kind,
                    "step": step,
                    "checkpoint": ckpt,
                    "message": message,
                }
            )
    return events


def record_run_events(db_path: str | Path, run_id: str, events: list[dict]) -> None:
    """Store events on the run (an upsert on (run_id, seq): recording twice duplicates nothing)."""
    if not events:
        return
    with connect(db_path) as con:
        con.executemany(
            """INSERT OR REPLACE INTO run_events (run_id, seq, attempt, kind, step, checkpoint, message)
               VALUES (?, ?, ?, ?, ?, ?, ?)""",
            [[run_id, e["seq"], e["attempt"], e["kind"], e["step"], e["checkpoint"], e["message"]] for e in events],
        )


def run_events(db_path: str | Path, run_id: str) -> list[dict]:
    with connect(db_path) as con:
        return (
            con.sql(
                "SELECT seq, attempt, kind, step, checkpoint, message FROM run_events WHERE run_id = ? ORDER BY seq",
                params=[run_id],
            )
            .pl()
            .to_dicts()
        )
