"""Prefect tasks of stage 1 (discover): identify this node, run the torchrun bench, record snapshots.

Policies (DESIGN.md, Prefect): probes and the bench are flaky I/O, so they retry with a delay and run under
a timeout (the bench also under an outer kill of its whole process group); reading a file and
recording a snapshot are side effects with NO_CACHE, and recording is idempotent (upsert by
fingerprint). A MeshplanError is the user's to fix, so no task retries it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

import rundir
from launcher import group
from launcher.host import identify
from launcher.slurm import batch_script, job_log, run_batch
from planner.errors import MeshplanError
from planner.inputs import parse_json, read_input
from planner.measure.discovery import (
    cluster_from_snapshot,
    hardware_fingerprint,
    node_identity,
    snapshot_fingerprint,
)
from planner.measure.ops import NetbenchSpec
from planner.specs.cluster import ClusterSpec
from planner.specs.config import IDENTIFY_TIMEOUT_S, TASK_GRACE_S
from planner.specs.slurm import SlurmOptions
from planner.validation import parse
from storage import files
from storage.hardware import find_snapshot, load_snapshot, save_snapshot


def _retry_unless_user_error(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except MeshplanError:
        return False
    except Exception:
        return True
    return True


@task(name="read-cluster-file", cache_policy=NO_CACHE)
def read_cluster_file(path: str) -> ClusterSpec:
    """Parse a cluster TOML file; a problem names the file and field."""
    return files.read_cluster_file(path)


@task(
    name="probe-identity",
    retries=2,
    retry_delay_seconds=2,
    timeout_seconds=IDENTIFY_TIMEOUT_S + TASK_GRACE_S,
    cache_policy=NO_CACHE,
    retry_condition_fn=_retry_unless_user_error,
)
def probe_identity(num_ranks: int) -> dict[str, Any]:
    """This node's identity and fingerprint, before measuring anything. With GPUs, one rank per GPU."""
    found = identify()
    host, gpus = found["host"], found["gpus"]
    ranks = len(gpus) or num_ranks
    ident = node_identity(
        host["node"], host["cpu_model"], host["num_cores"], host["memory_bytes"], [g["name"] for g in gpus], ranks
    )
    return {"fingerprint": hardware_fingerprint([ident]), "num_ranks": ranks, "node": host["node"]}


def _run_group(cmd: list[str], cwd: Path, timeout_s: float) -> group.Finished[str]:
    """Run cmd as a group of its own (launcher/group.py): stopped whole — torchrun's ranks included —
    on a timeout or when this process is interrupted."""
    return group.run(cmd, timeout_s, "netbench", {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, cwd)


def _bench_spec(out: Path, message_sizes: list[int], repeats: int, matmul_size: int) -> NetbenchSpec:
    """What the bench's ranks are told (planner/measure/ops.py), checked here: a bad value is one line."""
    return parse(
        NetbenchSpec,
        {"out": str(out), "message_sizes": message_sizes, "repeats": repeats, "matmul_size": matmul_size},
        "discover",
    )


@task(
    name="run-netbench",
    retries=1,
    retry_delay_seconds=5,
    cache_policy=NO_CACHE,
    retry_condition_fn=_retry_unless_user_error,
)
def run_netbench(
    run_dir: str, num_ranks: int, message_sizes: list[int], repeats: int, matmul_size: int, timeout_s: float
) -> str:
    """Launch worker.netbench under torchrun on this node; returns the snapshot JSON path rank 0 wrote."""
    out = rundir.snapshot_path(run_dir)
    out.unlink(missing_ok=True)  # a retry must not ingest the failed attempt's file
    cmd = [
        sys.executable,
        "-m",
        "worker.agent",
        f"--nproc-per-node={num_ranks}",  # torchrun on 127.0.0.1 only
        "--max-restarts=0",
        "-m",
        "worker.netbench",
        *_bench_spec(out, message_sizes, repeats, matmul_size).to_argv(),
    ]
    res = _run_group(cmd, Path(run_dir), timeout_s)
    if res.returncode != 0 or not out.is_file():
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"netbench exited {res.returncode}; last lines:\n{tail}")
    return str(out)


