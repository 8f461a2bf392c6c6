"""Save and load hardware snapshots (stage 1): the cluster spec plus its devices, links, measurements, fits.

A snapshot is keyed by its hardware fingerprint. Saving replaces the snapshot's child rows as a
whole inside one transaction, so a retried task (or a --refresh) never leaves duplicates or a mix of
old and new measurements; the snapshot row itself is upserted, its created_at the time of the latest save.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl

from planner.measure.discovery import device_rows, fit_snapshot, spec_device_rows
from planner.specs.cluster import ClusterSpec, parse_cluster
from storage.db import connect

Source = Literal["probe", "file"]
_CHILDREN = ("hardware_devices", "hardware_links", "hardware_measurements", "hardware_fits", "hardware_unsupported")


@dataclass(frozen=True)
class HardwareSnapshot:
    """A stored snapshot: the spec the planner uses and the frames behind it."""

    fingerprint: str
    name: str
    source: str
    created_at: dt.datetime
    cluster: ClusterSpec
    devices: pl.DataFrame
    links: pl.DataFrame
    measurements: pl.DataFrame
    fits: pl.DataFrame
    unsupported: pl.DataFrame
    cores_per_node: int | None = None  # a probed node's CPU cores (the smallest node's); None if described
    # resident bytes of a rank with the training runtime imported and its process group up, before it
    # allocates anything (worker.netbench; the largest node's); None if described or probed before it
    runtime_rss_bytes: int | None = None


def _runtime_rss_bytes(snapshot_json: str | None) -> int | None:
    nodes = json.loads(snapshot_json).get("nodes", {}) if snapshot_json else {}
    rss = [int(n["runtime_rss_bytes"]) for n in nodes.values() if n.get("runtime_rss_bytes")]
    return max(rss) if rss else None


def _cores_per_node(snapshot_json: str | None) -> int | None:
    nodes = json.loads(snapshot_json).get("nodes", {}) if snapshot_json else {}
    cores = [int(n["num_cores"]) for n in nodes.values() if n.get("num_cores")]
    return min(cores) if cores else None


def _link_rows(cluster: ClusterSpec) -> list[tuple]:
    rows = []
    for node in cluster.nodes:
        for link_class, link in (("intra-node", node.intra_link), ("inter-node", node.inter_link)):
            rows.append(
                (
                    node.name,
                    link_class,
                    link.kind,
                    link.bandwidth_bytes_per_s,
                    link.latency_s,
                    link.measured,
                    link.source,
                )
            )
    return rows


def _measurement_rows(snapshot: dict[str, Any]) -> list[tuple]:
    rows = []
    for m in snapshot["measurements"]:
        ranks = "all" if m.get("src") is None else f"{m['src']}-{m['dst']}"
        rows.append((m["op"], int(m["message_bytes"]), ranks, int(m["num_ranks"]), m["link_class"], float(m["time_s"])))
    return rows


def _fit_rows(snapshot: dict[str, Any]) -> list[tuple]:
    out = []
    for f in fit_snapshot(snapshot):
        bw = f.fit.bandwidth_bytes_per_s
        out.append(
            (
                f.op,
                f.link_class,
                f.fit.alpha_s,
                f.fit.beta_s_per_byte,
                bw if math.isfinite(bw) else None,
                f.fit.r2,
                f.fit.num_points,
            )
        )
    return out


_DEVICE_COLS = (
    "node",
    "local_index",
    "rank",
    "kind",
    "memory_bytes",
    "peak_flop_per_s",
    "measured_flop_per_s",
    "matmul_dtype",
    "memory_bandwidth_bytes_per_s",
)


def save_snapshot(
    db_path: str | Path,
    fingerprint: str,
    cluster: ClusterSpec,
    source: Source,
    snapshot: dict[str, Any] | None = None,
) -> str:
    """Record a cluster (and, for probes, its raw snapshot) under `fingerprint`; idempotent. Returns the fingerprint."""
    if source == "probe" and snapshot is None:
        raise ValueError("a probed snapshot needs its raw netbench snapshot")
    # validate before insert: what is stored is read back by every later command, so it must parse
    # now (a cluster built in code, or a probe's measured figures, skipped the file's checks)
    cluster_json = cluster.model_dump_json()
    parse_cluster(json.loads(cluster_json), origin=f"discovered cluster {cluster.name!r}")
    snapshot_json = json.dumps(snapshot) if snapshot else None
    devices = device_rows(snapshot) if snapshot is not None else spec_device_rows(cluster)
    with connect(db_path) as con:
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(
                "INSERT INTO hardware_snapshots (fingerprint, name, source, backend, cluster_json, snapshot_json) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (fingerprint) DO UPDATE SET name = excluded.name, "
                "source = excluded.source, backend = excluded.backend, cluster_json = excluded.cluster_json, "
                "snapshot_json = excluded.snapshot_json, created_at = now()",
                [
                    fingerprint,
                    cluster.name,
                    source,
                    snapshot["backend"] if snapshot else None,
                    cluster_json,
                    snapshot_json,
                ],
            )
            for table in _CHILDREN:
                con.execute(f"DELETE FROM {table} WHERE fingerprint = ?", [fingerprint])
            cols = ", ".join(_DEVICE_COLS)
            con.executemany(
                f"INSERT INTO hardware_devices (fingerprint, {cols}) VALUES (?{', ?' * len(_DEVICE_COLS)})",
                [[fingerprint, *(d[c] for c in _DEVICE_COLS)] for d in devices],
            )
            con.executemany(
                "INSERT INTO hardware_links VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [[fingerprint, *row] for row in _link_rows(cluster)],
            )
            if snapshot is not None:
                for table, rows in (
                    ("hardware_measurements", _measurement_rows(snapshot)),
                    ("hardware_fits", _fit_rows(snapshot)),
                    ("hardware_unsupported", [(u["op"], u["reason"]) for u in snapshot.get("unsupported", [])]),
                ):
                    if rows:
                        marks = ", ".join("?" * (len(rows[0]) + 1))
                        con.executemany(f"INSERT INTO {table} VALUES ({marks})", [[fingerprint, *r] for r in rows])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
    return fingerprint


def find_snapshot(db_path: str | Path, fingerprint: str) -> HardwareSnapshot | None:
    """The stored snapshot with this fingerprint, or None."""
    if not Path(db_path).exists():
        return None
    with connect(db_path) as con:
        hit = con.execute("SELECT count(*) FROM hardware_snapshots WHERE fingerprint = ?", [fingerprint]).fetchall()
    return load_snapshot(db_path, fingerprint) if hit[0][0] else None


def load_snapshot(db_path: str | Path, fingerprint: str) -> HardwareSnapshot:
    """The stored snapshot with this fingerprint; KeyError names what is there if it is missing."""
    with connect(db_path) as con:
        rows = con.execute(
            "SELECT name, source, created_at, cluster_json, snapshot_json FROM hardware_snapshots WHERE fingerprint = ?",
            [fingerprint],
        ).fetchall()
        if not rows:
            known = [r[0] for r in con.execute("SELECT fingerprint FROM hardware_snapshots").fetchall()]
            raise KeyError(f"no hardware snapshot {fingerprint!r}; stored: {', '.join(known) or 'none'}")
        name, source, created_at, cluster_json, snapshot_json = rows[0]
        frames = {
            t: con.sql(
                f"SELECT * EXCLUDE (fingerprint) FROM {t} WHERE fingerprint = ? ORDER BY ALL", params=[fingerprint]
            ).pl()
            for t in _CHILDREN
        }
    return HardwareSnapshot(
        fingerprint=fingerprint,
        name=name,
        source=source,
        created_at=created_at,
        cluster=parse_cluster(json.loads(cluster_json), origin=f"snapshot {fingerprint}"),
        devices=frames["hardware_devices"],
        links=frames["hardware_links"],
        measurements=frames["hardware_measurements"],
        fits=frames["hardware_fits"],
        unsupported=frames["hardware_unsupported"],
        cores_per_node=_cores_per_node(snapshot_json),
        runtime_rss_bytes=_runtime_rss_bytes(snapshot_json),
    )


def list_snapshots(db_path: str | Path) -> pl.DataFrame:
    """One row per snapshot, newest first, with device and measurement counts."""
    with connect(db_path) as con:
        return con.sql(
            "SELECT s.fingerprint, s.name, s.source, s.backend, s.created_at, "
            "(SELECT count(*) FROM hardware_devices d WHERE d.fingerprint = s.fingerprint) AS num_devices, "
            "(SELECT count(*) FROM hardware_measurements m WHERE m.fingerprint = s.fingerprint) AS num_measurements "
            "FROM hardware_snapshots s ORDER BY s.created_at DESC, s.fingerprint"
        ).pl()


def resolve_snapshot(db_path: str | Path, fingerprint: str | None = None) -> HardwareSnapshot:
    """Snapshot `fingerprint`, or the newest probed snapshot when none is named."""
    from planner.errors import MeshplanError

    if fingerprint:
        snap = find_snapshot(db_path, fingerprint) if Path(db_path).exists() else None
        if snap is None:
            raise MeshplanError("--snapshot", fingerprint, "no such hardware snapshot; `meshplan db` lists them")
        return snap
    probed = list_snapshots(db_path).filter(pl.col("source") == "probe") if Path(db_path).exists() else None
    if probed is None or probed.height == 0:
        raise MeshplanError(
            "--cluster",
            None,
            "no cluster file given and this machine was never discovered; "
            "pass --cluster FILE or run `meshplan discover` first",
        )
    return load_snapshot(db_path, probed["fingerprint"][0])
