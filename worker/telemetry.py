"""Per-rank, per-step telemetry written as JSON lines into the run folder (the flow ingests them).

Time split of one step (seconds, wall clock; on CUDA each measured region ends with a synchronize):
- `compute_s`: time inside the pipeline stage's forward_one_chunk / backward_one_chunk calls, i.e.
  this rank's own forward and backward math (FSDP2 gathers issued inside a chunk's forward count
  here too; its final reduce-scatter does not).
- `optimizer_s`: the optimizer step.
- `comm_wait_s` = step_time_s − compute_s − optimizer_s: waiting on pipeline send/recv (including
  the bubble), FSDP reduce-scatters and the sharding-"none" gradient all-reduce.
Memory: CUDA max allocated bytes on GPU; on CPU the process's peak RSS (a coarse upper bound).
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import rundir

telemetry_path = rundir.telemetry_path  # the run folder's module owns the layout


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ComputeTimer:
    """Accumulates wall time spent in wrapped callables (the stage's compute entry points)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.total_s = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sync_device(self.device)
                self.total_s += time.perf_counter() - t0

        return timed

    def instrument_stage(self, stage: Any) -> None:
        # Instance attributes shadow the methods the schedules call, so no schedule code is touched.
        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            if hasattr(stage, name):
                setattr(stage, name, self.wrap(getattr(stage, name)))

    def reset(self) -> float:
        total, self.total_s = self.total_s, 0.0
        return total


def resident_bytes() -> int:
    """This process's resident set now (/proc/self/statm's resident pages; elsewhere the peak, ru_maxrss)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu_max_rss"


class StepLog:
    """Appends one JSON object per step to this rank's file; flushed every line so a killed run keeps its rows."""

    def __init__(self, run_dir: Path, rank: int, static: dict[str, Any]) -> None:
        path = telemetry_path(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a")
        self._static = static

    def update_static(self, static: dict[str, Any]) -> None:
        self._static = static

    def write(self, **fields: Any) -> None:
        row = {**self._static, **fields, "wall_time_s": time.time()}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
