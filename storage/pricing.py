"""What a plan is priced against, read from the state folder in one place: cluster, profiles,
calibration and dtype.

Every path that prices plans — `meshplan plan` (with or without `--flow`), `plan_flow` and the
pipeline, `meshplan estimate` / `compare`, and re-planning — calls `pricing_inputs`, so the same
model on the same cluster is priced the same way whichever command asked:
- the cluster is the cluster file when one is given, else a discovered snapshot (default: the
  newest probe of this machine);
- the profiles are the model's stored rows (none stored: estimates only);
- a discovered machine of CPU ranks is priced with what discovery and profiling measured
  (planner.measure.calibrate); a cluster file, or any GPU, with the datasheet model (None);
- plans train in bf16 on GPUs and in `cpu_dtype` on CPU ranks: the dtype the profile stage
  measures there and worker.train runs there (planner.measure.targets.device_dtype).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from planner.errors import MeshplanError
from planner.measure.calibrate import Calibration, cpu_calibration, pipeline_overhead_from
from planner.measure.profiles import ProfileTable
from planner.measure.targets import is_gpu
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from storage.files import read_cluster_file

if TYPE_CHECKING:  # DuckDB and polars are imported only by the reads that use them: a cluster file with
    # no state folder yet prices without either (`meshplan plan --cluster F` on a fresh machine)
    from storage.hardware import HardwareSnapshot


@dataclass(frozen=True)
class PricingInputs:
    cluster: ClusterSpec
    profiles: ProfileTable
    profile_source: str  # where the profiles came from, for the user (storage.plans.load_profiles_or_empty)
    calibration: Calibration | None
    dtype: str  # the dtype plans are searched in (a hand-written plan is priced in its own)
    snapshot: str | None  # the discovered snapshot's fingerprint; None for a cluster file


def search_dtype(cluster: ClusterSpec, cpu_dtype: str = "fp32") -> str:
    """bf16 when any device is a GPU, else the CPU ranks' dtype (one dtype for the whole plan)."""
    return "bf16" if any(is_gpu(k) for k in cluster.device_kinds()) else cpu_dtype


def snapshot_calibration(db_path: str | Path, model: ModelSpec, snap: HardwareSnapshot) -> Calibration | None:
    """Measured corrections (planner.measure.calibrate) for a discovered snapshot whose devices are all CPU
    ranks under gloo: discovery's collective fits, pipeline-schedule and FSDP2 overheads, and the profiled
    optimizer step per parameter per layout.
    None for GPU clusters (the datasheet model with NCCL's overlap holds there) or unmeasured ones.
    Contention and lockstep come from discovery's concurrency bench (one rank alone, the ranks
    together, in lockstep; snapshots without it: contention 1, as the ranks were only probed together);
    the node's core count prices ranks that share cores (processor sharing in `estimate`); the resident
    bytes of a rank before its plan allocates, where discovery measured them, are the runtime reserve
    of its peak memory."""
    from storage.profiles import load_optimizer_profile

    rates = [r for r in snap.devices["measured_flop_per_s"].to_list() if r]
    if set(snap.devices["kind"].to_list()) != {"cpu"} or not rates or snap.fits.height == 0:
        return None
    adam = load_optimizer_profile(db_path, model, "cpu")
    measurements = snap.measurements.to_dicts()
    overhead = pipeline_overhead_from(measurements, snap.cluster.nodes[0].intra_link)
    return cpu_calibration(
        statistics.median(rates),
        rates,
        snap.fits.to_dicts(),
        len(rates),
        snap.cores_per_node,
        adam.get("plain"),
        adam.get("tp"),
        overhead,
        measurements,
        adam.get("fsdp"),
        int(adam.get("num_ranks", 1)),
        snap.runtime_rss_bytes,
    )


def load_calibration(db_path: str | Path, model: ModelSpec, snapshot: str | None = None) -> Calibration | None:
    """The calibration of discovered snapshot `snapshot` (default: the newest probe); see snapshot_calibration."""
    from storage.hardware import resolve_snapshot

    return snapshot_calibration(db_path, model, resolve_snapshot(db_path, snapshot))


def pricing_inputs(
    db_path: str | Path,
    model: ModelSpec,
    cluster_file: str | Path | None = None,
    snapshot: str | None = None,
    cpu_dtype: str = "fp32",
) -> PricingInputs:
    """Cluster, profiles, calibration and dtype for pricing `model` (see the module docstring)."""
    from storage.plans import load_profiles_or_empty

    if cluster_file:
        cluster, calibration, fingerprint = read_cluster_file(cluster_file), None, None
    else:
        from storage.hardware import resolve_snapshot  # polars and DuckDB: only a discovered snapshot needs them

        snap = resolve_snapshot(db_path, snapshot)
        cluster, calibration, fingerprint = snap.cluster, snapshot_calibration(db_path, model, snap), snap.fingerprint
    profiles, source = load_profiles_or_empty(db_path, model)
    return PricingInputs(cluster, profiles, source, calibration, search_dtype(cluster, cpu_dtype), fingerprint)


def machine_calibration(db_path: str | Path, model: ModelSpec) -> Calibration | None:
    """The calibration of this machine's newest probe, or None when it was never discovered: what
    re-planning prices a run's synthetic cluster of this machine's CPU ranks with."""
    try:
        return load_calibration(db_path, model)
    except MeshplanError:  # never discovered: the datasheet model, as for a cluster file
        return None
