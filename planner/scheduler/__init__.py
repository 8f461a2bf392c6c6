"""Many jobs on one mixed cluster: allocations and plans chosen together, round by round (pure core)."""

from planner.scheduler.decide import CO_DESIGNED, Policy, decide
from planner.scheduler.speed import PlannerSpeed, Price, SpeedSource, TableSpeed
from planner.scheduler.types import (
    DEFAULT_POLICY,
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
    "DEFAULT_POLICY",
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
