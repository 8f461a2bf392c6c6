"""Gradient clipping by the norm of the whole model's gradient, whatever the plan splits it over.

`torch.nn.utils.clip_grad_norm_` sees one rank's parameters; under a plan they are spread: pipeline
stages hold different layers, TP and FSDP shard a parameter (a DTensor) over ranks, data/context
parallel replicas hold copies. The norm the single-process run would clip by is

    ‖g‖² = Σ_stages ‖g_stage‖²,

and every rank of a stage can compute its stage's ‖g_stage‖² alike: a DTensor's norm is reduced over
its mesh (`full_tensor`, the collective clip_grad_norm_ uses for FSDP2/TP), a replicated gradient is
the same on every replica once gradients are synced (the optimizer relies on that too). A stage is
held by len(stage.device_ids) ranks, so each rank adds ‖g_stage‖² / that count, and one all-reduce
over the world gives ‖g‖² on every rank. Every rank then scales its gradients by
min(1, max_norm / (‖g‖ + 1e-6)) — clip_grad_norm_'s rule — so all replicas step alike.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from planner.specs.plan import Plan


def _norm_sq(part: nn.Module, device: torch.device) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64, device=device)
    for p in part.parameters():
        if p.grad is None:
            continue
        n = torch.linalg.vector_norm(p.grad, 2, dtype=torch.float32)
        if isinstance(n, DTensor):
            n = n.full_tensor()  # collective over the parameter's mesh: the same order on every rank of it
        total += n.double() ** 2
    return total


def global_grad_norm(
    parts: list[nn.Module], stages: list[int], plan: Plan, device: torch.device, extra: tuple[float, float] = (0, 0)
) -> tuple[float, float, float]:
    """Collective: (the whole model's gradient norm, Σ over ranks of extra[0], Σ of extra[1]) in one
    all-reduce; the train loop sends its non-finite-loss flag and the logged loss as `extra`, so
    every rank learns in the same collective whether the step diverged (worker/train.py)."""
    local = torch.zeros(3, dtype=torch.float64, device=device)
    for part, vi in zip(parts, stages, strict=True):
        local[0] += _norm_sq(part, device) / len(plan.stages[vi].device_ids)
    local[1], local[2] = float(extra[0]), float(extra[1])
    dist.all_reduce(local)
    return float(local[0].sqrt()), float(local[1]), float(local[2])


def clip_grad_norm(
    parts: list[nn.Module],
    stages: list[int],
    plan: Plan,
    max_norm: float,
    device: torch.device,
    norm: float | None = None,
) -> float:
    """Clip every rank's gradients by the whole model's gradient norm; returns that norm (before clipping).

    `stages[i]` is the plan stage `parts[i]` holds. Collective: every rank of the world calls it
    (not collective when `norm`, the global norm already reduced, is given)."""
    if norm is None:
        norm = global_grad_norm(parts, stages, plan, device)[0]
    coef = min(1.0, max_norm / (norm + 1e-6))
    if coef < 1.0:
        for part in parts:
            for p in part.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
    return norm
