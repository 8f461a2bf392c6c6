"""Distributed checkpoints with torch.distributed.checkpoint (DCP), published atomically.

Layout of a run folder:
    <run>/checkpoints/step_00000004/   .metadata, __<rank>_0.distcp files, meta.json (step, plan,
                                       generation that wrote it, size + sha256 of every file:
                                       worker/checkpoint_check.py)
    <run>/checkpoints/latest           text: "step_00000004"
    <run>/resume.jsonl                 one line per (re)start: the checkpoint it resumed from and
                                       every newer one it skipped as corrupt, with the reason (or
                                       the error that stopped it); the flow turns these into run
                                       events (storage/runs.py) shown on the console and in Prefect
Every rank writes into `.tmp_step_<n>`; after DCP's own final barrier rank 0 writes meta.json,
renames the folder to `step_<n>` and replaces `latest` via a temp file + os.replace — unless a newer
generation of the run folder exists (control.json), in which case nothing is published and the
ranks raise Superseded: a fenced-off launch never leaves a checkpoint to resume from. So a reader
(or a resumed run) never sees a half-written checkpoint; a resumed run also checks the digests and
falls back to the newest valid earlier checkpoint (worker/checkpoint_check.py). With several nodes the run folder must be
on a shared file system (rank 0 renames what every rank wrote).

State = {"model": …, "optim": …} built with `get_state_dict(..., flatten_optimizer_state_dict=True)`
per stage part and merged. Keys are parameter FQNs (blocks keep their global index), so the same
key means the same tensor under any plan, and DCP reshards on load into another pp/tp/dp/split.
The data position is the step: batches are a pure function of it (worker/data.py).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

import rundir
from launcher.control import read_generation
from planner.errors import MeshplanError
from planner.specs.model import ModelSpec
from worker import watchdog
from worker.checkpoint_check import choose_resume, digest_folder, verify
from worker.model import Decoder

_OPTS = StateDictOptions(flatten_optimizer_state_dict=True)


class Superseded(RuntimeError):
    """A newer generation of the run folder exists (launcher/control.py): this launch must stop."""

    def __init__(self, mine: int, current: int) -> None:
        self.mine, self.current = mine, current
        super().__init__(f"generation {mine} is superseded by generation {current}; exiting without publishing")


def checkpoint_root(run_dir: Path) -> Path:
    return rundir.checkpoints_dir(run_dir)


def latest_checkpoint(run_dir: Path) -> Path | None:
    marker = rundir.latest_marker(run_dir)
    if not marker.is_file():
        return None
    path = checkpoint_root(run_dir) / marker.read_text().strip()
    return path if (path / ".metadata").is_file() else None


def checkpoint_step(ckpt_dir: Path) -> int:
    return int(json.loads(rundir.checkpoint_meta(ckpt_dir).read_text())["step"])


def read_meta(ckpt_dir: Path) -> dict[str, Any]:
    """A verified checkpoint's meta.json (step, plan, generation, file digests)."""
    return json.loads(rundir.checkpoint_meta(ckpt_dir).read_text())


def _part_states(parts: list[nn.Module], optims: list[torch.optim.Optimizer]) -> list[tuple[dict, dict]]:
    return [get_state_dict(p, o, options=_OPTS) for p, o in zip(parts, optims, strict=True)]


