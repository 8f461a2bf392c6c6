"""`BenchOp`: the names of what discovery's network bench (worker/netbench.py) times; `NetbenchSpec` and
`ProfilerSpec`: what the bench's ranks and the layer profiler (worker/profile_layers.py) are told —
their command lines, in RunSpec's argv codec (planner/specs/runspec.py), parsed nowhere else.

The ranks write these names into their measurement rows, DuckDB stores them (`hardware_measurements.op`,
`hardware_fits.op`), and the calibration (planner/measure/calibrate.py, discovery.py, targets.py)
and the cost model (`Calibration.fit`) look rows up by them: one enum on both sides, so a renamed or
misspelt op fails at import, not as a silently missing fit. A `StrEnum`, so stored values are the
plain strings they always were and rows read back from DuckDB compare equal to the members.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from planner.errors import MeshplanError
from planner.specs.config import DiscoverConfig
from planner.specs.flops import LAYER_KINDS, LayerKind
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


class ProfilerSpec(ArgvModel):
    """`python -m worker.profile_layers`'s command line (tasks/profile.py writes it with `to_argv`):
    rows for a grid (or `requests_json`) of layer shapes, or one of two probes (`print_device`,
    `optimizer`)."""

    spec_json: str = Field(default="", description="ModelSpec as JSON text, or @file")
    out: str = Field(default="", description="JSONL file to append rows to")
    requests_json: str = Field(default="", description="JSON list of requests (text or file); overrides the grid")
    layers: tuple[LayerKind, ...] = Field(default=LAYER_KINDS, min_length=1)
    mbs: tuple[Annotated[int, Field(gt=0)], ...] = (1,)
    seq: tuple[Annotated[int, Field(gt=0)], ...] = Field(default=(), description="default: the model's seq_len")
    tp: tuple[Annotated[int, Field(gt=0)], ...] = (1,)
    recompute: tuple[Annotated[int, Field(ge=0, le=1)], ...] = (0,)
    device: str = Field(default="auto", description="auto (first CUDA GPU, else cpu), cpu or cuda:N")
    device_kind: str = Field(default="", description="name rows are stored under (default: catalog name of device)")
    dtype: Literal["", "fp32", "bf16", "fp16"] = Field(default="", description="default: bf16 on GPU, fp32 on CPU")
    repeats: int = Field(default=5, gt=0, description="timed blocks; the median is reported")
    rounds: int = Field(default=3, gt=0, description="round-robin timing passes; the median one is kept")
    warmup: int = Field(default=2, ge=0)
    min_block_s: float = Field(default=0.05, gt=0, description="minimum duration of one timed block")
    threads: int = Field(default=1, gt=0, description="CPU threads (1: stable timings on shared machines)")
    progress: bool = Field(default=False, description="show a progress bar on stderr")
    tp_group: Literal["fake", "real"] = Field(
        default="fake", description="time tp blocks on a fake in-process group, or as one of tp real ranks (torchrun)"
    )
    print_device: bool = Field(default=False, description="print the local device kind and exit")
    optimizer: bool = Field(
        default=False, description="print AdamW's CPU step time per parameter (plain, tp, fsdp) for spec_json and exit"
    )

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.optimizer and not self.spec_json:
            raise MeshplanError("--optimizer", True, "needs --spec-json")
        if not self.print_device and not self.optimizer and not (self.spec_json and self.out):
            raise MeshplanError("--spec-json/--out", None, "both are required to measure rows")
        return self
