"""Workload traces and measured-speed tables as text → Jobs, ClusterState and TableSpeed rows.

Two job formats: the shipped Philly/Arena trace (`model_name`, `sim_submit_time`, `sim_iter_num`,
`req_*` columns; see the trace's README) and meshplan's own (`job_id, submit_s, model,
global_batch, iterations` with optional `seq, priority, deadline_s, gpu_kinds, req_num_gpu,
req_gpu_type, req_num_nodes`). Bad rows raise MeshplanError naming the row and field. The caller
reads the files: the core parses text only.
"""

from __future__ import annotations

import csv
import io
import math

from planner.errors import MeshplanError, closest
from planner.limits import MAX_SECONDS, MAX_STEPS
from planner.scheduler.types import Allocation, ClusterState, Job, kind_alias
from planner.specs.cluster import ClusterSpec

# Mixed-precision Adam keeps 16 bytes of state per parameter (fp16 weights and gradients, fp32
# master weights, momentum and variance): Rajbhandari et al., ZeRO (SC'20), §3.1, "16Ψ".
STATE_BYTES_PER_PARAM = 16.0
_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def _rows(text: str, origin: str, required: tuple[str, ...]) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
        raise MeshplanError(
            f"{origin} columns", ",".join(reader.fieldnames or []), f"add the column(s) {', '.join(missing)}"
        )
    return list(reader)


