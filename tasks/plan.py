"""Prefect tasks of stage 3 (plan): prepare the search's inputs, search, store the ranked plans.

Policies (DESIGN.md, Prefect): the search is deterministic in its inputs and costly, so it caches on
INPUTS + TASK_SOURCE with a persisted result (the specs and profile table are its inputs, not a
connection); reading and writing the database are NO_CACHE, and the write is an idempotent upsert.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from planner.measure.calibrate import Calibration
from planner.search import NoFeasiblePlan, SearchResult
from planner.specs.model import ModelSpec
from storage import pricing
from storage.pricing import PricingInputs, pricing_inputs
from tasks.caching import stable_inputs
from tasks.searching import SearchJob, run_search


@task(name="prepare-search", cache_policy=NO_CACHE)
def prepare_search(
    db_path: str, model: ModelSpec, cluster_file: str | None, snapshot: str | None, cpu_dtype: str
) -> PricingInputs:
    """Cluster, profiles, calibration and dtype (storage.pricing.pricing_inputs: what `meshplan plan`
    and `meshplan estimate` price with too)."""
    return pricing_inputs(db_path, model, cluster_file, snapshot, cpu_dtype)


@task(name="load-calibration", cache_policy=NO_CACHE)
def load_calibration(db_path: str, model: ModelSpec, snapshot: str | None = None) -> Calibration | None:
    """storage.pricing.load_calibration as a task: a discovered CPU snapshot's measured corrections."""
    return pricing.load_calibration(db_path, model, snapshot)


@task(name="search-plans", cache_policy=stable_inputs(), persist_result=True)
def search_plans(job: SearchJob) -> SearchResult | NoFeasiblePlan:
    """tasks.searching.run_search as a cached task (`meshplan plan` calls that function directly)."""
    return run_search(job)


@task(name="store-plans", cache_policy=NO_CACHE)
def store_plans(db_path: str, result: SearchResult) -> str:
    from storage.plans import save_plans

    return save_plans(db_path, result.plans, result.baselines)
