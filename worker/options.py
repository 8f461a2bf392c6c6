"""Command-line options of `python -m worker.train` (what torchrun passes every rank) and the optimizer."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from planner.errors import MeshplanError
from planner.specs.faults import NO_FAULTS, FaultSpec

OPTIMIZERS = ("adamw", "sgd")


@dataclass(frozen=True)
class TrainOptions:
    plan: Path
    run_dir: Path
    run_id: str
    model: str  # preset name; "" = the plan's model
    model_json: Path | None  # a ModelSpec JSON file instead of a preset
    steps: int  # train until this many optimizer steps have been taken in total
    data: str
    lr: float
    optimizer: str
    seed: int
    checkpoint_every: int  # 0 = only at the end
    # "auto" (latest valid in run_dir; all unreadable stops the run), "fresh-start" (auto, but all
    # unreadable starts from step 0), "none", or a checkpoint folder (may come from another plan)
    resume: str
    timeout_s: float  # collective / store timeout
    dtype: str  # "auto": the plan's dtype on CUDA, fp32 on CPU
    faults: FaultSpec = NO_FAULTS  # injected faults (planner/specs/faults.py, acted on in worker/faults.py)
    control_from_version: int = 0  # control.json versions <= this were applied before (a relaunch)
    generation: int = 0  # the launch's generation (launcher/control.py); 0 = not fenced


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m worker.train", description="one torchrun rank of a meshplan plan")
    p.add_argument("--plan", type=Path, required=True, help="plan JSON file")
    p.add_argument("--run-dir", type=Path, required=True, help="run folder: telemetry, checkpoints")
    p.add_argument("--run-id", default="")
    p.add_argument("--model", default="", help="model preset (default: the plan's model)")
    p.add_argument("--model-json", type=Path, default=None, help="ModelSpec JSON file instead of a preset")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--data", choices=("synthetic", "text"), default="text")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--resume", default="auto", help="auto | fresh-start | none | a checkpoint or run folder")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--dtype", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    p.add_argument("--faults", default="", help="FaultSpec JSON (planner/specs/faults.py); empty = none")
    p.add_argument("--control-from-version", type=int, default=0, help="ignore control.json versions up to this")
    p.add_argument("--generation", type=int, default=0, help="this launch's generation; exit once superseded")
    return p


def parse_options(argv: list[str] | None = None) -> TrainOptions:
    a = parser().parse_args(argv)
    if a.steps <= 0:
        raise MeshplanError("--steps", a.steps, "train for at least one step")
    faults = FaultSpec.from_arg(a.faults)
    return TrainOptions(
        plan=a.plan,
        run_dir=a.run_dir,
        run_id=a.run_id or a.run_dir.name,
        model=a.model,
        model_json=a.model_json,
        steps=a.steps,
        data=a.data,
        lr=a.lr,
        optimizer=a.optimizer,
        seed=a.seed,
        checkpoint_every=a.checkpoint_every,
        resume=a.resume,
        timeout_s=a.timeout_s,
        dtype=a.dtype,
        faults=faults,
        control_from_version=a.control_from_version,
        generation=a.generation,
    )


def make_optimizer(params: Iterable[torch.nn.Parameter], name: str, lr: float) -> torch.optim.Optimizer:
    """AdamW for training; plain SGD for exact-equivalence tests (Adam's g/|g| hides gradient scaling bugs)."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise MeshplanError("optimizer", name, f"use one of {', '.join(OPTIMIZERS)}")
