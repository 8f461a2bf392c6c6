"""Prefect tasks of stage 3 (plan): load profiles, search, store the ranked plans.

Policies (DESIGN §5): the search is deterministic in its inputs and costly, so it caches on
INPUTS + TASK_SOURCE with a persisted result (the specs and profile table are its inputs, not a
connection); reading and writing the database are NO_CACHE, and the write is an idempotent upsert.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from planner.cluster import ClusterSpec
from planner.model import ModelSpec
from planner.profiles import ProfileTable
from planner.search import NoFeasiblePlan, SearchResult, search
from tasks.caching import stable_inputs


@task(name="load-profiles-for-plan", cache_policy=NO_CACHE)
def load_profiles(db_path: str, model: ModelSpec) -> ProfileTable:
    """Stored profiles of the model; an absent database or profile store means estimates only."""
    from storage.plans import load_profiles_or_empty

    return load_profiles_or_empty(db_path, model)[0]


@task(name="search-plans", cache_policy=stable_inputs(), persist_result=True)
def search_plans(
    model: ModelSpec, cluster: ClusterSpec, profiles: ProfileTable, global_batch: int, seq: int, top_k: int,
    time_budget_s: float,
) -> SearchResult | NoFeasiblePlan:  # fmt: skip
    return search(
        model, cluster, profiles, global_batch=global_batch, seq=seq, top_k=top_k, time_budget_s=time_budget_s
    )


@task(name="store-plans", cache_policy=NO_CACHE)
def store_plans(db_path: str, result: SearchResult) -> str:
    from storage.plans import save_plans

    return save_plans(db_path, result.plans, result.baselines)
