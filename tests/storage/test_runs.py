"""Training runs and step telemetry in a real DuckDB file: idempotent ingest, restarts, the plan join."""

import json
from pathlib import Path

from planner.specs.plan import CostBreakdown, parse_plan_json
from storage.runs import finish_run, ingest_step_metrics, load_run, run_steps, start_run, step_metrics

GOLDEN = Path(__file__).parents[1] / "data" / "plan_v1.json"


def _plan(step_time_s=0.5):
    plan = parse_plan_json(GOLDEN.read_text())
    pred = CostBreakdown(
        step_time_s=step_time_s,
        compute_s=0.3,
        bubble_s=0.1,
        pp_comm_s=0.05,
        dp_comm_s=0.05,
        tp_comm_s=0,
        optimizer_s=0,
        tokens_per_s=1000,
        mfu=0.3,
        peak_memory_bytes=(1, 1),
        memory_capacity_bytes=(2, 2),
        bottleneck="compute",
    )
    return plan.model_copy(update={"predicted": pred})


def _row(rank, step, stage, replica, step_time_s, loss=None, attempt=0, wall=0.0):
    return {
        "run_id": "ignored",
        "rank": rank,
        "stage": stage,
        "replica": replica,
        "tp_index": 0,
        "pp": 2,
        "dp": 2,
        "tp": 1,
        "attempt": attempt,
        "num_microbatches": 2,
        "samples": 4,
        "tokens": 256,
        "plan_fingerprint": "x",
        "step": step,
        "step_time_s": step_time_s,
        "compute_s": 0.1,
        "optimizer_s": 0.01,
        "comm_wait_s": step_time_s - 0.11,
        "loss": loss,
        "memory_bytes": 1 << 20,
        "memory_kind": "cpu_max_rss",
        "wall_time_s": wall,
    }


def _write(run_dir: Path, rank: int, rows: list[dict]) -> None:
    d = run_dir / "telemetry"
    d.mkdir(parents=True, exist_ok=True)
    with (d / f"rank_{rank:05d}.jsonl").open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_ingest_is_idempotent_and_joins_the_prediction(tmp_path):
    db, run_dir = tmp_path / "m.duckdb", tmp_path / "run"
    start_run(db, "r1", _plan(0.5), num_steps=2, run_dir=run_dir)
    for rank, (stage, replica) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        loss = (2.0 if replica == 0 else 4.0) if stage == 1 else None
        _write(run_dir, rank, [_row(rank, s, stage, replica, 0.4 + 0.1 * rank, loss) for s in range(2)])
    assert ingest_step_metrics(db, "r1", run_dir) == 8
    assert ingest_step_metrics(db, "r1", run_dir) == 8  # again: no duplicates
    steps = run_steps(db, "r1")
    assert steps["step"].to_list() == [0, 1]
    slowest = 0.4 + 0.1 * 3
    assert steps["step_time_s"].to_list() == [slowest, slowest]
    assert steps["predicted_step_time_s"].to_list() == [0.5, 0.5]
    assert abs(steps["measured_over_predicted"][0] - slowest / 0.5) < 1e-9
    assert steps["loss"].to_list() == [3.0, 3.0]  # equal shares: mean of the replicas' losses
    assert abs(steps["tokens_per_s"][0] - 512 / slowest) < 1e-6


def test_restarted_steps_keep_the_last_attempt_and_count_restarts(tmp_path):
    db, run_dir = tmp_path / "m.duckdb", tmp_path / "run"
    start_run(db, "r2", _plan(), num_steps=2, run_dir=run_dir)
    _write(
        run_dir,
        0,
        [_row(0, 0, 0, 0, 1.0, wall=1), _row(0, 1, 0, 0, 9.0, wall=2), _row(0, 1, 0, 0, 2.0, attempt=1, wall=3)],
    )
    assert ingest_step_metrics(db, "r2", run_dir) == 2
    finish_run(db, "r2", "completed")
    rows = step_metrics(db, "r2")
    assert rows.filter(rows["step"] == 1)["step_time_s"].to_list() == [2.0]
    run = load_run(db, "r2")
    assert run["status"] == "completed" and run["restarts"] == 1 and run["ended_at"] is not None


def test_run_without_prediction_or_telemetry(tmp_path):
    db = tmp_path / "m.duckdb"
    start_run(db, "r3", parse_plan_json(GOLDEN.read_text()), num_steps=1, run_dir=tmp_path / "none")
    assert ingest_step_metrics(db, "r3", tmp_path / "none") == 0
    finish_run(db, "r3", "failed", "boom")
    run = load_run(db, "r3")
    assert run["predicted_step_time_s"] is None and run["status"] == "failed" and run["message"] == "boom"
    assert load_run(db, "nope") is None
