"""The switch decision: re-plan only when the predicted gain beats the cost of switching.

For each candidate action a (cheapest first: keep, rebalance batch shares in-process, relayout
through checkpoint → relaunch → resume) with predicted step time t_a under the *measured*
slowdowns and one-off switch cost c_a:

    net_a = (t_keep − t_a) × remaining_steps − c_a

Switch to the action with the largest net gain if net > margin_s, its step time is at least
`min_gain` (relative) better than keeping — hysteresis, so noise in the prediction cannot make
two plans alternate — and at least `cooldown_steps` have passed since the last switch. Ties go
to the cheaper action.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Action = Literal["keep", "rebalance", "relayout"]
_ORDER: dict[str, int] = {"keep": 0, "rebalance": 1, "relayout": 2}


@dataclass(frozen=True, slots=True)
class Option:
    action: Action
    step_time_s: float
    switch_cost_s: float
    plan_id: str = ""


@dataclass(frozen=True, slots=True)
class GateConfig:
    margin_s: float = 1.0
    min_gain: float = 0.05
    cooldown_steps: int = 5


@dataclass(frozen=True, slots=True)
class Decision:
    chosen: Option
    keep_step_time_s: float
    net_gain_s: float
    reason: str
    considered: tuple[tuple[Option, float], ...] = field(default=())

    @property
    def switch(self) -> bool:
        return self.chosen.action != "keep"


def decide(
    keep_step_time_s: float,
    options: list[Option],
    remaining_steps: int,
    steps_since_switch: int | None = None,
    cfg: GateConfig = GateConfig(),
) -> Decision:
    keep = Option("keep", keep_step_time_s, 0.0)
    scored = [(o, (keep_step_time_s - o.step_time_s) * remaining_steps - o.switch_cost_s) for o in options]
    considered = tuple(scored)
    if steps_since_switch is not None and steps_since_switch < cfg.cooldown_steps:
        return Decision(
            keep, keep_step_time_s, 0.0, f"cooldown: last switch {steps_since_switch} steps ago", considered
        )
    eligible = [
        (o, net) for o, net in scored if net > cfg.margin_s and o.step_time_s <= keep_step_time_s * (1 - cfg.min_gain)
    ]
    if not eligible:
        best = max(scored, key=lambda x: x[1], default=None)
        why = (
            "no option predicted"
            if best is None
            else (
                f"best option {best[0].action} nets {best[1]:.2f} s over {remaining_steps} steps "
                f"(needs > {cfg.margin_s:.2f} s and ≥ {cfg.min_gain:.0%} faster steps)"
            )
        )
        return Decision(keep, keep_step_time_s, 0.0, why, considered)
    chosen, net = max(eligible, key=lambda x: (round(x[1], 9), -_ORDER[x[0].action]))
    return Decision(
        chosen,
        keep_step_time_s,
        net,
        f"{chosen.action}: {keep_step_time_s:.3f} → {chosen.step_time_s:.3f} s/step × {remaining_steps} steps "
        f"− {chosen.switch_cost_s:.2f} s switch = {net:.2f} s saved",
        considered,
    )
