"""Checkpoint integrity: digests written at save time, checked before a checkpoint is trusted.

A DCP checkpoint folder is trusted only if
- meta.json parses and names its step and a `files` table {name: {bytes, sha256}} (written by save),
- every listed file exists with exactly that size and sha256 (a truncated or bit-flipped shard),
- `.metadata` unpickles and every storage entry it names lies inside an existing file.
A folder written before digests existed (no `files` table) is checked structurally only.

Resuming picks the newest VALID `step_*` folder at or below the `latest` marker, so a corrupt newest
checkpoint costs the steps since the previous one instead of the run (or, worse, silently loading
garbage). `.tmp_step_*` (a save killed before its rename) and `.old_step_*` are never candidates.
Collective when a process group exists: each rank hashes every world-th file, and the verdicts are
all-gathered, so every rank picks the same folder and the hashing is shared.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

import rundir
from planner.errors import MeshplanError

_STEP_DIR = rundir.STEP_DIR
_CHUNK = 1 << 22


class CorruptCheckpointError(RuntimeError):
    """A checkpoint folder failed its integrity check (the reason says which file and how)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_digests(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    return {n: {"bytes": (folder / n).stat().st_size, "sha256": sha256_file(folder / n)} for n in names}


def digest_folder(folder: Path) -> dict[str, dict[str, Any]]:
    """Collective when distributed: {file: {bytes, sha256}} of every file but meta.json, on rank 0.

    Rank r hashes the files DCP wrote for it (`__r_*.distcp`), so hashing is spread like writing was;
    rank 0 adds `.metadata` and anything nobody claimed. Other ranks get {}."""
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != rundir.META)
    mine = [n for n in names if n.startswith(f"__{rank}_")] if distributed else names
    part = file_digests(folder, mine)
    if not distributed:
        return part
    parts: list[dict] | None = [{} for _ in range(dist.get_world_size())] if rank == 0 else None
    dist.gather_object(part, parts, dst=0)
    if rank != 0:
        return {}
    assert parts is not None
    merged = {k: v for p in parts for k, v in p.items()}
    merged.update(file_digests(folder, [n for n in names if n not in merged]))
    return merged


