"""Re-planning around measured stragglers: price keep / rebalance / relayout, then let the gate decide.

Inputs: the running Plan, the model, the cluster, profiles and a `straggler.Detection` (device id =
torchrun rank). The degraded view (planner/replan/degrade.py) slows each detected device by its measured
factor; every option is priced with the same cost model on that view:

- keep: the current plan, degraded.
- rebalance: same layout, batch shares re-split over replicas (multiples of the micro-batch size,
  summing to the global batch) by a greedy exchange: move one micro-batch from the replica that
  sets the step time to the one that stays fastest after taking it, while the predicted step
  improves. Cost: about one step (the ranks switch at a step boundary; nothing is reloaded).
- relayout: the plan search on the degraded cluster (it may move layers, shrink or drop the slow
  device); its plan is relabelled onto its ranks (`relabel_for_runtime`, planner/runtime.py's rank map).
  Cost: checkpoint save + relaunch + load, measured on this run when known.

The cost model's absolute times on a given machine are off by a roughly constant factor (CPU ranks
oversubscribing cores, estimated profiles), so every prediction is multiplied by
measured_healthy_step / predicted_healthy_step of the running plan: the options are compared in the
model's relative terms, the gain is stated in the run's real seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from planner.cost import estimate
from planner.measure.calibrate import Calibration
from planner.measure.profiles import ProfileTable
from planner.replan.degrade import degrade_cluster, degrade_profiles
from planner.replan.detect import Detection
from planner.replan.gate import Decision, GateConfig, Option, decide
from planner.runtime import device_to_rank, launch_problems, pipeline_replicas, rank_plan
from planner.search import SearchSpace, search  # at import, not at the first decision: it costs ~0.5 s (1–2 s loaded)
from planner.specs.cluster import ClusterSpec
from planner.specs.config import SEARCH_BUDGET_S
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan


@dataclass(frozen=True, slots=True)
class SwitchCosts:
    """Seconds of a switch besides the new plan's own steps (measured on this run when known)."""

    checkpoint_save_s: float = 2.0
    launch_s: float = 15.0
    checkpoint_load_s: float = 1.0

    @property
    def relayout_s(self) -> float:
        return self.checkpoint_save_s + self.launch_s + self.checkpoint_load_s


DEFAULT_COSTS = SwitchCosts()
DEFAULT_GATE = GateConfig()


@dataclass(frozen=True)
class ReplanResult:
    decision: Decision
    options: tuple[Option, ...]
    plans: dict[str, Plan] = field(default_factory=dict)  # action -> the plan that action switches to
    calibration: float = 1.0

    @property
    def chosen_plan(self) -> Plan | None:
        return self.plans.get(self.decision.chosen.action) if self.decision.switch else None


def runnable_reason(plan: Plan) -> str | None:
    """Why the torch runtime would refuse `plan` (planner/runtime.py's first problem), or None."""
    problems = launch_problems(plan)
    return str(problems[0]) if problems else None


def relabel_for_runtime(plan: Plan) -> tuple[Plan, dict[int, int]]:
    """`plan` on its ranks (planner/runtime.py's rank map) and the map old device id → rank.

    Any device order launches as it is; the relabelling keeps a relaunched run's telemetry (which
    names ranks) in the same ids as its plan, and the caller moves whatever is attached to a device
    (here: its injected fault) along the returned map.
    """
    return rank_plan(plan), device_to_rank(plan)


def _with_shares(plan: Plan, shares: list[int]) -> Plan:
    return plan.model_copy(update={"batch_shares": tuple(shares)})


def rebalance_shares(
    plan: Plan, price: Callable[[Plan], tuple[float, list[float]]], max_moves: int = 10_000
) -> tuple[Plan, float]:
    """Greedy exchange of micro-batches between replicas; `price(plan) -> (step_s, per-replica times)`.

    A move must lower the step time or, at the same step time, the next-slowest replicas' times
    (the sorted times, compared lexicographically): with two replicas tied for the slowest, moving
    work off one of them leaves the step unchanged, and a plain "step must drop" rule stopped
    there: at [12, 3, 9, 8] for rank 1 at 4× with 32 samples, and at [11, 2, 11, 8] for 3.85×
    (bench/straggler.py), where [10, 2, 10, 10] takes 10 samples' time, not 12 or 11."""
    mbs = plan.micro_batch_size
    shares = list(plan.batch_shares)
    best, times = price(plan)
    scale = best if best > 0 else 1.0

    def load(step: float, t: list[float]) -> tuple[float, ...]:
        return tuple(round(v / scale, 9) for v in (step, *sorted(t, reverse=True)))  # ties within 1e-9

    min_units = plan.pp if plan.schedule != "gpipe" and plan.pp > 1 else 1
    for _ in range(max_moves):
        src = max(range(len(shares)), key=lambda r: times[r])
        if shares[src] // mbs <= min_units:
            break
        tried = []
        for dst in range(len(shares)):
            if dst == src:
                continue
            cand = shares.copy()
            cand[src] -= mbs
            cand[dst] += mbs
            step, t = price(_with_shares(plan, cand))
            tried.append((load(step, t), dst, step, cand, t))
        key, _, step, cand, t = min(tried, key=lambda x: (x[0], x[1]))
        if key >= load(best, times):
            break
        best, shares, times = step, cand, t
    return _with_shares(plan, shares), best


