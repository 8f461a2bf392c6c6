"""The live re-planning loop's brain, without I/O: telemetry rows in, at most one decision out per change.

`ReplanMonitor.observe(rows)` takes new per-rank telemetry rows; `poll()` runs straggler detection
on the complete steps (every rank reported) and, when the set of slowdowns is new or a factor
moved by more than `redecide_drift` since the last decision, re-plans and decides
(planner/replan/options.py → planner/replan/gate.py). It waits until each factor rests on
`min_evidence_steps` slowed steps: a factor from the first 2–3 slowed steps of a noisy machine is
off by 20 % and would size the rebalance wrongly. Deciding only on change is the first guard
against flapping; no decision inside the cooldown after a switch and the gate's margin and
min_gain (hysteresis) are the second.
A clean run detects nothing and therefore never decides. The caller acts on a switch and reports
it back with `switched(plan, step)`.

After a relayout (checkpoint → relaunch) the caller starts a new monitor with `relaunched=True`.
The old baselines do not carry over: every rank's work per sample changed with its layers, and
the core count per rank with the world size. So they are re-learnt, over `relaunch_window` steps
instead of `detect.window`: a slowdown is seen only if it starts after the baseline, so with the
full window the first warm-up + window = 12 steps after a relaunch are blind (a slowdown starting
there is swallowed by the baseline, or caught late), with relaunch_window = 5 only 7.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Any

from planner.measure.calibrate import Calibration
from planner.measure.profiles import ProfileTable
from planner.replan.detect import DetectConfig, Detection, StepSample, detect, samples_from_rows
from planner.replan.gate import GateConfig
from planner.replan.options import ReplanResult, SwitchCosts, replan
from planner.specs.cluster import ClusterSpec
from planner.specs.config import SEARCH_BUDGET_S
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan


@dataclass(frozen=True)
class MonitorConfig:
    detect: DetectConfig = DetectConfig()
    gate: GateConfig = GateConfig()
    search_budget_s: float = SEARCH_BUDGET_S
    relayout: bool = True
    # decide once every slowdown's factor rests on this many slowed steps (0: detect.persistence)
    min_evidence_steps: int = 0
    redecide_drift: float = 0.10  # re-decide when a factor moved this much since the last decision
    relaunch_window: int = 5  # baseline steps after a relayout (see the module doc); ≥ 2 for a spread


@dataclass
class MonitorDecision:
    step: int
    detection: Detection
    result: ReplanResult
    measured_step_time_s: float | None

    def record(self, source: str = "monitor") -> dict[str, Any]:
        """The row storage.replan.save_decision stores (acted/control_version/new plan set by the caller)."""
        d = self.result.decision
        from planner.replan.options import options_table

        return {
            "step": self.step,
            "source": source,
            "detections": [
                {
                    "rank": s.rank,
                    "kind": s.kind,
                    "factor": s.factor,
                    "detected_at_step": s.detected_at_step,
                    "since_step": s.since_step,
                    "num_steps": s.num_steps,
                }
                for s in self.detection.slowdowns
            ],
            "options": options_table(self.result),
            "keep_step_time_s": d.keep_step_time_s,
            "measured_step_time_s": self.measured_step_time_s,
            "chosen_action": d.chosen.action,
            "net_gain_s": d.net_gain_s,
            "reason": d.reason,
            "acted": False,
            "control_version": None,
            "new_plan_json": None,
        }


@dataclass
class ReplanMonitor:
    plan: Plan
    model: ModelSpec
    cluster: ClusterSpec
    profiles: ProfileTable | None
    total_steps: int
    cfg: MonitorConfig = MonitorConfig()
    costs: SwitchCosts = SwitchCosts()
    world_size: int = 0
    relaunched: bool = False  # this monitor follows a relayout: baselines over cfg.relaunch_window steps
    calibration: Calibration | None = None  # the machine's measured corrections (storage.pricing)
    _rows: dict[tuple[int, int], StepSample] = field(default_factory=dict)
    _last_signature: dict[tuple[str, int], float] | None = None
    _last_switch_step: int | None = None

    def __post_init__(self) -> None:
        self.world_size = self.world_size or self.plan.num_devices

    def detect_config(self) -> DetectConfig:
        d = self.cfg.detect
        return replace(d, window=min(d.window, self.cfg.relaunch_window)) if self.relaunched else d

    def observe(self, rows: Iterable[dict[str, Any]]) -> None:
        for s in samples_from_rows(rows):
            self._rows[(s.step, s.rank)] = s

    def complete_steps(self) -> list[int]:
        count: dict[int, int] = {}
        for step, _ in self._rows:
            count[step] = count.get(step, 0) + 1
        return sorted(st for st, n in count.items() if n >= self.world_size)

    def recent_step_time_s(self, last: int = 3) -> float | None:
        steps = self.complete_steps()[-last:]
        if not steps:
            return None
        return median(max(s.step_time_s for (st, _), s in self._rows.items() if st == step) for step in steps)

    def _changed(self, det: Detection) -> bool:
        sig = {(s.kind, s.rank): s.factor for s in det.slowdowns}
        old = self._last_signature
        if old is None or set(sig) != set(old):
            return True
        return any(abs(sig[k] / old[k] - 1) > self.cfg.redecide_drift for k in sig)

    def poll(self) -> MonitorDecision | None:
        steps = set(self.complete_steps())
        if not steps:
            return None
        last = max(steps)
        since = None if self._last_switch_step is None else last - self._last_switch_step
        if since is not None and since < self.cfg.gate.cooldown_steps:
            return None  # the gate would refuse anyway; decide (once) when the cooldown is over
        det = detect([s for (st, _), s in self._rows.items() if st in steps], self.detect_config())
        evidence = self.cfg.min_evidence_steps or self.cfg.detect.persistence
        # slowdowns whose factor still rests on too few slowed steps wait for the next poll
        det = replace(det, slowdowns=tuple(s for s in det.slowdowns if s.num_steps >= evidence))
        if not det.any or not self._changed(det):
            return None
        self._last_signature = {(s.kind, s.rank): s.factor for s in det.slowdowns}
        result = replan(
            self.plan,
            self.model,
            self.cluster,
            self.profiles,
            det,
            remaining_steps=max(self.total_steps - last - 1, 0),
            measured_healthy_step_s=det.baseline_step_s or None,
            steps_since_switch=since,
            costs=self.costs,
            gate=self.cfg.gate,
            search_budget_s=self.cfg.search_budget_s,
            relayout=self.cfg.relayout,
            calibration=self.calibration,
        )
        return MonitorDecision(last, det, result, self.recent_step_time_s())

    def detection(self) -> Detection:
        """Detection over every complete step seen so far (the best factor estimates)."""
        steps = set(self.complete_steps())
        return detect([s for (st, _), s in self._rows.items() if st in steps], self.detect_config())

    def switched(self, plan: Plan, step: int) -> None:
        """The running job now uses `plan` (from `step` on)."""
        self.plan = plan
        self._last_switch_step = step