@task(name="run-netbench-slurm", retries=0, cache_policy=NO_CACHE, retry_condition_fn=_retry_unless_user_error)
def run_netbench_slurm(
    run_dir: str,
    nodes: int,
    ranks_per_node: int,
    message_sizes: list[int],
    repeats: int,
    matmul_size: int,
    timeout_s: float,
    slurm: SlurmOptions,
) -> str:
    """worker.netbench on `nodes` Slurm-allocated nodes as one batch job (launcher/slurm.py): the links
    between them measured too; returns the snapshot rank 0 wrote into the (shared) run folder."""
    out = rundir.snapshot_path(run_dir)
    out.unlink(missing_ok=True)
    worker = ["-m", "worker.netbench", *_bench_spec(out, message_sizes, repeats, matmul_size).to_argv()]
    script = rundir.sbatch_path(run_dir)
    script.write_text(batch_script("meshplan-discover", nodes, ranks_per_node, run_dir, worker, slurm, str(run_dir)))
    res = run_batch(script, timeout_s, on_submit=lambda j: get_run_logger().info(f"discovery: slurm job {j} submitted"))
    if res.returncode != 0 or not out.is_file():
        log = job_log(run_dir, res.job_id)
        tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-15:]) if log.is_file() else ""
        raise RuntimeError(f"netbench slurm job {res.job_id} ended {res.state}, exit {res.returncode}:\n{tail}")
    return str(out)


@task(name="find-snapshot", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def snapshot_exists(db_path: str, fingerprint: str) -> bool:
    return find_snapshot(db_path, fingerprint) is not None


@task(name="load-cluster", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def load_cluster(db_path: str, fingerprint: str) -> ClusterSpec:
    return load_snapshot(db_path, fingerprint).cluster


@task(
    name="record-cluster-file",
    retries=2,
    retry_delay_seconds=2,
    cache_policy=NO_CACHE,
    retry_condition_fn=_retry_unless_user_error,
)
def record_cluster(db_path: str, cluster: ClusterSpec) -> str:
    """Store a described cluster under its own spec fingerprint (idempotent)."""
    return save_snapshot(db_path, "file-" + cluster.fingerprint(), cluster, "file")


@task(
    name="ingest-snapshot",
    retries=2,
    retry_delay_seconds=2,
    cache_policy=NO_CACHE,
    retry_condition_fn=_retry_unless_user_error,
)
def ingest_snapshot(db_path: str, snapshot_path: str, name: str | None = None) -> str:
    """Fit, convert and store a netbench snapshot under its hardware fingerprint (idempotent)."""
    text = read_input(snapshot_path, "snapshot_file", "snapshot", "the JSON that netbench rank 0 wrote")
    snapshot = parse_json(text, snapshot_path, "pass a netbench snapshot")
    fingerprint = snapshot_fingerprint(snapshot)
    return save_snapshot(db_path, fingerprint, cluster_from_snapshot(snapshot, name), "probe", snapshot)


@task(name="publish-hardware", cache_policy=NO_CACHE)
def publish_hardware(db_path: str, fingerprint: str, reused: bool) -> None:
    """A markdown artifact in the Prefect UI: devices, links and fits of the snapshot."""
    snap = load_snapshot(db_path, fingerprint)
    lines = [
        f"# Hardware {fingerprint} ({snap.source}{', reused' if reused else ''})",
        "",
        "| node | kind | devices | memory GB | planner GFLOP/s | measured GFLOP/s | mem GB/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for (node, kind), rows in snap.devices.group_by("node", "kind", maintain_order=True):
        measured, bw = rows["measured_flop_per_s"].median(), rows["memory_bandwidth_bytes_per_s"].median()
        lines.append(
            f"| {node} | {kind} | {rows.height} | {rows['memory_bytes'][0] / 1e9:.1f} | "
            f"{rows['peak_flop_per_s'][0] / 1e9:,.1f} | {'-' if measured is None else f'{measured / 1e9:,.1f}'} | "
            f"{'-' if bw is None else f'{bw / 1e9:.1f}'} |"
        )
    lines += ["", "| node | class | kind | α µs | GB/s | source |", "|---|---|---|---|---|---|"]
    for r in snap.links.iter_rows(named=True):
        lines.append(
            f"| {r['node']} | {r['link_class']} | {r['kind']} | {r['latency_s'] * 1e6:.1f} | "
            f"{r['bandwidth_bytes_per_s'] / 1e9:.3f} | {r['source'] or 'cluster file'} |"
        )
    create_markdown_artifact("\n".join(lines), key=f"hardware-{fingerprint}".lower(), description=snap.name)
