"""`TrainRequest`: what `train_flow` is asked to do, as one validated value.

The flow takes ids (the database, the run) plus this request: the plan to train (a file or a stored
plan id), the launch (ranks, nodes, rendezvous), the training options, re-planning (the config's
`[replan]` section) and the faults to inject. The CLI builds it from `RunConfig` and its flags
(`parse(TrainRequest, ...)`: a bad value is a `MeshplanError` naming the field), the elastic job runner
from the job's row, tests directly. `extra="forbid"`: a misspelt option fails instead of being ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.specs.config import ReplanConfig, TrainConfig
from planner.specs.faults import NO_FAULTS, FaultSpec

_TRAIN = TrainConfig()


class SlurmRequest(BaseModel):
    """sbatch settings of a launch through Slurm; None = the cluster's default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    partition: str | None = Field(default=None, description="sbatch --partition")
    account: str | None = Field(default=None, description="sbatch --account")
    time_limit: str | None = Field(default=None, description="sbatch --time, e.g. 01:00:00")
    nodelist: str | None = Field(default=None, description="sbatch --nodelist, e.g. n[1-2]")
    constraint: str | None = Field(default=None, description="sbatch --constraint: the node kind as a feature")
    gres: str | None = Field(default=None, description="sbatch --gres, e.g. gpu:a100:8")
    requeue: bool | None = Field(default=None, description="None: the cluster's default; False: --no-requeue")


class TrainRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    plan_path: str | None = Field(default=None, description="plan JSON file (exactly one of plan_path, plan_id)")
    plan_id: str | None = Field(default=None, description="fingerprint of a plan stored by the search")
    steps: int = Field(default=_TRAIN.steps, gt=0, description="train until this many optimizer steps in total")
    nproc_per_node: int = Field(default=_TRAIN.nproc_per_node, gt=0)
    nnodes: int = Field(default=1, gt=0)
    node_rank: int = Field(default=0, ge=0)
    rdzv_endpoint: str = Field(default=_TRAIN.rdzv_endpoint, description="HOST:PORT of node 0 (several nodes)")
    local_nodes: bool = Field(
        default=False,
        description="launch every node's runner from here, master on 127.0.0.1 (nodes simulated on this machine)",
    )
    data: Literal["synthetic", "text"] = _TRAIN.data
    model: str = Field(default="", description="model preset; empty = the plan's model")
    model_json: str | None = Field(
        default=None,
        description="ModelSpec JSON file: the model by its dimensions (a custom model's plan); None = a preset",
    )
    lr: float = Field(default=_TRAIN.lr, gt=0)
    optimizer: Literal["adamw", "sgd"] = _TRAIN.optimizer
    seed: int = _TRAIN.seed
    checkpoint_every: int = Field(default=_TRAIN.checkpoint_every, ge=0, description="0 = only at the end")
    resume: str = Field(default="auto", description="auto | none | a checkpoint or run folder")
    fresh_start: bool = Field(
        default=False, description="when every checkpoint of the run folder is unreadable, train from step 0"
    )
    max_restarts: int = Field(default=_TRAIN.max_restarts, ge=0)
    runs_dir: str | None = Field(default=None, description="parent of the run folder; None = next to the database")
    timeout_s: float = Field(default=_TRAIN.timeout_s, gt=0, description="outer kill of the whole job")
    collective_timeout_s: float = Field(default=_TRAIN.collective_timeout_s, gt=0)
    replan: bool = Field(default=False, description="run under the live straggler monitor (one node)")
    replan_config: ReplanConfig = Field(default=ReplanConfig(), description="the monitor's settings; poll_s always")
    cluster_path: str | None = Field(default=None, description="cluster TOML for re-planning; None = CPU ranks")
    faults: FaultSpec = NO_FAULTS
    show_progress: bool = False
    executor: Literal["local", "slurm"] = Field(
        default="local", description="local: torchrun from this process; slurm: one sbatch job (launcher/slurm.py)"
    )
    slurm: SlurmRequest = Field(default_factory=lambda: SlurmRequest(), description="sbatch settings (executor slurm)")
    control_from_version: int | None = Field(
        default=None, description="control.json versions up to this are not this launch's; None = all present"
    )
