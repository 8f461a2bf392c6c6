"""Plan search: device classes × outer enumeration × exact inner split solver; baselines; oracle."""

from planner.search.search import ALGORITHM, NoFeasiblePlan, SearchResult, SearchStats, search
from planner.search.space import SearchSpace

__all__ = ["ALGORITHM", "NoFeasiblePlan", "SearchResult", "SearchSpace", "SearchStats", "search"]
