"""`TrainRequest`: what `train_flow` is asked to do, as one validated value.

The flow takes ids (the database, the run) plus this request: the plan to train (a file or a stored
plan id), what the ranks are told (`spec`: a RunSpec, planner/specs/runspec.py — options, model,
resume, faults), the launch (ranks, nodes, rendezvous), re-planning (the config's `[replan]`
section). The CLI builds it from `RunConfig` and its flags (`request_fields`, then `parse(TrainRequest,
...)`: a bad value is a `MeshplanError` naming the field), the elastic job runner from the job's row,
tests directly. `extra="forbid"`: a misspelt option fails instead of being ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.specs.config import ReplanConfig, TrainConfig
from planner.specs.runspec import RunOptions, RunSpec
from planner.specs.slurm import SlurmOptions

_TRAIN = TrainConfig()


class TrainRequest(BaseModel):
    """Plan source + what the ranks are told (`spec`) + topology + re-planning + executor."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan_path: str | None = Field(default=None, description="plan JSON file (exactly one of plan_path, plan_id)")
    plan_id: str | None = Field(default=None, description="fingerprint of a plan stored by the search")
    spec: RunSpec = Field(default=RunSpec(), description="what every rank is told (planner/specs/runspec.py)")
    nproc_per_node: int | None = Field(
        default=_TRAIN.nproc_per_node, gt=0, description="ranks per node; None = the plan's devices ÷ nnodes"
    )
    nnodes: int = Field(default=1, gt=0)
    node_rank: int = Field(default=0, ge=0)
    rdzv_endpoint: str = Field(default=_TRAIN.rdzv_endpoint, description="HOST:PORT of node 0 (several nodes)")
    local_nodes: bool = Field(
        default=False,
        description="launch every node's runner from here, master on 127.0.0.1 (nodes simulated on this machine)",
    )
    max_restarts: int = Field(default=_TRAIN.max_restarts, ge=0)
    runs_dir: str | None = Field(default=None, description="parent of the run folder; None = next to the database")
    timeout_s: float = Field(default=_TRAIN.timeout_s, gt=0, description="outer kill of the whole job")
    replan: bool = Field(default=False, description="run under the live straggler monitor (one node)")
    replan_config: ReplanConfig = Field(default=ReplanConfig(), description="the monitor's settings; poll_s always")
    cluster_path: str | None = Field(default=None, description="cluster TOML for re-planning; None = CPU ranks")
    show_progress: bool = False
    executor: Literal["local", "slurm"] = Field(
        default="local", description="local: torchrun from this process; slurm: one sbatch job (launcher/slurm.py)"
    )
    slurm: SlurmOptions = Field(default=SlurmOptions(), description="sbatch settings (executor slurm), whole")
    control_from_version: int | None = Field(
        default=None, description="control.json versions up to this are not this launch's; None = all present"
    )


def request_fields(train: TrainConfig, spec: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """TrainRequest fields from a `[train]` section: its options go into `spec` (with the run's own
    `spec` entries: model, resume, faults), its launch knobs beside; `fields` override those.
    A dict, so `parse(TrainRequest, ...)` checks it and names a bad field."""
    launch = {k: getattr(train, k) for k in TrainConfig.model_fields if k not in RunOptions.model_fields}
    return {**launch, **fields, "spec": {**train.options(), **(spec or {})}}