def _merged(states: list[tuple[dict, dict]]) -> dict[str, dict[str, Any]]:
    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    for m, o in states:
        model.update(m)
        optim.update(o)
    return {"model": model, "optim": optim}


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save(
    run_dir: Path, step: int, parts: list[nn.Module], optims: list[torch.optim.Optimizer], meta: dict[str, Any]
) -> Path:
    """Collective: every rank calls it. Returns the published checkpoint folder."""
    watchdog.beat(f"checkpoint {step}")  # a save gets its own full deadline, apart from the step's
    tmp, final = rundir.checkpoint_staging_dir(run_dir, step), rundir.checkpoint_dir(run_dir, step)
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # debris of an attempt killed mid-write
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_merged(_part_states(parts, optims)), checkpoint_id=str(tmp))
    dist.barrier()
    files = digest_folder(tmp)  # collective; rank 0 gets every file's size + sha256
    current = [read_generation(run_dir) if rank == 0 else 0]  # the fence: a superseded launch publishes nothing
    dist.broadcast_object_list(current, src=0)
    if meta.get("generation") and current[0] > meta["generation"]:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise Superseded(meta["generation"], current[0])
    if rank == 0:
        rundir.checkpoint_meta(tmp).write_text(json.dumps({**meta, "step": step, "files": files}, indent=2))
        if final.exists():  # the same step saved again (a restarted run): replace it whole
            old = rundir.checkpoint_staging_dir(run_dir, step, "old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            shutil.rmtree(old)
        os.replace(tmp, final)
        _write_text_atomic(rundir.latest_marker(run_dir), final.name)
    dist.barrier()
    return final


def resume_from(resume: str, run_dir: Path) -> Path | None:
    """Collective: the verified checkpoint to resume from (see checkpoint_check.choose_resume), or None.

    Rank 0 appends what it chose and what it skipped to <run_dir>/resume.jsonl, so a fallback is on
    record in the run folder, not only in the log; a refusal (every checkpoint unreadable) is
    recorded with its message before it is raised, for the flow to report in one line."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    try:
        chosen, rejected = choose_resume(resume, run_dir)
    except MeshplanError as exc:
        record_refusal(run_dir, exc)
        raise
    _record(
        run_dir,
        {
            "attempt": attempt,
            "checkpoint": str(chosen) if chosen else None,
            "step": checkpoint_step(chosen) if chosen else 0,
            "rejected": rejected,
            "fresh_start": bool(resume == "fresh-start" and chosen is None and rejected),
        },
    )
    return chosen


def record_refusal(run_dir: Path, exc: MeshplanError) -> None:
    """Rank 0 records why the ranks stopped on their own (every checkpoint unreadable, a diverged
    step) in resume.jsonl, with the error's field, value and fix: the flow raises it as one line."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    value = exc.value if isinstance(exc.value, str | int | float | None) else str(exc.value)
    _record(
        run_dir,
        {
            "attempt": attempt,
            "checkpoint": None,
            "step": None,
            "rejected": [],
            "error": str(exc),
            "field": exc.field,
            "value": value,
            "fix": exc.fix,
        },
    )


def _record(run_dir: Path, record: dict[str, Any]) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        with rundir.resume_log(run_dir).open("a") as f:
            f.write(json.dumps(record) + "\n")


def load(ckpt_dir: Path, parts: list[nn.Module], optims: list[torch.optim.Optimizer]) -> int:
    """Collective: load model + optimizer state (resharding as needed); returns the saved step."""
    states = _part_states(parts, optims)
    merged = _merged(states)
    dcp.load(merged, checkpoint_id=str(ckpt_dir))
    # DCP fills tensors in place but replaces non-tensor entries (e.g. lr) in `merged`: split from it.
    for (m, o), part, optim in zip(states, parts, optims, strict=True):
        set_state_dict(
            part,
            optim,
            model_state_dict={k: merged["model"][k] for k in m},
            optim_state_dict={k: merged["optim"][k] for k in o},
            options=_OPTS,
        )
    return checkpoint_step(ckpt_dir)


def load_full_model_state(ckpt_dir: Path, spec: ModelSpec) -> dict[str, torch.Tensor]:
    """The whole model's parameters from a checkpoint of any layout, in this (non-distributed) process.

    Raises CorruptCheckpointError (worker/checkpoint_check.py) when the folder fails its check."""
    verify(ckpt_dir)
    full = Decoder(spec)
    state = {"model": {k: torch.empty_like(v) for k, v in full.state_dict().items()}}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(ckpt_dir), no_dist=True)
    return state["model"]
