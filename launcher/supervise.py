"""Run torchrun while watching its telemetry, and act on re-planning decisions (used by train_flow).

The supervisor starts the job (launcher.launch), polls the ranks' JSONL telemetry every `poll_s`,
feeds it to a `planner.replan.monitor.ReplanMonitor`, stores every decision (storage.replan) and acts:
- rebalance → write control.json {"action": "rebalance", batch_shares}; the ranks switch at the
  next step boundary, in the same processes.
- relayout → write control.json {"action": "checkpoint_exit", at_step}; when the job exits cleanly
  with exit.json, relaunch torchrun on the new plan (relabelled onto ranks 0..n−1; an injected
  fault moves with its device, or disappears with it) resuming from that checkpoint.
Switch costs are measured on the run: launch = first telemetry row − process start, checkpoint
save/load from the ranks' telemetry. After a relayout monitoring restarts on the new ranks (fresh
baselines, re-learnt over MonitorConfig.relaunch_window steps instead of a full window), with the
cluster rebuilt for the new world only on synthetic CPU clusters.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rundir
from launcher.control import TelemetryTail, exit_path, read_control, read_exit, write_control
from launcher.launch import Launch, job_exited, kill_group, launch_env, start_logged, torchrun_command
from launcher.progress import StepProgress
from planner.measure.calibrate import Calibration
from planner.measure.profiles import ProfileTable
from planner.replan.degrade import cpu_cluster
from planner.replan.monitor import MonitorConfig, MonitorDecision, ReplanMonitor
from planner.replan.options import SwitchCosts, relabel_for_runtime
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan


@dataclasses.dataclass(frozen=True)
class SupervisedRun:
    """What `Supervisor.run` returns: how the job ended and what the monitor did on the way."""

    returncode: int  # torchrun's, of the last launch
    wall_s: float
    decisions: list[dict[str, Any]]  # storage.replan records, in order
    segments: list[dict[str, Any]]  # one per torchrun launch: plan, world size, launch_s, exit step
    plan: Plan  # the plan the job finished on (after rebalances and relayouts)
    final_detections: list[dict[str, Any]]  # slowdowns the monitor held at the end


@dataclasses.dataclass
class Supervisor:
    launch: Launch
    plan: Plan
    model: ModelSpec
    cluster: ClusterSpec
    profiles: ProfileTable | None
    cfg: MonitorConfig
    record: Callable[[dict[str, Any]], None]  # stores one decision record (the flow binds db + run id)
    act: bool = True
    poll_s: float = 0.5
    synthetic_cluster: bool = False
    show_progress: bool = False  # launcher/progress.py: a bar on a terminal, else a line every few steps
    calibration: Calibration | None = None  # the machine's measured corrections, priced into every decision
    decisions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    segments: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    _progress: StepProgress = dataclasses.field(
        default_factory=lambda: StepProgress(0, enabled=False), init=False, repr=False
    )

    def run(self, timeout_s: float) -> SupervisedRun:
        with StepProgress(self.launch.spec.steps, enabled=self.show_progress) as self._progress:
            return self._run(timeout_s)

    def _run(self, timeout_s: float) -> SupervisedRun:
        run_dir = Path(self.launch.run_dir)
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        tail = TelemetryTail(run_dir)
        tail.read_new()  # rows of earlier launches of this run folder are not this job's
        old = read_control(run_dir)
        launch = dataclasses.replace(self.launch, control_from_version=old["version"] if old else 0)
        costs = SwitchCosts()
        monitor = ReplanMonitor(
            self.plan,
            self.model,
            self.cluster,
            self.profiles,
            launch.spec.steps,
            self.cfg,
            costs,
            calibration=self.calibration,
        )
        while True:
            exit_path(run_dir).unlink(missing_ok=True)
            t_start = time.time()  # wall clock: compared with the ranks' wall_time_s
            proc = start_logged(torchrun_command(launch), rundir.node_log(run_dir), launch_env(launch))
            segment = {
                "plan_fingerprint": monitor.plan.fingerprint(),
                "world_size": monitor.world_size,
                "slow_rank": launch.spec.faults.slow_rank,
                "launch_s": None,
            }
            pending: tuple[Plan, dict[int, int], int] | None = None
            try:
                while proc.poll() is None:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"training ran past {timeout_s:.0f} s; its process group was killed")
                    time.sleep(self.poll_s)
                    rows = tail.read_new()
                    self._progress.update(rows)
                    if rows and segment["launch_s"] is None:
                        # from process start to the first step's start, as the ranks' clocks saw it
                        segment["launch_s"] = min(r["wall_time_s"] - r["step_time_s"] for r in rows) - t_start
                        costs = self._measured_costs(costs, rows, segment["launch_s"])
                        monitor.costs = costs
                    monitor.observe(rows)
                    if pending is None:
                        pending = self._decide(monitor, launch)
            except BaseException:
                kill_group(proc)
                raise
            job_exited(proc)
            rows = tail.read_new()
            monitor.observe(rows)
            self._progress.update(rows)
            segment["returncode"] = proc.returncode
            self.segments.append(segment)
            ex = read_exit(run_dir)
            segment["exit_step"] = ex["step"] if ex else None
            if proc.returncode != 0 or pending is None or ex is None or ex.get("version") != pending[2]:
                final = monitor.detection()
                return SupervisedRun(
                    returncode=proc.returncode,
                    wall_s=time.monotonic() - t0,
                    decisions=self.decisions,
                    segments=self.segments,
                    plan=monitor.plan,
                    final_detections=[dataclasses.asdict(s) for s in final.slowdowns],
                )
            new_plan, mapping, version = pending
            costs = dataclasses.replace(
                costs, checkpoint_save_s=float(ex.get("checkpoint_s") or costs.checkpoint_save_s)
            )
            rundir.plan_path(run_dir).write_text(new_plan.to_json())
            launch = dataclasses.replace(
                launch,
                nproc_per_node=new_plan.num_devices,
                control_from_version=version,
                spec=launch.spec.model_copy(
                    update={"resume": "auto", "fresh_start": False, "faults": launch.spec.faults.relabelled(mapping)}
                ),
            )
            cluster = cpu_cluster(new_plan.num_devices) if self.synthetic_cluster else self.cluster
            monitor = ReplanMonitor(
                new_plan,
                self.model,
                cluster,
                self.profiles,
                launch.spec.steps,
                dataclasses.replace(self.cfg, relayout=self.synthetic_cluster),
                costs,
                relaunched=True,
                calibration=self.calibration,
            )  # re-learns baselines quickly (planner/replan/monitor.py)

    def _measured_costs(self, costs: SwitchCosts, rows: list[dict[str, Any]], launch_s: float) -> SwitchCosts:
        saves = [r["checkpoint_s"] for r in rows if r.get("checkpoint_s")]
        loads = [r["checkpoint_load_s"] for r in rows if r.get("checkpoint_load_s")]
        return SwitchCosts(
            checkpoint_save_s=max(saves) if saves else costs.checkpoint_save_s,
            launch_s=max(launch_s, 0.0),
            checkpoint_load_s=max(loads) if loads else costs.checkpoint_load_s,
        )

    def _decide(self, monitor: ReplanMonitor, launch: Launch) -> tuple[Plan, dict[int, int], int] | None:
        """Poll the monitor; store and act on a decision. Returns a pending relayout, if one was ordered."""
        dec: MonitorDecision | None = monitor.poll()
        if dec is None:
            return None
        rec = dec.record("monitor")
        pending = None
        chosen = dec.result.chosen_plan
        action = dec.result.decision.chosen.action
        if self.act and chosen is not None:
            run_dir = launch.run_dir
            if action == "rebalance":
                rec["control_version"] = write_control(run_dir, "rebalance", batch_shares=list(chosen.batch_shares))
                monitor.switched(chosen, dec.step + 1)
                rec["new_plan_json"] = chosen.to_json()
            else:
                new_plan, mapping = relabel_for_runtime(chosen)
                version = write_control(run_dir, "checkpoint_exit", at_step=dec.step + 1)
                rec["control_version"], rec["new_plan_json"] = version, new_plan.to_json()
                pending = (new_plan, mapping, version)
            rec["acted"] = True
        self.decisions.append(rec)
        self.record(rec)
        return pending
