"""The cost model: `estimate(plan, model, cluster, profiles) -> CostBreakdown` and its formulas."""

from planner.cost.estimate import COST_MODEL_VERSION, check_plan_fits_model, estimate
from planner.cost.profiles_for import ProfileNeed, profiles_for

__all__ = ["COST_MODEL_VERSION", "ProfileNeed", "check_plan_fits_model", "estimate", "profiles_for"]
