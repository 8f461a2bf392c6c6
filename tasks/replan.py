"""Prefect tasks of stage 5 (replan): supervise a training job, decide from stored telemetry, store decisions.

Policies (DESIGN.md, Prefect): supervising launches processes and writes control files — NO_CACHE, no
retries (the flow decides whether to relaunch). Deciding from stored telemetry is cheap and must
reflect the latest rows — NO_CACHE. Storing decisions is an idempotent upsert — short retries.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from launcher.launch import Launch
from launcher.supervise import SupervisedRun, Supervisor
from planner.measure.calibrate import Calibration
from planner.measure.profiles import ProfileTable
from planner.replan.monitor import MonitorConfig, MonitorDecision, ReplanMonitor
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan
from storage.replan import save_decision
from storage.runs import step_metrics


@task(name="supervise-training", retries=0, cache_policy=NO_CACHE)
def supervise_training(
    db_path: str,
    run_id: str,
    launch: Launch,
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    profiles: ProfileTable | None,
    cfg: MonitorConfig,
    timeout_s: float,
    act: bool,
    poll_s: float,
    synthetic_cluster: bool,
    show_progress: bool = False,
    calibration: Calibration | None = None,
) -> SupervisedRun:
    """torchrun under a re-planning monitor: how it ended, the decisions taken, the plan it finished on."""
    sup = Supervisor(
        launch,
        plan,
        model,
        cluster,
        profiles,
        cfg,
        lambda rec: save_decision(db_path, run_id, rec),
        act=act,
        poll_s=poll_s,
        synthetic_cluster=synthetic_cluster,
        show_progress=show_progress,
        calibration=calibration,
    )
    return sup.run(timeout_s)


@task(name="decide-from-telemetry", cache_policy=NO_CACHE)
def decide_from_telemetry(
    db_path: str,
    run_id: str,
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    num_steps: int,
    cfg: MonitorConfig,
    calibration: Calibration | None = None,
) -> MonitorDecision | None:
    """Detection + re-planning over a run's stored step_metrics (None: nothing detected)."""
    rows = step_metrics(db_path, run_id).to_dicts()
    world = len({r["rank"] for r in rows}) or 0
    monitor = ReplanMonitor(plan, model, cluster, None, num_steps, cfg, world_size=world, calibration=calibration)
    monitor.observe(rows)
    return monitor.poll()


@task(name="store-decision", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def store_decision(db_path: str, run_id: str, record: dict[str, Any]) -> int:
    return save_decision(db_path, run_id, record)
