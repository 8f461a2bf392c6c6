"""Fault injection: a slow device and a slow link from a chosen step, and a crashed rank.

What to inject is one `planner.specs.faults.FaultSpec`, passed to every rank as `--faults JSON`
(a RunSpec field: planner/specs/runspec.py); this module acts on it in the rank that it names.

- Compute (`slow_rank` R, `slow_factor` F, `slow_from_step` S): each call of rank R's pipeline
  stage compute entry points (forward_one_chunk / backward_one_chunk / backward_weight_one_chunk,
  the same points ComputeTimer measures: one call = one micro-batch) is timed and then padded
  with a sleep so that, call by call, it lasts F × that entry point's *mean* healthy duration
  (its calls in steps 1..S−1). So compute is stretched F× in proportion to the work — more
  micro-batches, more delay — like a throttled GPU. Why a fixed target and not (F − 1) × the
  call's own time: with more ranks than cores, a rank that sleeps leaves its core to the others,
  so its own later calls run faster and "(F − 1) × own time" delivered only ~1.5× for F = 2
  (measured, 4 ranks on 2 cores). Why the mean and not the median: with 4 ranks on 2 cores a call
  takes ~2 ms when it has a core and ~12 ms when it is preempted (bimodal, measured), so the median
  call says little about the time per micro-batch, which is what throughput is made of; padding to
  F × median delivered 1.4–1.5× of per-sample compute for F = 2. A call that still overruns its
  target (preempted) is credited against the next calls' padding, up to one target's worth, so
  the slowed compute per step is F × healthy per step on average and not inflated by the
  contention the healthy mean already contains. The price of a fixed target: if other jobs load
  the machine more after S than before, the healthy ranks slow down and the slow one (already
  padded) less so, and F relative to its peers shrinks. With no healthy call seen (S = 0) it
  falls back to (F − 1) × the call's own time.
  A sleep, not a busy loop: a slow GPU does not take CPU from its neighbours.
- Link (`link_rank` R, `link_s_per_mib` X, `link_s_per_msg` Y, from `link_from_step`): before rank R sends, it waits X seconds per MiB sent plus Y per message
  — on pipeline p2p sends (pipelining's `_batch_p2p`, through which every schedule sends) and on
  the data-parallel gradient all-reduce of sharding "none" (GradSumSync). FSDP's own collectives are
  not delayed. The wait lands outside compute chunks, so it shows up as comm_wait_s.
- Crash (`kill_rank` R, `kill_step` S): rank R SIGKILLs itself at the start of step S in torchrun's
  first attempt only, like a lost GPU, so the restart + resume path runs (restart tests).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from statistics import fmean
from typing import Any

import torch.distributed as dist

from planner.specs.faults import FaultSpec

MIB = float(1 << 20)


class Faults:
    """This rank's injected faults; `step` is advanced by the training loop."""

    def __init__(self, spec: FaultSpec, rank: int) -> None:
        self.spec = spec
        self.step = 0
        self._healthy: dict[tuple[int, str], list[float]] = {}
        self._owed: dict[tuple[int, str], float] = {}  # padding owed per entry point (< 0: overran, credited)
        self.compute_on = spec.compute_on and rank == spec.slow_rank
        self.link_on = spec.link_on and rank == spec.link_rank
        self.kill_on = spec.kill_on and rank == spec.kill_rank
        if self.link_on:
            self._patch_p2p()

    def maybe_kill(self, step: int, attempt: int) -> None:
        """SIGKILL this rank at the start of `kill_step` in the first attempt (a crash, not an exit)."""
        if self.kill_on and attempt == 0 and step == self.spec.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)

    def _slow_now(self) -> bool:
        return self.compute_on and self.step >= self.spec.slow_from_step

    def _link_now(self) -> bool:
        return self.link_on and self.step >= self.spec.link_from_step

    def wrap_compute(self, fn: Callable[..., Any], key: tuple[int, str]) -> Callable[..., Any]:
        healthy = self._healthy.setdefault(key, [])

        def slowed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            took = time.perf_counter() - t0
            if not self._slow_now():
                if self.step > 0:  # step 0 pays one-off warm-up costs; the detector skips it too
                    healthy.append(took)
                return out
            if healthy:
                target = self.spec.slow_factor * fmean(healthy)
                owed = max(self._owed.get(key, 0.0), -target) + target - took
            else:
                owed = (self.spec.slow_factor - 1.0) * took
            if owed > 0:
                t1 = time.perf_counter()
                time.sleep(owed)
                owed -= time.perf_counter() - t1  # a sleep overshoots by ~0.1 ms: paid back next call
            self._owed[key] = owed
            return out

        return slowed

    def instrument_stage(self, stage: Any) -> None:
        if not self.compute_on:
            return
        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            if hasattr(stage, name):
                setattr(stage, name, self.wrap_compute(getattr(stage, name), (stage.stage_index, name)))

    def delay_send(self, num_bytes: int, num_messages: int = 1) -> None:
        if self._link_now():
            time.sleep(self.spec.link_s_per_mib * num_bytes / MIB + self.spec.link_s_per_msg * num_messages)

    def _patch_p2p(self) -> None:
        # Every pipelining schedule sends through schedules._batch_p2p (homogeneous batches of sends
        # go straight to dist.isend, mixed ones to dist.batch_isend_irecv), looked up as a module
        # global at call time; only this rank's process is patched, and only sends are delayed.
        from torch.distributed.pipelining import schedules

        original = schedules._batch_p2p

        def delayed(p2p_ops: list[dist.P2POp], *args: Any, **kwargs: Any) -> Any:
            sends = [op for op in p2p_ops if op.op in (dist.isend, dist.send)]
            if sends:
                self.delay_send(sum(op.tensor.numel() * op.tensor.element_size() for op in sends), len(sends))
            return original(p2p_ops, *args, **kwargs)

        schedules._batch_p2p = delayed
