"""The plan search as a plain function, without Prefect: `meshplan plan` calls it in process (no
Prefect import, about a second of start-up saved), and tasks.plan.search_plans wraps the same
function as the cached task plan_flow runs, so both rank alike."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.runtimes import Pricing
from planner.measure.calibrate import Calibration
from planner.measure.profiles import ProfileTable
from planner.search import NoFeasiblePlan, SearchResult, SearchSpace, search
from planner.specs.cluster import ClusterSpec
from planner.specs.config import SearchConfig
from planner.specs.model import ModelSpec
from storage.pricing import PricingInputs


@dataclass(frozen=True)
class SearchJob:
    """One plan search, whole: the model, what it is priced against (storage.pricing's inputs:
    cluster, profiles, calibration, dtype) and the `[search]` knobs the search reads. plan_flow's
    cached task and `meshplan plan` take this one value, so both rank alike (and the task's cache
    key is its fields')."""

    model: ModelSpec
    cluster: ClusterSpec
    profiles: ProfileTable | None
    global_batch: int
    seq: int
    top_k: int
    time_budget_s: float
    calibration: Calibration | None = None
    dtype: str = "bf16"
    fp8: bool = False  # search fp8 linears too (SearchSpace.fp8)
    # the runtime plans are searched under, with its calibrated figures (planner.cost.runtimes.Pricing);
    # None: meshplan's plain estimate
    pricing: Pricing | None = None
    num_devices: int | None = None  # only plans on this many devices (SearchSpace.num_devices)

    @classmethod
    def of(
        cls, model: ModelSpec, inputs: PricingInputs, search: SearchConfig, pricing: Pricing | None = None
    ) -> SearchJob:
        """The search `[search]` asks for on these inputs, under `pricing` (flows.queries.runtime_pricing:
        `search.runtime` or --runtime with its stored figures); seq 0 = the model's."""
        return cls(
            model=model,
            cluster=inputs.cluster,
            profiles=inputs.profiles,
            global_batch=search.global_batch,
            seq=search.seq or model.seq_len,
            top_k=search.top_k,
            time_budget_s=search.time_budget_s,
            calibration=inputs.calibration,
            dtype=inputs.dtype,
            fp8=search.fp8,
            pricing=pricing,
            num_devices=whole_cluster(inputs),
        )


def run_search(job: SearchJob) -> SearchResult | NoFeasiblePlan:
    """planner.search.search on one SearchJob."""
    return search(
        job.model,
        job.cluster,
        job.profiles,
        global_batch=job.global_batch,
        seq=job.seq,
        dtype=job.dtype,
        top_k=job.top_k,
        time_budget_s=job.time_budget_s,
        calibration=job.calibration,
        space=SearchSpace(fp8=job.fp8, num_devices=job.num_devices),
        pricing=job.pricing,
    )


def whole_cluster(inputs: PricingInputs) -> int | None:
    """Every device of a discovered several-node cluster (Slurm's, or one measured by hand with
    torchrun), else None. Such a cluster is launched as nodes × ranks a node (`train --executor slurm
    --nnodes N --nproc-per-node R`, torchrun's equal ranks on every node), so a plan on some of its
    devices (3 of 2 × 2) is one the launch it was discovered for cannot run."""
    c = inputs.cluster
    return c.num_devices if inputs.snapshot is not None and c.num_nodes > 1 else None
