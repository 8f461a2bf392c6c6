"""What `python -m worker.train` was told (parsed once, by planner/specs/runspec.py), and the optimizer."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import torch

from planner.errors import MeshplanError
from planner.specs.runspec import RankSite, RunOptions, RunSpec, parse_rank_argv

OPTIMIZERS = get_args(RunOptions.model_fields["optimizer"].annotation)


@dataclass(frozen=True)
class RankArgs:
    """The rank's command line: where this launch runs (`site`) and what it trains (`run`, a RunSpec)."""

    site: RankSite
    run: RunSpec

    @property
    def run_dir(self) -> Path:
        return Path(self.site.run_dir)

    @property
    def run_id(self) -> str:
        return self.site.run_id or self.run_dir.name


def parse_args(argv: list[str] | None = None) -> RankArgs:
    site, run = parse_rank_argv(sys.argv[1:] if argv is None else argv)
    return RankArgs(site, run)


def make_optimizer(params: Iterable[torch.nn.Parameter], name: str, lr: float) -> torch.optim.Optimizer:
    """AdamW for training; plain SGD for exact-equivalence tests (Adam's g/|g| hides gradient scaling bugs)."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise MeshplanError("optimizer", name, f"use one of {', '.join(OPTIMIZERS)}")
