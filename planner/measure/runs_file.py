"""A user's measured training runs (a CSV in the development set's columns) as priceable cases.

`meshplan calibrate --runs runs.csv` reads this: one measured configuration a row, in the columns of
../shared/data/published_dev.csv (its README). Required: model dims (layers, hidden, heads, seq_len,
vocab), global_batch, micro_batch, tp, pp, dp, gpu (a catalog name), num_gpus, gpus_per_node, and
the measured step: iteration_time_s, or tokens_per_sec (step = global_batch × seq_len / tokens/s).
Optional: ffn_hidden (4·hidden), kv_heads, cp, vpp, sharding, recompute, precision, interconnect
(a link preset name between nodes; default ib-hdr), run_id. Inside a node the link is the catalog's:
the part's fabric where it joins every GPU of the node (NVLink on SXM, HGX and GH200 parts, Infinity
Fabric), else PCIe of the part's generation (a 2-GPU bridge does not join a node); never guessed
from the name.

A row with neither a time nor a throughput (a failed trial, a derived-only row) is skipped and named
in `RunsFile.skipped`; a row whose measured step is physically impossible (model FLOPs over the
step beyond the GPUs' dense peak: MFU > 1, as `tokens_per_sec=1e300` would give) is a bad row. A
file with any bad row is rejected whole, the error naming the row and the field.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import NamedTuple

from planner.errors import MeshplanError
from planner.limits import MAX_STEPS
from planner.specs.catalog import GpuSpec, is_known, lookup
from planner.specs.cluster import LINK_PRESETS, ClusterSpec, LinkSpec, NodeSpec
from planner.specs.flops import model_flops_per_step
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan, StagePlan

REQUIRED = (
    "layers",
    "hidden",
    "heads",
    "seq_len",
    "vocab",
    "global_batch",
    "micro_batch",
    "tp",
    "pp",
    "dp",
    "gpu",
    "num_gpus",
    "gpus_per_node",
)
NVLINK = {"Volta": "nvlink2", "Ampere": "nvlink3", "Hopper": "nvlink4", "Blackwell": "nvlink5"}
TIME_COLUMNS = ("iteration_time_s", "tokens_per_sec")


@dataclass(frozen=True)
class MeasuredRun:
    run_id: str
    device_kind: str
    model: ModelSpec
    cluster: ClusterSpec
    plan: Plan
    measured_s: float


def _bad(row: int, field: str, value: object, fix: str) -> MeshplanError:
    return MeshplanError(f"runs file row {row}, {field}", value, fix)


def _pos_int(r: dict[str, str], i: int, key: str, default: int | None = None) -> int:
    raw = (r.get(key) or "").strip()
    if not raw:
        if default is None:
            raise _bad(i, key, raw, "must be a positive integer")
        return default
    try:
        v = int(float(raw))
    except (ValueError, OverflowError):  # not a number, or inf
        raise _bad(i, key, raw, "must be a positive integer") from None
    if v <= 0 or v > MAX_STEPS:
        raise _bad(i, key, raw, f"must be a positive integer, at most {MAX_STEPS:g}")
    return v


def measured_seconds(r: dict[str, str], i: int) -> float:
    """The measured step: iteration_time_s, else global_batch × seq_len / tokens_per_sec; > 0."""
    for key in ("iteration_time_s", "tokens_per_sec"):
        raw = (r.get(key) or "").strip()
        if not raw:
            continue
        try:
            v = float(raw)
        except ValueError:
            raise _bad(i, key, raw, "must be a positive number") from None
        if not v > 0 or not math.isfinite(v):
            raise _bad(i, key, raw, "must be a positive, finite number (a measured time or throughput)")
        if key == "iteration_time_s":
            return v
        return _pos_int(r, i, "global_batch") * _pos_int(r, i, "seq_len") / v
    raise _bad(i, "iteration_time_s", "", "give iteration_time_s or tokens_per_sec for every run")


class RunsFile(NamedTuple):
    """The measured runs of a file, and the rows skipped as (row number, run id, why)."""

    runs: list[MeasuredRun]
    skipped: list[tuple[int, str, str]]

    def skipped_note(self) -> str:
        """One line naming the skipped rows ('' when none)."""
        if not self.skipped:
            return ""
        rows = ", ".join(f"{i} ({rid})" for i, rid, _ in self.skipped[:6])
        more = f" and {len(self.skipped) - 6} more" if len(self.skipped) > 6 else ""
        return f"skipped {len(self.skipped)} rows without {' or '.join(TIME_COLUMNS)}: {rows}{more}"


def intra_node_link(spec: GpuSpec) -> LinkSpec:
    """The link inside a node of `spec` GPUs, from the catalog (module docstring): the fabric's
    preset of that bandwidth (or a link of the catalog's bandwidth), NVLink of the architecture's
    generation where the catalog names NVLink without a figure, PCIe of the part's generation where
    there is no node-wide fabric."""
    fabric = spec.fabric or ""
    if not fabric or "bridge" in fabric.lower():
        return LINK_PRESETS.get(f"pcie{spec.pcie_gen}", LINK_PRESETS["pcie4"])
    bw = spec.fabric_bytes_per_s
    if bw is None:
        return LINK_PRESETS[NVLINK.get(spec.architecture, "nvlink4")] if "NVLink" in fabric else LINK_PRESETS["pcie4"]
    for preset in LINK_PRESETS.values():
        if preset.bandwidth_bytes_per_s == bw and preset.kind.startswith(("nvlink", "xgmi")):
            return preset
    return LinkSpec(kind=fabric, bandwidth_bytes_per_s=bw, latency_s=5e-6, source=f"catalog: {spec.name} {fabric}")


def has_time(r: dict[str, str]) -> bool:
    return any((r.get(k) or "").strip() for k in TIME_COLUMNS)


def read_runs(text: str) -> RunsFile:
    """Every row of the CSV `text` with a measured time as a MeasuredRun, the rows without one named
    as skipped; MeshplanError naming the first bad row and field (nothing half-read)."""
    reader = csv.DictReader(io.StringIO(text))
    cols = set(reader.fieldnames or ())
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise MeshplanError(
            "runs file columns", ", ".join(missing), "missing; the development set's columns are the format"
        )
    if not (set(TIME_COLUMNS) & cols):
        raise MeshplanError("runs file columns", "iteration_time_s", "missing; give it or tokens_per_sec")
    runs: list[MeasuredRun] = []
    skipped: list[tuple[int, str, str]] = []
    for i, r in enumerate(reader, start=2):  # row 1 is the header
        if has_time(r):
            runs.append(_run(r, i))
        else:
            skipped.append((i, (r.get("run_id") or f"row{i}").strip(), "no measured time"))
    if not runs and not skipped:
        raise MeshplanError("runs file", "no rows", "give at least one measured run")
    return RunsFile(runs, skipped)


def parse_runs(text: str) -> list[MeasuredRun]:
    """The measured runs of the CSV `text` (rows without a time left out: read_runs names them);
    MeshplanError naming the first bad row and field."""
    return read_runs(text).runs


def _run(r: dict[str, str], i: int) -> MeasuredRun:
    gpu = (r.get("gpu") or "").split(" (")[0].strip()
    if not is_known(gpu):
        raise _bad(i, "gpu", gpu, "not in the GPU catalog (`meshplan gpus` lists them)")
    spec = lookup(gpu)
    measured = measured_seconds(r, i)
    hidden = _pos_int(r, i, "hidden")
    kv = (r.get("kv_heads") or "").strip()
    dims = {
        "num_layers": _pos_int(r, i, "layers"),
        "num_heads": _pos_int(r, i, "heads"),
        "ffn_hidden": _pos_int(r, i, "ffn_hidden", 4 * hidden),
        "vocab_size": _pos_int(r, i, "vocab"),
        "seq_len": _pos_int(r, i, "seq_len"),
    }
    try:
        model = ModelSpec(
            name=(r.get("model_name") or "custom").strip() or "custom",
            family="llama" if kv else "gpt",
            hidden=hidden,
            num_kv_heads=int(kv) if kv else None,
            **dims,
        )
    except (ValueError, MeshplanError) as err:
        raise _bad(i, "model", r.get("model_name"), str(err).splitlines()[0]) from None
    gpus, per_node = _pos_int(r, i, "num_gpus"), _pos_int(r, i, "gpus_per_node")
    if gpus % per_node:
        raise _bad(i, "num_gpus", gpus, f"must be whole nodes of gpus_per_node={per_node}")
    link = (r.get("interconnect") or "").strip()
    inter = LINK_PRESETS[link] if link in LINK_PRESETS else LINK_PRESETS["ib-hdr"]
    intra = intra_node_link(spec)
    try:
        node = NodeSpec(
            name="n", device=gpu, num_devices=per_node, count=gpus // per_node, intra_link=intra, inter_link=inter
        )
    except ValueError as err:  # pydantic bounds: devices a node, nodes a cluster
        raise _bad(i, "gpus_per_node", per_node, str(err).splitlines()[-1].strip()) from None
    tp, pp, dp = _pos_int(r, i, "tp"), _pos_int(r, i, "pp"), _pos_int(r, i, "dp")
    cp, vpp = _pos_int(r, i, "cp", 1), _pos_int(r, i, "vpp", 1)
    if tp * pp * dp * cp != gpus:
        raise _bad(i, "dp", dp, f"tp×cp×pp×dp = {tp * cp * pp * dp} must equal num_gpus={gpus}")
    gb, mbs = _pos_int(r, i, "global_batch"), _pos_int(r, i, "micro_batch")
    if gb % (dp * mbs):
        raise _bad(i, "global_batch", gb, f"must be a multiple of dp × micro_batch = {dp * mbs}")
    nst, layers = pp * vpp, model.num_layers
    if layers < nst:
        raise _bad(i, "pp", pp, f"{nst} stages for {layers} layers")
    rec = (r.get("recompute") or "none").strip()
    recompute = "full" if rec.startswith("full") else "selective" if rec.startswith("selective") else "none"
    shard = (r.get("sharding") or "").strip()
    sharding = (
        "zero3"
        if shard in ("FSDP FULL_SHARD", "FSDP2", "zero3")
        else "zero2"
        if shard in ("FSDP SHARD_GRAD_OP", "zero2")
        else "zero1"
        if shard.startswith("distributed optimizer") or shard == "zero1"
        else "none"
    )
    prec = (r.get("precision") or "bf16").strip()
    cluster = ClusterSpec(name=r.get("run_id") or f"row{i}", nodes=(node,))
    try:
        plan = row_plan(
            model, cluster.name, tp=tp, pp=pp, dp=dp, cp=cp, vpp=vpp, global_batch=gb, micro_batch=mbs,
            recompute=recompute, sharding=sharding, dtype="fp16" if prec.startswith("fp16") else "bf16",
            fp8="fp8" in prec or "float8" in prec,
        )  # fmt: skip
    except (ValueError, MeshplanError) as err:
        raise _bad(i, "plan", f"tp={tp} pp={pp} dp={dp}", str(err).splitlines()[0]) from None
    peak = node.peak_fp8_flop_per_s if plan.fp8 and node.peak_fp8_flop_per_s else node.peak_flop_per_s(plan.dtype)
    mfu = model_flops_per_step(model, gb, model.seq_len) / (measured * gpus * peak)
    if mfu > 1.0:
        key = next(k for k in TIME_COLUMNS if (r.get(k) or "").strip())
        raise _bad(
            i, key, r[key].strip(), f"implies MFU {mfu:.3g} > 1 on {gpus} × {gpu}: not a measured step; check the units"
        )
    return MeasuredRun(r.get("run_id") or f"row{i}", gpu, model, cluster, plan, measured)


def row_plan(
    model: ModelSpec,
    cluster: str,
    *,
    tp: int,
    pp: int,
    dp: int,
    cp: int,
    vpp: int,
    global_batch: int,
    micro_batch: int,
    recompute: str,
    sharding: str,
    dtype: str,
    fp8: bool,
    recompute_every: int = 1,
    sequence_parallel: bool = False,
    attention: str = "sdpa",
    loss: str = "torch",
    dropout: bool = False,
) -> Plan:
    """The plan a published or measured run describes: pp × vpp stages with the layers split evenly
    (the first L mod stages one more), interleaved 1F1B with vpp > 1, and Megatron's rank order
    (tp, then cp, then dp, then pp: stage k's replica j on devices (k mod pp)·dp·w + j·w + [0, w),
    w = tp·cp), every replica the same share of the batch. One builder for the runs file and
    bench/published.py, so both price a row as the same plan; the caller checks the degrees."""
    nst, layers = pp * vpp, model.num_layers
    bounds = [0]
    for k in range(nst):
        bounds.append(bounds[-1] + layers // nst + (1 if k < layers % nst else 0))
    w = tp * cp
    stages = tuple(
        StagePlan(
            layer_start=bounds[k],
            layer_end=bounds[k + 1],
            device_ids=tuple((k % pp) * dp * w + j * w + t for j in range(dp) for t in range(w)),
            tp=tp,
            dp=dp,
            cp=cp,
            recompute=recompute,  # type: ignore[arg-type]
            recompute_every=recompute_every,
            sharding=sharding,  # type: ignore[arg-type]
            sequence_parallel=sequence_parallel and tp > 1,
        )
        for k in range(nst)
    )
    return Plan(
        model=model.name,
        cluster=cluster,
        global_batch_size=global_batch,
        seq_len=model.seq_len,
        micro_batch_size=micro_batch,
        schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
        virtual_stages=vpp,
        dtype=dtype,  # type: ignore[arg-type]
        attention=attention,  # type: ignore[arg-type]
        loss=loss,  # type: ignore[arg-type]
        dropout=dropout,
        fp8=fp8,
        stages=stages,
        batch_shares=(global_batch // dp,) * dp,
    )
