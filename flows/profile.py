"""Stage 2 flow: profile each distinct layer shape once per device kind into DuckDB, estimate the rest.

1. Which device kinds: the cluster file's, else this machine's ("cpu" or the CUDA GPU's catalog name).
2. For the kind present here, the grid of keys (layer kind × mbs × seq × tp × recompute) minus what
   is already measured for this model and torch version; the rest runs in one profiler subprocess
   per (device kind, seq, tp) group, each retried and timed out on its own, its rows upserted.
   Re-running measures nothing already known, and the cost grows with distinct shapes, not layers.
   On a CPU, torch AdamW's step time per parameter (plain and DTensor parameters) is measured once
   per model and torch version afterwards; returned as "optimizer", a failure reported, not fatal.
3. Kinds not present here get roofline estimates (planner.measure.targets), calibrated on measured GPUs
   when there are any, stored flagged `estimated` with the efficiency used.
4. Communication: discovery (stage 1) owns the collective bench and its α–β fits; this flow makes
   sure a snapshot exists for the hardware (running discovery as a subflow, which reuses a stored
   one) and returns its fits as planner CommFits.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from prefect import flow

from flows.outcomes import KindEfficiency, ProfileOutcome
from planner.measure.targets import (
    catalog_peak,
    device_dtype,
    device_peaks,
    efficiency_for,
    estimate_rows,
    profile_keys,
    shape_groups,
    validate_shapes,
)
from planner.specs.config import ProfileConfig
from planner.specs.flops import LAYER_KINDS
from planner.specs.model import get_model
from rundir import StateDir
from storage.files import read_cluster_file
from storage.profiles import estimate_rows as estimate_storage_rows
from storage.profiles import load_optimizer_profile, missing_optimizer_profile, upsert_optimizer_profiles
from tasks.profile import (
    comm_fits,
    find_missing,
    group_out_path,
    ingest_partial,
    ingest_rows,
    load_profiles,
    local_device,
    profile_group,
    profile_optimizer,
)


@flow(name="profile", log_prints=True)
def profile_flow(
    db_path: str,
    model_name: str,
    profile: ProfileConfig | None = None,
    cluster_file: str | None = None,
    run_dir: str | None = None,
    comm: bool = True,
    show_progress: bool = False,
) -> ProfileOutcome:
    """Profile `model_name` with the config's [profile] section, taken whole (None: its defaults, the
    CLI's); returns the counts (measured, reused, estimated, profiler runs) and details."""
    p = profile or ProfileConfig()
    model = get_model(model_name)
    mbs, tp, seq, recompute = list(p.mbs), list(p.tp), list(p.seq or [model.seq_len]), list(p.recompute)
    dtype, repeats, min_block_s, timeout_s, retries = p.dtype, p.repeats, p.min_block_s, p.timeout_s, p.retries
    validate_shapes(model, mbs, seq, tp)
    cluster = read_cluster_file(cluster_file) if cluster_file else None
    here = local_device()
    kinds = sorted(cluster.device_kinds()) if cluster else [here["device_kind"]]
    local_kind = here["device_kind"]
    run_dir = run_dir or str(StateDir.of_db(db_path).profiling())

    measured = reused = runs = optimizer_measured = 0
    failed: list[str] = []
    optimizer_failed: list[str] = []
    optimizer: dict[str, float] = {}
    if local_kind in kinds:
        local_dtype = dtype if local_kind == "cpu" else here["dtype"]
        wanted = profile_keys(local_kind, mbs, seq, tp, local_dtype, recompute, LAYER_KINDS)
        todo = find_missing(db_path, model, wanted, here["torch_version"])
        reused = len(wanted) - len(todo)
        # Sequential on purpose: two profilers sharing cores would time each other's interference.
        for group in shape_groups(todo).values():
            task = profile_group.with_options(retries=retries, timeout_seconds=p.task_timeout_s)
            runs += 1
            # tp blocks are timed on a real tp group where this node has tp devices (CPU: cores)
            real_tp = group[0].tp <= here.get("device_count", 1)
            state = task(
                model,
                group,
                here["torch_version"],
                repeats,
                min_block_s,
                timeout_s,
                run_dir,
                show_progress,
                real_tp,
                return_state=True,
            )
            if state.is_completed():
                measured += ingest_rows(db_path, state.result())
                continue
            # Keep what the dead run measured, report it, and carry on with the other groups.
            measured += ingest_partial(db_path, str(group_out_path(run_dir, model, group)))
            failed.append(f"{group[0].device_kind} seq={group[0].seq_len} tp={group[0].tp}: {state.message}")
        # The optimizer step per parameter (CPU only: it times torch AdamW on one thread per rank),
        # after the layer profiler, never beside it: on 2 real ranks stepping at once where this node
        # has 2 cores (DTensor layouts on a real group, as training steps them; more ranks than cores
        # would time the cores' sharing, which the cost model prices itself). Its failure is reported
        # in "failed" but never fails the flow: the planner then prices the step from memory traffic.
        opt_ranks = min(2, here.get("device_count", 1))
        if local_kind == "cpu" and missing_optimizer_profile(
            db_path, model, local_kind, here["torch_version"], opt_ranks
        ):
            task = profile_optimizer.with_options(retries=retries, timeout_seconds=p.task_timeout_s)
            state = task(model, here["torch_version"], timeout_s, run_dir, opt_ranks, return_state=True)
            if state.is_completed():
                upsert_optimizer_profiles(db_path, state.result())
                optimizer_measured = 1
            else:
                optimizer_failed.append(f"{local_kind} optimizer: {state.message}")
        optimizer = load_optimizer_profile(db_path, model, local_kind)

    estimated, efficiency = 0, dict[str, KindEfficiency]()
    others = [k for k in kinds if k != local_kind]
    if others:
        table = load_profiles(db_path, model)
        peaks = {}
        for r in table:
            peak = catalog_peak(r.key.device_kind, r.key.dtype)
            if peak is not None and not r.estimated:
                peaks[r.key.device_kind] = peak
        for kind in others:
            kdtype = device_dtype(kind, dtype)
            eff, source = efficiency_for(model, kind, table, peaks)
            peak, bw = device_peaks(cluster, kind, kdtype)  # type: ignore[arg-type]  (others exist only with a cluster)
            est = estimate_rows(model, profile_keys(kind, mbs, seq, tp, kdtype, recompute), peak, bw, eff)
            estimated += ingest_rows(db_path, estimate_storage_rows(model, est, source))
            efficiency[kind] = KindEfficiency(efficiency=eff, source=source)

    fits = _comm(db_path, cluster_file) if comm else []
    summary = ProfileOutcome(
        model=model.name,
        fingerprint=model.fingerprint(),
        device_kinds=kinds,
        local_device=local_kind,
        torch_version=here["torch_version"],
        measured=measured,
        reused=reused,
        estimated=estimated,
        profiler_runs=runs,
        efficiency=efficiency,
        comm_fits=[dataclasses.asdict(f) for f in fits],
        failed=failed + optimizer_failed,
        run_dir=run_dir,
        optimizer=optimizer,
        optimizer_measured=optimizer_measured,
    )
    if failed:
        raise RuntimeError(
            f"{len(failed)} profiler group(s) failed (rows measured before failing were kept): "
            + "; ".join(summary.failed)
        )
    return summary


def _comm(db_path: str, cluster_file: str | None) -> list[Any]:
    """Discovery's fits for this hardware: reuses its stored snapshot, measures only if there is none."""
    from flows.discover import discover_flow

    hw = discover_flow(db_path=db_path, cluster_file=cluster_file)
    return comm_fits(db_path, hw.fingerprint)
