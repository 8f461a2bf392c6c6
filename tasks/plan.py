"""Prefect tasks of stage 3 (plan): load profiles, search, store the ranked plans.

Policies (DESIGN §5): the search is deterministic in its inputs and costly, so it caches on
INPUTS + TASK_SOURCE with a persisted result (the specs and profile table are its inputs, not a
connection); reading and writing the database are NO_CACHE, and the write is an idempotent upsert.
"""

from __future__ import annotations

import statistics

from prefect import task
from prefect.cache_policies import NO_CACHE

from planner.measure.calibrate import Calibration, cpu_calibration, pipeline_overhead_from
from planner.measure.profiles import ProfileTable
from planner.search import NoFeasiblePlan, SearchResult, search
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from tasks.caching import stable_inputs


@task(name="load-profiles-for-plan", cache_policy=NO_CACHE)
def load_profiles(db_path: str, model: ModelSpec) -> ProfileTable:
    """Stored profiles of the model; an absent database or profile store means estimates only."""
    from storage.plans import load_profiles_or_empty

    return load_profiles_or_empty(db_path, model)[0]


@task(name="load-calibration", cache_policy=NO_CACHE)
def load_calibration(db_path: str, model: ModelSpec, snapshot: str | None = None) -> Calibration | None:
    """Measured corrections (planner.measure.calibrate) for a discovered snapshot whose devices are all CPU
    ranks under gloo: discovery's collective fits, pipeline-schedule and FSDP2 overheads, and the profiled
    optimizer step per parameter per layout.
    None for GPU clusters (the datasheet model with NCCL's overlap holds there) or unmeasured ones.
    Contention and lockstep come from discovery's concurrency bench (one rank alone, the ranks
    together, in lockstep; snapshots without it: contention 1, as the ranks were only probed together);
    the node's core count prices ranks that share cores (processor sharing in `estimate`)."""
    from storage.hardware import resolve_snapshot
    from storage.profiles import load_optimizer_profile

    snap = resolve_snapshot(db_path, snapshot)
    rates = [r for r in snap.devices["measured_flop_per_s"].to_list() if r]
    if set(snap.devices["kind"].to_list()) != {"cpu"} or not rates or snap.fits.height == 0:
        return None
    adam = load_optimizer_profile(db_path, model, "cpu")
    measurements = snap.measurements.to_dicts()
    overhead = pipeline_overhead_from(measurements, snap.cluster.nodes[0].intra_link)
    return cpu_calibration(
        statistics.median(rates),
        rates,
        snap.fits.to_dicts(),
        len(rates),
        snap.cores_per_node,
        adam.get("plain"),
        adam.get("tp"),
        overhead,
        measurements,
        adam.get("fsdp"),
        int(adam.get("num_ranks", 1)),
    )


@task(name="search-plans", cache_policy=stable_inputs(), persist_result=True)
def search_plans(
    model: ModelSpec,
    cluster: ClusterSpec,
    profiles: ProfileTable,
    global_batch: int,
    seq: int,
    top_k: int,
    time_budget_s: float,
    calibration: Calibration | None = None,
    dtype: str = "bf16",
) -> SearchResult | NoFeasiblePlan:
    return search(
        model,
        cluster,
        profiles,
        global_batch=global_batch,
        seq=seq,
        dtype=dtype,
        top_k=top_k,
        time_budget_s=time_budget_s,
        calibration=calibration,
    )


@task(name="store-plans", cache_policy=NO_CACHE)
def store_plans(db_path: str, result: SearchResult) -> str:
    from storage.plans import save_plans

    return save_plans(db_path, result.plans, result.baselines)
