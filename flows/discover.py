"""Stage 1 flow: discover the hardware (probe this machine, or record a described cluster) into DuckDB.

Without a cluster file the flow identifies this node first (cheap: no measurement), and reuses a
stored snapshot with the same hardware fingerprint unless `refresh`; otherwise it launches the
torchrun bench (worker.netbench) in a run folder and ingests the JSON rank 0 wrote. With a cluster
file it records the described cluster with source 'file'. With a snapshot file it ingests a bench
that was run elsewhere, which is how a multi-node cluster is measured: start torchrun on every node
(`--nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT -m worker.netbench --out snap.json`),
then pass rank 0's snap.json here. Returns a small summary; the data lives in the database.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from prefect import flow

from flows.outcomes import DiscoverOutcome
from planner.errors import MeshplanError
from planner.specs.config import TASK_GRACE_S, DiscoverConfig
from planner.specs.slurm import SlurmOptions
from tasks.discover import (
    ingest_snapshot,
    load_cluster,
    probe_identity,
    publish_hardware,
    read_cluster_file,
    record_cluster,
    run_netbench,
    run_netbench_slurm,
    snapshot_exists,
)


def slurm_discovery(nodes: int, partition: str | None, nodelist: str | None) -> dict[str, Any]:
    """discover_flow's Slurm arguments for `meshplan discover --executor slurm`: the nodes and the batch
    options (its run folder, StateDir.discovery, is on storage the nodes share)."""
    return {"slurm_nodes": nodes, "slurm": SlurmOptions(partition=partition, nodelist=nodelist)}


@flow(name="discover", log_prints=True)
def discover_flow(
    db_path: str,
    cluster_file: str | None = None,
    num_ranks: int = 2,
    refresh: bool = False,
    message_sizes: list[int] | None = None,
    repeats: int = 5,
    matmul_size: int = 1024,
    timeout_s: float = DiscoverConfig().timeout_s,
    run_dir: str | None = None,
    snapshot_file: str | None = None,
    slurm_nodes: int = 0,
    slurm: SlurmOptions | None = None,
) -> DiscoverOutcome:
    """Record the hardware; returns the snapshot's fingerprint, whether it was reused, and its size.

    `slurm_nodes` > 0: measure that many Slurm-allocated nodes as one batch job (`num_ranks` a node;
    the run folder `run_dir` must be on storage they share) and store one snapshot of all of them."""
    if snapshot_file:
        return _summary(ingest_snapshot(db_path, snapshot_file), False, "probe", db_path)
    if cluster_file:
        cluster = read_cluster_file(cluster_file)
        existed = snapshot_exists(db_path, "file-" + cluster.fingerprint())
        fingerprint = record_cluster(db_path, cluster)
        return _summary(fingerprint, existed, "file", db_path, cluster)

    if slurm_nodes > 0:
        if run_dir is None:
            raise MeshplanError("--executor", "slurm", "discovery through Slurm needs a run folder the nodes share")
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        sizes = list(message_sizes or DiscoverConfig().message_sizes)
        bench = run_netbench_slurm.with_options(timeout_seconds=timeout_s + TASK_GRACE_S)
        path = bench(run_dir, slurm_nodes, num_ranks, sizes, repeats, matmul_size, timeout_s, slurm or SlurmOptions())
        return _summary(ingest_snapshot(db_path, path), False, "probe", db_path)

    ident = probe_identity(num_ranks)
    if not refresh and snapshot_exists(db_path, ident["fingerprint"]):
        return _summary(ident["fingerprint"], True, "probe", db_path)

    sizes = list(message_sizes or DiscoverConfig().message_sizes)
    bench = run_netbench.with_options(timeout_seconds=timeout_s + TASK_GRACE_S)
    if run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        path = bench(run_dir, ident["num_ranks"], sizes, repeats, matmul_size, timeout_s)
        fingerprint = ingest_snapshot(db_path, path)
    else:
        with tempfile.TemporaryDirectory(prefix="meshplan-discover-") as tmp:
            path = bench(tmp, ident["num_ranks"], sizes, repeats, matmul_size, timeout_s)
            fingerprint = ingest_snapshot(db_path, path)
    if fingerprint != ident["fingerprint"]:
        # The ranks saw different hardware than the flow process (e.g. a changed node name): say so.
        print(f"note: measured fingerprint {fingerprint} differs from the pre-check {ident['fingerprint']}")
    return _summary(fingerprint, False, "probe", db_path)


def _summary(fingerprint: str, reused: bool, source: str, db_path: str, cluster: Any = None) -> DiscoverOutcome:
    if cluster is None:
        cluster = load_cluster(db_path, fingerprint)
    publish_hardware(db_path, fingerprint, reused)
    return DiscoverOutcome(
        fingerprint=fingerprint,
        reused=reused,
        source=source,
        name=cluster.name,
        num_nodes=cluster.num_nodes,
        num_devices=cluster.num_devices,
    )
