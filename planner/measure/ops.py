"""`BenchOp`: the names of what discovery's network bench (worker/netbench.py) times; `NetbenchSpec`:
what the bench's ranks are told (its command line, RunSpec's argv codec).

The ranks write these names into their measurement rows, DuckDB stores them (`hardware_measurements.op`,
`hardware_fits.op`), and the calibration (planner/measure/calibrate.py, discovery.py, targets.py)
and the cost model (`Calibration.fit`) look rows up by them: one enum on both sides, so a renamed or
misspelt op fails at import, not as a silently missing fit. A `StrEnum`, so stored values are the
plain strings they always were and rows read back from DuckDB compare equal to the members.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from planner.specs.config import DiscoverConfig
from planner.specs.runspec import ArgvModel

_DISCOVER = DiscoverConfig()


class BenchOp(StrEnum):
    # transfers, α–β fitted per link class (planner.measure.discovery.fit_snapshot)
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    SEND_RECV = "send_recv"  # one-way time of a ping-pong between a rank pair
    # runtime overheads, inputs of the calibration, never α–β fitted
    PIPELINE_MICROBATCH = "pipeline_microbatch"  # a trivial 2-stage 1F1B step, per micro-batch
    FSDP_MODULE = "fsdp_module"  # FSDP2 per sharded module, at two module sizes
    FSDP_TENSOR = "fsdp_tensor"  # FSDP2 per further tensor in a module
    COMPUTE_ALONE = "compute_alone"  # per-chunk compute of one rank alone,
    COMPUTE_FREE = "compute_free"  # of the ranks together running free,
    COMPUTE_LOCKSTEP = "compute_lockstep"  # and meeting after every chunk


COLLECTIVE_OPS = (BenchOp.ALL_REDUCE, BenchOp.ALL_GATHER, BenchOp.REDUCE_SCATTER)
FSDP_OPS = (BenchOp.FSDP_MODULE, BenchOp.FSDP_TENSOR)
CONCURRENCY_OPS = (BenchOp.COMPUTE_ALONE, BenchOp.COMPUTE_FREE, BenchOp.COMPUTE_LOCKSTEP)
OVERHEAD_OPS = frozenset({BenchOp.PIPELINE_MICROBATCH, *FSDP_OPS, *CONCURRENCY_OPS})


class NetbenchSpec(ArgvModel):
    """`python -m worker.netbench`'s command line, written by tasks/discover.py (`to_argv`) and parsed
    by every rank (`from_argv`); the defaults are `[discover]`'s."""

    out: str = Field(description="snapshot JSON written by rank 0")
    message_sizes: tuple[int, ...] = Field(
        default=_DISCOVER.message_sizes, min_length=1, description="bytes per message for the α–β fit"
    )
    repeats: int = Field(default=_DISCOVER.repeats, gt=0, description="timed repetitions (median reported)")
    matmul_size: int = Field(default=_DISCOVER.matmul_size, gt=0, description="square matmul size of the FLOP/s probe")
