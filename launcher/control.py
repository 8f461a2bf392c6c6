"""The flow ↔ ranks control channel of a running training job (stdlib only: the flow imports it).

`<run_dir>/control.json` is written by the flow (temp file + os.replace, so a reader sees the old
or the new message, never half of one) and carries a `version` that only grows. Rank 0 reads it at
every step boundary and broadcasts it (worker/train.py), so every rank applies a new version at the
same step. Actions:
- {"action": "rebalance", "batch_shares": [...]}: new per-replica shares from the next step on.
- {"action": "checkpoint_exit", "at_step": N}: at the first step boundary ≥ N every rank saves a
  DCP checkpoint and exits 0; rank 0 then writes `<run_dir>/exit.json` {step, version, checkpoint_s}
  so the flow can tell a requested exit from a finished run and relaunch with the new plan.

Generations (fencing): every launch of a run folder is a generation, numbered from 1.
`begin_generation` writes the new number into control.json (`generation`, beside the message)
before any rank of the launch starts; a rank reads it at every step boundary and before it
publishes a checkpoint, and exits once a newer generation exists (worker/train.py,
worker/checkpoint.py). Writers of control.json (the scheduler's orders, a new generation) hold
`<run_dir>/.control.lock` for their read-modify-write, so neither loses the other's field.

`TelemetryTail` reads the ranks' JSONL telemetry incrementally while they write it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import rundir

ACTIONS = ("rebalance", "checkpoint_exit")


control_path, exit_path = rundir.control_path, rundir.exit_path  # the run folder's module owns the layout


def write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def read_control(run_dir: str | Path) -> dict[str, Any] | None:
    path = control_path(run_dir)
    try:
        msg = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if not isinstance(msg, dict) or msg.get("action") not in ACTIONS or not isinstance(msg.get("version"), int):
        return None
    return msg


@contextmanager
def _locked(run_dir: str | Path) -> Iterator[None]:
    """Hold the run folder's control lock (flock: released when the holder dies, whatever kills it)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with rundir.control_lock_path(run_dir).open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read_raw(run_dir: str | Path) -> dict[str, Any]:
    try:
        msg = json.loads(control_path(run_dir).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return msg if isinstance(msg, dict) else {}


def read_generation(run_dir: str | Path) -> int:
    """The run folder's current generation (0: never launched under fencing)."""
    gen = _read_raw(run_dir).get("generation", 0)
    return gen if isinstance(gen, int) else 0


def begin_generation(run_dir: str | Path) -> int:
    """Open the next generation of the run folder; returns its number. Every rank of an earlier one
    that reads control.json from now on knows it is superseded."""
    with _locked(run_dir):
        msg = _read_raw(run_dir)
        gen = read_generation(run_dir) + 1
        write_json_atomic(control_path(run_dir), {"version": 0, **msg, "generation": gen})
    return gen


def write_control(run_dir: str | Path, action: str, **fields: Any) -> int:
    """Publish a new control message; returns its version (previous version + 1). The generation stays."""
    if action not in ACTIONS:
        raise ValueError(f"control action {action!r} is not one of {ACTIONS}")
    with _locked(run_dir):
        old = read_control(run_dir)
        version = (old["version"] if old else 0) + 1
        gen = {"generation": g} if (g := read_generation(run_dir)) else {}
        write_json_atomic(control_path(run_dir), {"version": version, "action": action, **fields, **gen})
    return version


def read_exit(run_dir: str | Path) -> dict[str, Any] | None:
    try:
        return json.loads(exit_path(run_dir).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class TelemetryTail:
    """New complete lines of every `<run>/telemetry/rank_*.jsonl` since the last call."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = run_dir
        self._offsets: dict[Path, int] = {}

    def read_new(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for f in rundir.telemetry_files(self.run_dir):
            pos = self._offsets.get(f, 0)
            with f.open("rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
            end = chunk.rfind(b"\n") + 1  # a line being written is left for the next call
            if end:
                rows += [json.loads(line) for line in chunk[:end].decode().splitlines() if line.strip()]
                self._offsets[f] = pos + end
        return rows