def _num(row: dict[str, str], field: str, where: str, *, integer: bool = False, positive: bool = False) -> float:
    raw = (row.get(field) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise MeshplanError(f"{where}.{field}", raw, "write a number") from None
    if not math.isfinite(value):
        raise MeshplanError(f"{where}.{field}", raw, "write a finite number (not nan or inf)")
    if value < 0 or (positive and value == 0):
        raise MeshplanError(f"{where}.{field}", raw, f"must be {'positive' if positive else 'zero or more'}")
    hi = MAX_STEPS if integer else MAX_SECONDS  # counts (planner/limits.py), or seconds: ten years
    if value > hi:
        raise MeshplanError(f"{where}.{field}", raw, f"must be at most {hi:g}")
    if integer and value != int(value):
        raise MeshplanError(f"{where}.{field}", raw, "write a whole number")
    return value


def param_count(text: str) -> float:
    """'2.6B' → 2.6e9, '760M' → 7.6e8."""
    t = text.strip().upper()
    value = float(t[:-1]) * _SUFFIX[t[-1]] if t and t[-1] in _SUFFIX else float(t)
    if not 0 < value < 1e16:  # 10^16 parameters: 10,000x the largest published models; also nan/inf
        raise MeshplanError("param_num", text, "a parameter count such as 2.6B or 760M")
    return value


def _kind(value: str, where: str, kinds: set[str]) -> str:
    k = value.strip().lower()
    if k not in kinds:
        hint = ", ".join(closest(k, sorted(kinds)))
        raise MeshplanError(
            where,
            value,
            f"no such GPU kind on this cluster (kinds: {', '.join(sorted(kinds))}; closest: {hint or '-'})",
        )
    return k


def parse_jobs(text: str, kinds: set[str], origin: str = "jobs.csv") -> list[Job]:
    """Jobs from either trace format, checked against the cluster's GPU kinds."""
    head = text.split("\n", 1)[0]
    if "sim_iter_num" in head.split(","):
        return _arena_jobs(text, kinds, origin)
    return _meshplan_jobs(text, kinds, origin)


def _arena_jobs(text: str, kinds: set[str], origin: str) -> list[Job]:
    need = (
        "job_alias",
        "sim_submit_time",
        "sim_iter_num",
        "model",
        "param_num",
        "batch_size",
        "req_num_gpu",
        "req_gpu_type",
    )
    out = []
    for n, row in enumerate(_rows(text, origin, need), start=2):  # line 1 is the header
        where = f"{origin} row {n}"
        submit = _num(row, "sim_submit_time", where)
        if row.get("trace_submission_time"):
            _num(row, "trace_submission_time", where)
        deadline = _num(row, "trace_deadline", where) if row.get("trace_deadline") else None
        kind = _kind(row["req_gpu_type"], f"{where}.req_gpu_type", kinds)
        count = int(_num(row, "req_num_gpu", where, integer=True, positive=True))
        nodes = len(row.get("req_packed_locality", "").split("x")) if row.get("req_packed_locality") else 1
        batch = int(_num(row, "batch_size", where, integer=True, positive=True))
        params = param_count(row["param_num"])
        out.append(
            Job(
                job_id=row["job_alias"],
                model=f"{row['model']}_{row['param_num']}_{batch}",
                global_batch=batch,
                iterations=int(_num(row, "sim_iter_num", where, integer=True, positive=True)),
                submit_s=submit,
                deadline_s=deadline,
                requested=Allocation(kind, count, nodes if count % nodes == 0 else 1),
                state_bytes=params * STATE_BYTES_PER_PARAM,
            )
        )
    return out


def _meshplan_jobs(text: str, kinds: set[str], origin: str) -> list[Job]:
    out = []
    for n, row in enumerate(
        _rows(text, origin, ("job_id", "submit_s", "model", "global_batch", "iterations")), start=2
    ):
        where = f"{origin} row {n}"
        allowed = tuple(
            _kind(k, f"{where}.gpu_kinds", kinds) for k in (row.get("gpu_kinds") or "").split(";") if k.strip()
        )
        req = None
        if row.get("req_num_gpu"):
            req = Allocation(
                _kind(row.get("req_gpu_type") or "", f"{where}.req_gpu_type", kinds),
                int(_num(row, "req_num_gpu", where, integer=True, positive=True)),
                int(_num(row, "req_num_nodes", where, integer=True, positive=True)) if row.get("req_num_nodes") else 1,
            )
        out.append(
            Job(
                job_id=row["job_id"],
                model=row["model"].strip(),
                global_batch=int(_num(row, "global_batch", where, integer=True, positive=True)),
                iterations=int(_num(row, "iterations", where, integer=True, positive=True)),
                submit_s=_num(row, "submit_s", where),
                seq=int(_num(row, "seq", where, integer=True, positive=True)) if row.get("seq") else None,
                priority=int(_num(row, "priority", where, integer=True)) if row.get("priority") else 0,
                deadline_s=_num(row, "deadline_s", where) if row.get("deadline_s") else None,
                kinds=allowed,
                requested=req,
            )
        )
    return out


def parse_lookup(text: str, origin: str = "sim_lookup.csv") -> list[tuple[str, str, int, int, int, float | None]]:
    """TableSpeed rows from the trace's sim_lookup.csv (an empty time or feasible=0: does not fit)."""
    need = ("model_cfg", "gpu_type", "num_gpus", "num_nodes", "gpus_per_node", "sim_iter_time_s")
    out: list[tuple[str, str, int, int, int, float | None]] = []
    for n, row in enumerate(_rows(text, origin, need), start=2):
        where = f"{origin} row {n}"
        t = _num(row, "sim_iter_time_s", where, positive=True) if row["sim_iter_time_s"].strip() else None
        if row.get("feasible", "1").strip() == "0":
            t = None
        out.append(
            (
                row["model_cfg"],
                row["gpu_type"].strip().lower(),
                int(_num(row, "num_gpus", where, integer=True, positive=True)),
                int(_num(row, "num_nodes", where, integer=True, positive=True)),
                int(_num(row, "gpus_per_node", where, integer=True, positive=True)),
                t,
            )
        )
    return out


def cluster_from_csv(text: str, origin: str = "cluster.csv") -> ClusterState:
    """The trace's cluster.csv (gpu_type, node_num, gpus_per_node) as a ClusterState."""
    kinds, totals = [], []
    for n, row in enumerate(_rows(text, origin, ("gpu_type", "node_num", "gpus_per_node")), start=2):
        where = f"{origin} row {n}"
        per = int(_num(row, "gpus_per_node", where, integer=True, positive=True))
        for _ in range(int(_num(row, "node_num", where, integer=True, positive=True))):
            kinds.append(row["gpu_type"].strip().lower())
            totals.append(per)
    return ClusterState(kinds, totals)


def cluster_from_spec(spec: ClusterSpec) -> ClusterState:
    """A ClusterSpec's nodes as a ClusterState, kinds by `kind_alias` of the catalog name."""
    kinds, totals, names = [], [], {}
    for group in spec.nodes:
        alias = kind_alias(group.device_kind)
        names[alias] = group.device_kind
        kinds += [alias] * group.count
        totals += [group.num_devices] * group.count
    return ClusterState(kinds, totals, device_names=names)
