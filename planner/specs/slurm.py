"""`SlurmOptions`: what sbatch is told beyond the launch, written once.

One frozen value from the CLI's flags (`meshplan train --partition ... --constraint ... --gres ...
--requeue/--no-requeue`) or a job's runner (the allocation's kind as gres or constraint) through
`TrainRequest.slurm` to `launcher/slurm.py`'s batch script, whole: no layer copies it field by field.
None = Slurm's (the cluster's) default. In the core because the CLI, the flows and the launcher all
hold it (like RunSpec); it imports nothing but pydantic.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SlurmOptions(BaseModel):
    """sbatch settings of a launch or a discovery through Slurm; None = the cluster's default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    partition: str | None = Field(default=None, description="sbatch --partition")
    account: str | None = Field(default=None, description="sbatch --account")
    time_limit: str | None = Field(default=None, description="sbatch --time, e.g. 01:00:00")
    nodelist: str | None = Field(default=None, description="sbatch --nodelist, e.g. n[1-2]")
    job_name: str | None = Field(default=None, description="sbatch --job-name; None = meshplan-<run id>")
    constraint: str | None = Field(default=None, description="sbatch --constraint: the node kind as a feature")
    gres: str | None = Field(default=None, description="sbatch --gres, e.g. gpu:a100:8")
    requeue: bool | None = Field(
        default=None, description="None: the cluster's default; False: --no-requeue (meshplan decides what follows)"
    )


SLURM_DEFAULTS = SlurmOptions()  # every setting left to the cluster
