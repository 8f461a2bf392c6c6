"""The plan search as a plain function, without Prefect: `meshplan plan` calls it in process (no
Prefect import, about a second of start-up saved), and tasks.plan.search_plans wraps the same
function as the cached task plan_flow runs, so both rank alike."""

from __future__ import annotations

from planner.measure.calibrate import Calibration
from planner.measure.profiles import ProfileTable
from planner.search import NoFeasiblePlan, SearchResult, SearchSpace, search
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from storage.pricing import PricingInputs


def run_search(
    model: ModelSpec,
    cluster: ClusterSpec,
    profiles: ProfileTable,
    global_batch: int,
    seq: int,
    top_k: int,
    time_budget_s: float,
    calibration: Calibration | None = None,
    dtype: str = "bf16",
    fp8: bool = False,
) -> SearchResult | NoFeasiblePlan:
    """planner.search.search with the inputs storage.pricing.pricing_inputs read.
    `fp8`: search fp8 linears too (SearchSpace.fp8)."""
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
        space=SearchSpace(fp8=True) if fp8 else None,
    )


def search_args(
    model: ModelSpec,
    inputs: PricingInputs,
    global_batch: int,
    seq: int,
    top_k: int,
    time_budget_s: float,
    fp8: bool = False,
) -> tuple:
    """`run_search`' (and the task's) arguments for these inputs: one mapping for plan_flow (which
    calls the cached task) and `meshplan plan` (which calls the function), so both rank alike; seq 0
    = the model's."""
    return (
        model,
        inputs.cluster,
        inputs.profiles,
        global_batch,
        seq or model.seq_len,
        top_k,
        time_budget_s,
        inputs.calibration,
        inputs.dtype,
        fp8,
    )
