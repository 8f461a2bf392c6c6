"""Prefect tasks of stage 2 (profile): find what is missing, run the profiler subprocess, ingest rows.

Policies (DESIGN.md, Prefect): a profiler run is costly and deterministic in its inputs, and flaky (OOM,
a killed process), so `profile_group` caches on INPUTS + TASK_SOURCE (the run folder excluded: it
names where, not what) and retries with a delay under a timeout; a retry resumes the same
out file, so what a crashed attempt measured is kept. Reading and writing the database are
NO_CACHE (the data changes underneath) and the writes are idempotent upserts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

import rundir
from launcher import group
from planner.measure.calibrate import OPTIMIZER_LAYOUTS
from planner.measure.ops import ProfilerSpec
from planner.measure.profiles import CommFit, ProfileKey, ProfileTable
from planner.specs.config import DEVICE_PROBE_TIMEOUT_S, TASK_GRACE_S, ProfileConfig
from planner.specs.model import ModelSpec
from storage.profiles import (
    ingest_jsonl,
    load_profile_table,
    missing_keys,
    read_jsonl,
    upsert_profiles,
)
from tasks.caching import stable_inputs


def _profiler(told: ProfilerSpec, ranks: int = 1) -> list[str]:
    """The profiler's command: one process, or `ranks` real ranks under torchrun (worker.agent: loopback only)."""
    if ranks == 1:
        return [sys.executable, "-m", "worker.profile_layers", *told.to_argv()]
    agent = [sys.executable, "-m", "worker.agent", "--nproc-per-node", str(ranks)]
    return [*agent, "-m", "worker.profile_layers", *told.to_argv()]