def replica_times(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    profiles: ProfileTable | None,
    calibration: Calibration | None = None,
) -> tuple[float, list[float]]:
    """(step time, per-replica step time) — a replica's time is the plan restricted to its share."""
    step = estimate(plan, model, cluster, profiles, calibration=calibration).step_time_s
    if plan.dp == 1:
        return step, [step]
    times = []
    for r in range(plan.dp):
        # Price replica r alone: every replica gets r's share on r's devices (estimate takes the max);
        # a stage wider in dp than the plan serves pipeline r with several of its replicas
        alone = [
            s.model_copy(
                update={
                    "device_ids": tuple(
                        d for j in pipeline_replicas(plan, i % plan.pp, r) for d in s.replica_devices(j)
                    )
                    * plan.dp
                }
            )
            for i, s in enumerate(plan.stages)
        ]
        solo = plan.model_copy(
            update={
                "stages": tuple(alone),
                "batch_shares": (plan.batch_shares[r],) * plan.dp,
                "global_batch_size": plan.batch_shares[r] * plan.dp,
            }
        )
        # model_copy skips validation (the plan repeats device ids); estimate only reads ids: sound
        times.append(estimate(solo, model, cluster, profiles, calibration=calibration).step_time_s)
    return step, times


def replan(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    profiles: ProfileTable | None,
    detection: Detection,
    *,
    remaining_steps: int,
    measured_healthy_step_s: float | None = None,
    steps_since_switch: int | None = None,
    costs: SwitchCosts = DEFAULT_COSTS,
    gate: GateConfig = DEFAULT_GATE,
    search_budget_s: float = SEARCH_BUDGET_S,
    relayout: bool = True,
    calibration: Calibration | None = None,
) -> ReplanResult:
    """Price keep / rebalance / relayout under the detected slowdowns and decide (see module doc).

    `calibration` is the machine's measured corrections (planner.measure.calibrate), as the search
    and `estimate` price this cluster with them; the degradation multiplies on top of it."""
    degraded = degrade_cluster(cluster, detection.compute_factors(), detection.link_factors(), plan.dtype)
    dprof = degrade_profiles(profiles, degraded)
    healthy = estimate(plan, model, cluster, profiles, calibration=calibration).step_time_s
    cal = measured_healthy_step_s / healthy if measured_healthy_step_s and healthy > 0 else 1.0

    def price(p: Plan) -> tuple[float, list[float]]:
        step, times = replica_times(p, model, degraded, dprof, calibration)
        return step * cal, [t * cal for t in times]

    keep_s, _ = price(plan)
    options: list[Option] = []
    plans: dict[str, Plan] = {"keep": plan}
    if plan.dp > 1 and any(f > 1.0 for f in detection.compute_factors().values()):
        new, step = rebalance_shares(plan, price)
        if new.batch_shares != plan.batch_shares and runnable_reason(new) is None:
            options.append(Option("rebalance", step, keep_s, new.fingerprint()))  # one step, see module doc
            plans["rebalance"] = new
    if relayout:
        found = _search_relayout(model, degraded, dprof, plan, search_budget_s, calibration)
        if found is not None:
            # price the searched plan on the degraded view with its *original* ids, then relabel
            step = estimate(found, model, degraded, dprof, calibration=calibration).step_time_s * cal
            options.append(Option("relayout", step, costs.relayout_s + keep_s, found.fingerprint()))
            plans["relayout"] = found
    decision = decide(keep_s, options, remaining_steps, steps_since_switch, gate)
    return ReplanResult(decision, tuple(options), plans, cal)


def _search_relayout(
    model: ModelSpec,
    cluster: ClusterSpec,
    profiles: ProfileTable | None,
    plan: Plan,
    budget_s: float,
    calibration: Calibration | None = None,
) -> Plan | None:
    """The best plan the search finds on the degraded cluster that the runtime can launch."""
    space = SearchSpace(tps=(1, 2, 4, 8), schedules=("1f1b", "gpipe"), shardings=("none",))
    result = search(
        model,
        cluster,
        profiles,
        global_batch=plan.global_batch_size,
        seq=plan.seq_len,
        dtype=plan.dtype,
        top_k=5,
        time_budget_s=budget_s,
        space=space,
        baselines=False,
        calibration=calibration,
    )
    for p in getattr(result, "plans", ()):
        if runnable_reason(p) is None:
            return p
    return None


def options_table(result: ReplanResult) -> list[dict]:
    """One row per option for reports: action, predicted step, switch cost, net gain, chosen."""
    rows = [
        {
            "action": "keep",
            "step_time_s": result.decision.keep_step_time_s,
            "switch_cost_s": 0.0,
            "net_gain_s": 0.0,
            "chosen": not result.decision.switch,
        }
    ]
    for opt, net in result.decision.considered:
        rows.append(
            {
                "action": opt.action,
                "step_time_s": opt.step_time_s,
                "switch_cost_s": opt.switch_cost_s,
                "net_gain_s": net,
                "chosen": result.decision.switch and opt == result.decision.chosen,
            }
        )
    return rows
