"""The cost model: `estimate(plan, model, cluster, profiles) -> CostBreakdown` and its formulas."""

from planner.cost.completion import ProfileNeed, complete_profiles
from planner.cost.estimate import COST_MODEL_VERSION, check_plan_fits_model, estimate

__all__ = ["COST_MODEL_VERSION", "ProfileNeed", "check_plan_fits_model", "estimate", "complete_profiles"]
