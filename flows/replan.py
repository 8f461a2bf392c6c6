"""Stage 5 flow: re-plan around stragglers from a run's stored telemetry (and the live monitor's report).

`replan_flow(db_path, run_id)` reads the run's step_metrics from DuckDB, detects slowdowns
(planner.replan.detect), prices keep / rebalance / relayout on the degraded cluster (planner.replan.options),
decides (planner.replan.gate), stores the decision in `replan_decisions` and publishes it as a markdown
artifact. A clean run detects nothing and records nothing. For a finished run the gain is counted
over another run of the same length (what to change next time). If the run is still running and the
choice is a rebalance, it writes the run's control.json (the ranks switch at their next step); a
relayout needs the process owner — train_flow's supervisor — so here it is recorded, not acted on.
It is also what `meshplan replan-every` serves on an interval.
"""

from __future__ import annotations

import json
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.outcomes import ReplanOutcome
from launcher.control import write_control
from planner.errors import MeshplanError
from planner.replan.degrade import cpu_cluster
from planner.replan.detect import DetectConfig
from planner.replan.gate import GateConfig
from planner.replan.monitor import MonitorConfig
from planner.specs.cluster import ClusterSpec, parse_cluster_toml
from planner.specs.config import SEARCH_BUDGET_S
from planner.specs.model import get_model
from planner.specs.plan import Plan, parse_plan_json
from storage.pricing import machine_calibration
from storage.replan import run_plan_json
from storage.runs import load_run, step_metrics
from tasks.replan import decide_from_telemetry, store_decision


def monitor_config(
    threshold: float = 0.10,
    persistence_steps: int = 5,
    window: int = 10,
    margin_s: float = 1.0,
    min_gain: float = 0.05,
    cooldown_steps: int = 5,
    search_budget_s: float = SEARCH_BUDGET_S,
    relayout: bool = True,
) -> MonitorConfig:
    """A MonitorConfig from ReplanConfig's fields."""
    return MonitorConfig(
        DetectConfig(threshold=threshold, persistence=persistence_steps, window=window),
        GateConfig(margin_s=margin_s, min_gain=min_gain, cooldown_steps=cooldown_steps),
        search_budget_s,
        relayout,
    )


def load_cluster(cluster_path: str | None, num_devices: int) -> tuple[ClusterSpec, bool]:
    """(cluster, synthetic): the TOML file when given, else one CPU node of `num_devices` ranks."""
    if not cluster_path:
        return cpu_cluster(num_devices), True
    from pathlib import Path

    from planner.inputs import read_input

    return parse_cluster_toml(read_input(cluster_path, "--cluster", "cluster"), Path(cluster_path).name), False


def decisions_markdown(run_id: str, records: list[dict[str, Any]]) -> str:
    lines = [f"# Re-planning decisions for run `{run_id}`", ""]
    if not records:
        return "\n".join(lines + ["No straggler detected: nothing to decide."])
    for i, rec in enumerate(records):
        lines += [
            f"## Decision {i} at step {rec['step']}: **{rec['chosen_action']}**"
            + (" (acted)" if rec.get("acted") else ""),
            "",
            rec["reason"],
            "",
            "| rank | kind | factor | detected at step |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {d['rank']} | {d['kind']} | {d['factor']:.2f}× | {d['detected_at_step']} |" for d in rec["detections"]
        ]
        lines += ["", "| option | predicted step | switch cost | net gain | chosen |", "|---|---|---|---|---|"]
        lines += [
            f"| {o['action']} | {o['step_time_s'] * 1e3:.1f} ms | {o['switch_cost_s']:.2f} s | "
            f"{o['net_gain_s']:.2f} s | {'✔' if o['chosen'] else ''} |"
            for o in rec["options"]
        ]
        lines.append("")
    return "\n".join(lines)


def current_plan(plan: Plan, rows: list[dict[str, Any]]) -> Plan:
    """The launch plan with the batch shares in force at the last stored step (after rebalances)."""
    if not rows:
        return plan
    last = max(r["step"] for r in rows)
    shares = {r["replica"]: r["samples"] for r in rows if r["step"] == last and r["tp_index"] == 0}
    if sorted(shares) != list(range(plan.dp)) or sum(shares.values()) != plan.global_batch_size:
        return plan
    return plan.model_copy(update={"batch_shares": tuple(shares[r] for r in range(plan.dp))})


@flow(name="replan", log_prints=True)
def replan_flow(
    db_path: str,
    run_id: str,
    cluster_path: str | None = None,
    act: bool = True,
    threshold: float = 0.10,
    persistence_steps: int = 5,
    window: int = 10,
    margin_s: float = 1.0,
    min_gain: float = 0.05,
    cooldown_steps: int = 5,
) -> ReplanOutcome:
    """Decide for a stored run; returns its ReplanOutcome (flows/outcomes.py)."""
    run = load_run(db_path, run_id)
    if run is None:
        raise MeshplanError("--run-id", run_id, "no such run in the database; list runs with `meshplan db`")
    plan = parse_plan_json(run_plan_json(db_path, run_id) or "", f"runs[{run_id}].plan_json")
    rows = step_metrics(db_path, run_id).to_dicts()
    plan = current_plan(plan, rows)
    cluster, synthetic = load_cluster(cluster_path, plan.num_devices)
    model = get_model(plan.model)
    # this machine's CPU ranks are priced with what discovery measured, as the search prices them
    calibration = machine_calibration(db_path, model) if synthetic else None
    cfg = monitor_config(threshold, persistence_steps, window, margin_s, min_gain, cooldown_steps, relayout=True)
    live = run["status"] == "running"
    # A live run gains only over its remaining steps; for a finished one the question is what the
    # next run of the same length should do, so the horizon is another num_steps.
    last = max((r["step"] for r in rows), default=-1)
    horizon = int(run["num_steps"]) if live else last + 1 + int(run["num_steps"])
    dec = decide_from_telemetry(db_path, run_id, plan, model, cluster, horizon, cfg, calibration)
    if dec is None:
        create_markdown_artifact(
            key="replan-report", markdown=decisions_markdown(run_id, []), description=f"re-planning for run {run_id}"
        )
        print(f"run {run_id}: no straggler detected in {len(rows)} telemetry rows")
        return ReplanOutcome(run_id=run_id, detected=False, action="keep", reason="no straggler", acted=False)
    rec = dec.record("replan_flow")
    chosen = dec.result.chosen_plan
    if act and live and chosen is not None and dec.result.decision.chosen.action == "rebalance":
        rec["control_version"] = write_control(run["run_dir"], "rebalance", batch_shares=list(chosen.batch_shares))
        rec["acted"], rec["new_plan_json"] = True, chosen.to_json()
    decision_id = store_decision(db_path, run_id, rec)
    create_markdown_artifact(
        key="replan-report", markdown=decisions_markdown(run_id, [rec]), description=f"re-planning for run {run_id}"
    )
    print(f"run {run_id}: {rec['chosen_action']} — {rec['reason']}")
    return ReplanOutcome(
        run_id=run_id,
        detected=True,
        action=rec["chosen_action"],
        reason=rec["reason"],
        acted=rec["acted"],
        decision_id=decision_id,
        detections=json.loads(json.dumps(rec["detections"])),
    )