def _structural_problem(folder: Path) -> tuple[str | None, dict]:
    """(reason or None, meta) from the cheap checks every rank runs: meta.json, sizes, .metadata."""
    try:
        meta = json.loads(rundir.checkpoint_meta(folder).read_text())
        int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"meta.json unreadable ({type(exc).__name__}: {exc})", {}
    for name, want in (meta.get("files") or {}).items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing", meta
        if path.stat().st_size != want["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, {want['bytes']} were written (truncated?)", meta
    try:
        from torch.distributed.checkpoint import FileSystemReader

        md = FileSystemReader(str(folder)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means the same: untrustworthy
        return f".metadata unreadable ({type(exc).__name__})", meta
    for info in (md.storage_data or {}).values():
        path = folder / info.relative_path
        if not path.is_file() or info.offset + info.length > path.stat().st_size:
            return f".metadata points past the end of {info.relative_path} (truncated?)", meta
    return None, meta


def problem(folder: Path, rank: int = 0, world: int = 1) -> str | None:
    """Why `folder` is not a trustworthy checkpoint, or None. Hashes only files i ≡ rank (mod world)."""
    reason, meta = _structural_problem(folder)
    if reason is not None:
        return reason
    files = sorted((meta.get("files") or {}).items())
    for name, want in files[rank::world]:
        got = sha256_file(folder / name)
        if got != want["sha256"]:
            return f"{name} sha256 {got[:12]}… differs from the saved {want['sha256'][:12]}… (corrupt bytes)"
    return None


def verify(folder: Path) -> None:
    """Raise CorruptCheckpointError unless `folder` passes every check (single process)."""
    reason = problem(folder)
    if reason is not None:
        raise CorruptCheckpointError(f"{folder}: {reason}")


def _problem_everywhere(folder: Path) -> str | None:
    """problem() with the hashing split over ranks; every rank returns the same verdict."""
    if not (dist.is_available() and dist.is_initialized()):
        return problem(folder)
    rank, world = dist.get_rank(), dist.get_world_size()
    verdicts: list[str | None] = [None] * world
    dist.all_gather_object(verdicts, problem(folder, rank, world))
    return next((v for v in verdicts if v is not None), None)


def candidates(root: Path) -> list[Path]:
    """`step_*` folders under a checkpoints root, newest first, none newer than the `latest` marker.

    The marker bounds the timeline: a folder past it belongs to an abandoned branch (a run resumed
    from an older step into the same folder). A missing or garbled marker bounds nothing."""
    steps = (
        sorted(
            ((int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))),
            reverse=True,
        )
        if root.is_dir()
        else []
    )
    marker = root / rundir.LATEST
    m = _STEP_DIR.match(marker.read_text(errors="replace").strip()) if marker.is_file() else None
    bound = int(m.group(1)) if m else None
    return [p for s, p in steps if bound is None or s <= bound]


def newest_valid(root: Path) -> tuple[Path | None, list[dict[str, str]]]:
    """(newest trustworthy checkpoint under `root` or None, [{checkpoint, reason}] of those skipped)."""
    found = candidates(root)
    if dist.is_available() and dist.is_initialized():  # one listing for all ranks, even mid-write
        box: list[Any] = [[str(p) for p in found]]
        dist.broadcast_object_list(box, src=0)
        found = [Path(p) for p in box[0]]
    rejected: list[dict[str, str]] = []
    for folder in found:
        reason = _problem_everywhere(folder)
        if reason is None:
            return folder, rejected
        rejected.append({"checkpoint": str(folder), "reason": reason})
    return None, rejected


def choose_resume(resume: str, run_dir: Path) -> tuple[Path | None, list[dict[str, str]]]:
    """Resolve --resume ("none" | "auto" | "fresh-start" | checkpoint folder | run folder) to a verified checkpoint.

    An explicitly named checkpoint folder that fails its check is an error (the user asked for that
    one); a run folder falls back to its newest valid checkpoint. When checkpoints exist but none is
    readable, "auto" stops the run (training from step 0 would silently throw their steps away):
    only "fresh-start" — the user's explicit choice, `meshplan train --fresh-start` — starts over.
    Every skipped folder is printed (rank 0) with its reason and returned for the record."""
    if resume == "none":
        return None, []
    auto = resume in ("auto", "fresh-start")
    path = run_dir if auto else Path(resume)
    if not auto and (path / ".metadata").is_file():
        reason = _problem_everywhere(path)
        if reason is not None:
            raise MeshplanError("--resume", resume, f"this checkpoint is corrupt: {reason}")
        return path, []
    chosen, rejected = newest_valid(rundir.checkpoints_dir(path))
    if not auto and chosen is None:
        raise MeshplanError("--resume", resume, "not a checkpoint folder or a run folder with a valid checkpoint")
    if resume == "auto" and chosen is None and rejected:
        raise MeshplanError(
            "checkpoints",
            str(rundir.checkpoints_dir(path)),
            f"all {len(rejected)} checkpoints are unreadable (newest {Path(rejected[0]['checkpoint']).name}: "
            f"{rejected[0]['reason']}); repair or move them away, or pass --fresh-start to train from step 0",
        )
    if rejected and (not dist.is_initialized() or dist.get_rank() == 0):
        for r in rejected:
            print(f"checkpoint: skipping {r['checkpoint']}: {r['reason']}", file=sys.stderr, flush=True)
        print(
            f"checkpoint: resuming from {chosen if chosen is not None else 'step 0 (--fresh-start: none is readable)'}",
            file=sys.stderr,
            flush=True,
        )
    return chosen, rejected
