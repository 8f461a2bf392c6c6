"""Many jobs on one mixed cluster: allocations and plans chosen together, round by round (pure core)."""

from planner.schedule.decide import CO_DESIGNED, Policy, decide
from planner.schedule.speed import PlannerSpeed, Price, SpeedSource, TableSpeed
from planner.schedule.types import (
    POLICIES,
    Action,
    Allocation,
    ClusterState,
    Decision,
    Job,
    Placement,
    Rejection,
    RunningJob,
    kind_alias,
)

__all__ = [
    "CO_DESIGNED",
    "POLICIES",
    "Action",
    "Allocation",
    "ClusterState",
    "Decision",
    "Job",
    "Placement",
    "PlannerSpeed",
    "Policy",
    "Price",
    "Rejection",
    "RunningJob",
    "SpeedSource",
    "TableSpeed",
    "decide",
    "kind_alias",
]