def _run(cmd: list[str], timeout_s: float, show_stderr: bool) -> group.Finished[str]:
    """Run as a group of its own (launcher/group.py: stopped whole on a timeout or when this process is
    interrupted or SIGTERMed); one thread so timings stay stable."""
    return group.run(cmd, timeout_s, "profiler", {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, None, show_stderr)


@task(
    name="local-device",
    retries=2,
    retry_delay_seconds=2,
    timeout_seconds=DEVICE_PROBE_TIMEOUT_S + TASK_GRACE_S,
    cache_policy=NO_CACHE,
)
def local_device() -> dict[str, Any]:
    """{device, device_kind, dtype, torch_version} of this machine, as the profiler subprocess sees it."""
    res = _run(_profiler(ProfilerSpec(print_device=True)), DEVICE_PROBE_TIMEOUT_S, show_stderr=False)
    if res.returncode != 0:
        raise RuntimeError(f"profiler --print-device exited {res.returncode}: {res.stderr.strip()[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


@task(name="missing-profiles", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def find_missing(db_path: str, model: ModelSpec, keys: list[ProfileKey], torch_version: str) -> list[ProfileKey]:
    return missing_keys(db_path, keys, model, torch_version)


def group_out_path(run_dir: str, model: ModelSpec, keys: list[ProfileKey]) -> Path:
    """A file named by the group's content, so a retry (or a rerun after a crash) resumes it."""
    k = keys[0]
    blob = json.dumps([model.fingerprint(), [dataclasses.astuple(x) for x in keys]])
    digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
    return rundir.profile_out_path(run_dir, k.device_kind, k.seq_len, k.tp, digest)


@task(
    name="profile-layers",
    retries=2,
    retry_delay_seconds=3,
    timeout_seconds=ProfileConfig().task_timeout_s,  # the flow sets its config's (flows/profile.py)
    cache_policy=stable_inputs("run_dir", "show_progress"),
)
def profile_group(
    model: ModelSpec,
    keys: list[ProfileKey],
    torch_version: str,
    repeats: int,
    min_block_s: float,
    timeout_s: float,
    run_dir: str,
    show_progress: bool = False,
    real_tp: bool = False,
) -> list[dict[str, Any]]:
    """Measure one (device kind, seq, tp) group in a subprocess; returns the rows of its JSONL file.

    `real_tp` (and tp > 1): the profiler runs as tp real ranks under torchrun (launcher.launch:
    loopback only) and times tp blocks on that group, all-reduces included; the caller sets it when
    this node has tp devices (`local_device()["device_count"]`)."""
    out = group_out_path(run_dir, model, keys)
    out.parent.mkdir(parents=True, exist_ok=True)
    requests = [
        {
            "layer_kind": k.layer_kind,
            "micro_batch_size": k.micro_batch_size,
            "seq_len": k.seq_len,
            "tp": k.tp,
            "recompute": k.recompute,
        }
        for k in keys
    ]
    req_file = out.with_suffix(".requests.json")
    req_file.write_text(json.dumps(requests))
    spec_file = out.with_suffix(".spec.json")
    spec_file.write_text(model.model_dump_json())
    real = real_tp and keys[0].tp > 1
    told = ProfilerSpec(
        spec_json=f"@{spec_file}",
        out=str(out),
        requests_json=str(req_file),
        device_kind=keys[0].device_kind,
        dtype=keys[0].dtype,
        repeats=repeats,
        min_block_s=min_block_s,
        device="cpu" if keys[0].device_kind == "cpu" else "auto",
        progress=show_progress,
        tp_group="real" if real else "fake",
    )
    cmd = _profiler(told, keys[0].tp if real else 1)
    res = _run(cmd, timeout_s, show_stderr=show_progress)
    if res.returncode != 0:
        tail = "\n".join(res.stderr.strip().splitlines()[-15:]) or "(stderr shown above)"
        raise RuntimeError(f"profiler exited {res.returncode} after {len(read_jsonl(out))} rows; last lines:\n{tail}")
    rows = read_jsonl(out)
    if rows and rows[0]["torch_version"] != torch_version:
        raise RuntimeError(f"profiler ran torch {rows[0]['torch_version']}, the flow expected {torch_version}")
    return rows


@task(name="ingest-profiles", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def ingest_rows(db_path: str, rows: list[dict[str, Any]]) -> int:
    """Upsert measured or estimated rows (idempotent: a retried ingest writes the same keys again)."""
    return upsert_profiles(db_path, rows)


@task(name="ingest-partial-profiles", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def ingest_partial(db_path: str, path: str) -> int:
    """Keep what a failed profiler run measured before it died."""
    return ingest_jsonl(db_path, path) if Path(path).exists() else 0


@task(name="load-profiles", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def load_profiles(db_path: str, model: ModelSpec) -> ProfileTable:
    return load_profile_table(db_path, model)


@task(name="comm-fits", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def comm_fits(db_path: str, hardware_fingerprint: str) -> list[CommFit]:
    """α–β fits discovery stored for this hardware, plus datasheet fits for link kinds it did not measure."""
    from planner.measure.targets import comm_fits_from_snapshot
    from storage.hardware import load_snapshot

    snap = load_snapshot(db_path, hardware_fingerprint)
    return comm_fits_from_snapshot(snap.cluster, snap.fits.to_dicts())


@task(name="profile-optimizer", retries=2, retry_delay_seconds=3, cache_policy=NO_CACHE)
def profile_optimizer(
    model: ModelSpec, torch_version: str, timeout_s: float, run_dir: str | None = None, num_ranks: int = 1
) -> list[dict[str, Any]]:
    """Measure torch AdamW's CPU step time per parameter over one block of `model`, for each parameter
    layout (plain, tp, fsdp), in a profiler subprocess: one process on a fake group, or with
    `num_ranks` > 1 that many real ranks under torchrun (launcher.launch: loopback only) all stepping at
    once, as training's ranks do. Returns one row per layout for storage.profiles.upsert_optimizer_profiles.
    The spec file goes into `run_dir` when given, else into a temporary folder."""
    import datetime as dt
    import tempfile

    with tempfile.TemporaryDirectory(prefix="meshplan-optimizer-") as tmp:
        folder = Path(run_dir) if run_dir else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        spec_file = folder / f"optimizer-{model.fingerprint()[:12]}.spec.json"
        spec_file.write_text(model.model_dump_json())
        told = ProfilerSpec(optimizer=True, spec_json=f"@{spec_file}", tp_group="real" if num_ranks > 1 else "fake")
        cmd = _profiler(told, num_ranks)
        res = _run(cmd, timeout_s, show_stderr=False)
    if res.returncode != 0:
        tail = "\n".join(res.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"optimizer profiler exited {res.returncode}; last lines:\n{tail}")
    lines = [line for line in res.stdout.strip().splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError("optimizer profiler printed nothing")
    out = json.loads(lines[-1])
    if out["torch_version"] != torch_version:
        raise RuntimeError(f"optimizer profiler ran torch {out['torch_version']}, the flow expected {torch_version}")
    bad = {k: out[k] for k in OPTIMIZER_LAYOUTS if not 0 < float(out[k]) < float("inf")}
    if bad:
        raise RuntimeError(f"optimizer profiler measured implausible seconds per parameter: {bad}")
    stamp = dt.datetime.now(dt.UTC).isoformat()
    return [
        {
            "model_fingerprint": model.fingerprint(),
            "device_kind": out["device_kind"],
            "layout": layout,
            "num_ranks": int(out["num_ranks"]),
            "torch_version": out["torch_version"],
            "model_name": model.name,
            "optimizer": "adamw",
            "s_per_param": float(out[layout]),
            "measured_at": stamp,
        }
        for layout in OPTIMIZER_LAYOUTS
    ]
