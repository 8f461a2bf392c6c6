"""The GPU cost model against published measured runs: `planner.cost.estimate` on ../shared/data/published_dev.csv.

    .venv/bin/python bench/published.py [--data PATH] [--rows] [--json OUT]

Each CSV row becomes a ModelSpec, a ClusterSpec and a Plan, priced with the catalog figures and no
calibration or profiles. The only figures fitted on these rows are planner.cost.fitted's four
kernel efficiencies (bench/fit_kernels.py, on the MPT rows): the table is printed with the unfitted
(sourced prior) figures first and the fitted ones beside it. `--stack runtime` prices every row as
meshplan's own runtime stack instead of its framework's (what the memory terms are worth):
- model: GPT family (LayerNorm, GELU MLP of ffn_hidden), the row's layers / hidden / heads / vocab /
  seq; MPT uses ALiBi (no learned position table) and ties its embedding; Megatron's GPT has learned
  positions and a tied embedding (the last stage keeps its own copy when pp > 1).
- cluster: num_gpus / gpus_per_node nodes of the row's GPU; NVLink 3 (A100) or 4 (H100) inside a
  node; between nodes Selene's 8 × HDR 200 Gb/s per node (one NIC per GPU), MPT's A100 sections'
  1600 Gb/s per node (RoCE, 8 × 200G), and for MPT's H100 sections, which do not state a fabric, the
  DGX H100 reference of 8 × 400 Gb/s per node (an assumption, printed).
- plan: tp × pp × dp with Megatron's rank order (tp fastest, then dp, then pp), layers split evenly
  over pp × vpp stages (vpp → interleaved 1F1B), micro-batch from the row, gradient accumulation =
  global batch / (dp × micro-batch) micro-batches per replica; FSDP FULL_SHARD → zero3, SHARD_GRAD_OP
  → zero2, Megatron (no distributed optimizer in SC'21) → none; recompute full or none; fp16 / bf16
  (amp_bf16 and pure bf16 alike: both run bf16 matmuls); amp_fp8 → bf16 with fp8 linears
  (`Plan.fp8`: Composer's Transformer Engine autocast), scored as their own family `mpt-fp8`,
  which bench/fit_kernels.py never fits on (it fits `mpt`).
- stack (what each framework keeps in memory, planner.cost.memory): llm-foundry's MPT runs flash
  attention (the yamls' attn_impl), no dropout (resid/attn/emb_pdrop 0) and its default
  `loss_fn: fused_crossentropy` (flash-attn's kernel on bf16 logits); Megatron-LM as of SC'21 runs
  its fused softmax (non-flash: s×s probabilities kept), dropout 0.1 (GPT's hidden and attention
  dropout defaults), vocab-parallel cross entropy on an fp32 copy, and no sequence parallelism
  (added in 2022, Korthikanti et al.).
- runtime (what overlaps which compute, planner.cost.overlap): llm-foundry's rows run Composer's torch
  FSDP (`FSDP_COMPOSER`: reduce-scatter every micro-batch, all-gather and reduce-scatter on one
  communicator behind each unit's compute), SC'21's Megatron-LM v2 (`MEGATRON_SC21`: gradient
  all-reduce after the schedule, blocking p2p, TP not overlapped); `--runtime NAME` prices all rows
  under one runtime instead.

What is compared: predicted `step_time_s` with the measured time of one optimizer step. MFU
definitions differ between the sources (MPT counts 3 passes of model FLOPs incl. attention, Megatron's
Eq. 3 counts the recompute forward), so the bench compares seconds, never MFU:
- MPT: global_batch × seq_len / tokens_per_sec (the README's measured throughput over 12 steps);
- Megatron SC'21: derived_iteration_time_s = Eq. 3 FLOPs / (published TF/s per GPU × GPUs), i.e. the
  published per-GPU throughput converted back with the paper's own FLOP formula.
Error = predicted / measured − 1. Per source family and GPU kind it prints n, median |error|, MAPE,
signed bias (mean error), share within 10 % / 20 %, and how many of the runs (every row ran) the model
calls out of memory. Rows the model cannot express are counted and listed by reason, never dropped.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from planner.cost import estimate  # noqa: E402
from planner.cost.compute import PRIOR, KernelEfficiency  # noqa: E402
from planner.cost.fitted import DEFAULT_KERNELS  # noqa: E402
from planner.cost.overlap import FSDP_COMPOSER, MEGATRON_SC21, RUNTIMES, Runtime  # noqa: E402
from planner.errors import MeshplanError  # noqa: E402
from planner.specs.cluster import LINK_PRESETS, ClusterSpec, NodeSpec  # noqa: E402
from planner.specs.model import ModelSpec  # noqa: E402
from planner.specs.plan import CostBreakdown, Plan, StagePlan  # noqa: E402

DEFAULT_DATA = [ROOT.parent / "shared/data/published_dev.csv", Path("/work/shared/data/published_dev.csv")]
INTRA = {"A100": "nvlink3", "H100": "nvlink4"}
ASSUMED = "MPT H100 sections state no fabric: assumed DGX H100's 8 × 400 Gb/s NDR per node"


class Unsupported(Exception):
    """A row the cost model cannot express yet; the message is the reason it is listed under."""


@dataclass(frozen=True)
class Case:
    run_id: str
    family: str
    gpu: str
    model: ModelSpec
    cluster: ClusterSpec
    plan: Plan
    measured_s: float
    runtime: Runtime = FSDP_COMPOSER


@dataclass(frozen=True)
class Result:
    case: Case
    cost: CostBreakdown

    @property
    def error(self) -> float:
        return self.cost.step_time_s / self.case.measured_s - 1.0

    @property
    def peak_over_capacity(self) -> float:
        return max(p / c for p, c in zip(self.cost.peak_memory_bytes, self.cost.memory_capacity_bytes, strict=True))


def family_of(row: dict[str, str]) -> str:
    """megatron-sc21, mpt, or mpt-fp8 (llm-foundry's amp_fp8 rows: their own group, never fitted on,
    since bench/fit_kernels.py fits the mpt family only)."""
    if "Narayanan" in row["source"]:
        return "megatron-sc21"
    return "mpt-fp8" if row.get("precision") == "amp_fp8" else "mpt"


def runtime_of(row: dict[str, str], family: str) -> Runtime:
    """What the row's framework overlaps (planner.cost.overlap): Megatron-LM as of SC'21 for its
    rows, Composer's torch FSDP for llm-foundry's."""
    if family == "megatron-sc21":
        return MEGATRON_SC21
    if "FSDP" in row.get("framework", "") or family.startswith("mpt"):
        return FSDP_COMPOSER
    raise Unsupported(f"framework {row.get('framework')!r}")


def _int(row: dict[str, str], key: str) -> int:
    return int(float(row[key]))


def inter_link(row: dict[str, str], family: str) -> str:
    """Preset for one GPU's share of the node's NICs (each row's fabric has one NIC per GPU)."""
    if family == "megatron-sc21":
        return "ib-hdr"  # Selene: 8 × HDR 200 Gb/s per DGX A100
    if "1600 Gbps" in row["interconnect"]:
        return "eth-200g"  # 1600 Gb/s per node over 8 GPUs = 200 Gb/s = 25 GB/s each
    if row["gpu"].startswith("H100"):
        return "ib-ndr"  # see ASSUMED
    raise Unsupported(f"unknown interconnect {row['interconnect']!r}")


def dtype_of(precision: str) -> str:
    """The working dtype; amp_fp8 (Composer's Transformer Engine fp8 autocast) is bf16 with fp8
    linears (Plan.fp8, build_case)."""
    if precision.startswith("fp16"):
        return "fp16"
    if precision in ("amp_bf16", "bf16", "amp_fp8"):
        return "bf16"
    raise Unsupported(f"precision {precision!r}")


def sharding_of(row: dict[str, str]) -> str:
    s = row["sharding"]
    if not s:
        return "none"
    if s == "FSDP FULL_SHARD":
        return "zero3"
    if s == "FSDP SHARD_GRAD_OP":
        return "zero2"
    raise Unsupported(f"sharding {s!r}")


def recompute_of(row: dict[str, str]) -> str:
    r = row["recompute"]
    if r.startswith("full"):
        return "full"
    if r == "none":
        return "none"
    raise Unsupported(f"recompute {r!r}")


def measured_step_s(row: dict[str, str], family: str) -> float:
    if family.startswith("mpt"):
        return _int(row, "global_batch") * _int(row, "seq_len") / float(row["tokens_per_sec"])
    return float(row["derived_iteration_time_s"])


def build_case(row: dict[str, str]) -> Case:
    """The row as (model, cluster, plan); Unsupported names what cannot be expressed."""
    family = family_of(row)
    if row.get("cp"):
        raise Unsupported("context parallelism (cp)")
    if row.get("heterogeneous", "no") != "no":
        raise Unsupported("heterogeneous cluster")
    dtype = dtype_of(row["precision"])
    mpt = family.startswith("mpt")
    kv = row.get("kv_heads")
    model = ModelSpec(
        name=row["model_name"],
        family="gpt",
        num_layers=_int(row, "layers"),
        hidden=_int(row, "hidden"),
        num_heads=_int(row, "heads"),
        num_kv_heads=int(kv) if kv else None,
        ffn_hidden=_int(row, "ffn_hidden"),
        vocab_size=_int(row, "vocab"),
        seq_len=_int(row, "seq_len"),
        tie_embeddings=True,
        learned_positions=not mpt,
    )
    gpus, per_node = _int(row, "num_gpus"), _int(row, "gpus_per_node")
    if gpus % per_node:
        raise Unsupported(f"{gpus} GPUs are not whole nodes of {per_node}")
    arch = row["gpu"][:4]
    node = NodeSpec(
        name="n",
        device=row["gpu"],
        num_devices=per_node,
        count=gpus // per_node,
        intra_link=LINK_PRESETS[INTRA[arch]],
        inter_link=LINK_PRESETS[inter_link(row, family)],
    )
    cluster = ClusterSpec(name=row["run_id"], nodes=(node,))
    tp, pp, dp = _int(row, "tp"), _int(row, "pp"), _int(row, "dp")
    if tp * pp * dp != gpus:
        raise Unsupported(f"tp×pp×dp = {tp * pp * dp} != {gpus} GPUs")
    vpp = _int(row, "vpp") if row.get("vpp") else 1
    nst = pp * vpp
    layers = model.num_layers
    if layers < nst:
        raise Unsupported(f"{nst} stages for {layers} layers")
    bounds = [0]
    for i in range(nst):
        bounds.append(bounds[-1] + layers // nst + (1 if i < layers % nst else 0))
    rec, shard = recompute_of(row), sharding_of(row)
    stages = tuple(
        StagePlan(
            layer_start=bounds[i],
            layer_end=bounds[i + 1],
            device_ids=tuple((i % pp) * dp * tp + r * tp + k for r in range(dp) for k in range(tp)),
            tp=tp,
            dp=dp,
            recompute=rec,  # type: ignore[arg-type]
            sharding=shard,  # type: ignore[arg-type]
        )
        for i in range(nst)
    )
    gb, mbs = _int(row, "global_batch"), _int(row, "micro_batch")
    if gb % (dp * mbs):
        raise Unsupported(f"global batch {gb} is not a multiple of dp × micro-batch = {dp * mbs}")
    plan = Plan(
        model=model.name,
        cluster=cluster.name,
        global_batch_size=gb,
        seq_len=model.seq_len,
        micro_batch_size=mbs,
        schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
        virtual_stages=vpp,
        dtype=dtype,  # type: ignore[arg-type]
        attention="flash" if mpt else "eager",
        loss="fused" if mpt else "vocab-parallel",
        dropout=not mpt,
        fp8=row["precision"] == "amp_fp8",
        stages=stages,
        batch_shares=(gb // dp,) * dp,
    )
    rt = runtime_of(row, family)
    return Case(row["run_id"], family, row["gpu"], model, cluster, plan, measured_step_s(row, family), rt)


def runtime_stack(case: Case) -> Case:
    """The case priced as if it ran meshplan's own runtime stack (SDPA, torch cross entropy, no
    dropout): what the memory terms of the row's real stack are worth (--stack runtime)."""
    plan = case.plan.model_copy(update={"attention": "sdpa", "loss": "torch", "dropout": False})
    return Case(case.run_id, case.family, case.gpu, case.model, case.cluster, plan, case.measured_s, case.runtime)


def with_runtime(case: Case, runtime: str) -> Case:
    """The case priced under another runtime's overlap (--runtime NAME; default: the row's framework)."""
    if runtime == "row":
        return case
    return Case(
        case.run_id, case.family, case.gpu, case.model, case.cluster, case.plan, case.measured_s, RUNTIMES[runtime]
    )


def load(path: Path, stack: str = "row", runtime: str = "row") -> tuple[list[Case], dict[str, list[str]]]:
    cases: list[Case] = []
    skipped: dict[str, list[str]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            try:
                case = build_case(row)
                cases.append(with_runtime(case if stack == "row" else runtime_stack(case), runtime))
            except (Unsupported, MeshplanError) as err:
                skipped.setdefault(str(err), []).append(row["run_id"])
    return cases, skipped


def price(cases: list[Case], kernels: KernelEfficiency | None = None) -> tuple[list[Result], dict[str, list[str]]]:
    out: list[Result] = []
    failed: dict[str, list[str]] = {}
    for c in cases:
        try:
            out.append(Result(c, estimate(c.plan, c.model, c.cluster, kernels=kernels, runtime=c.runtime)))
        except MeshplanError as err:
            failed.setdefault(f"estimate: {err}", []).append(c.run_id)
    return out, failed


def summary(results: list[Result]) -> dict[str, float]:
    errs = [r.error for r in results]
    absd = [abs(e) for e in errs]
    n = len(errs)
    return {
        "n": n,
        "median_abs_pct": 100 * statistics.median(absd),
        "mape_pct": 100 * statistics.fmean(absd),
        "bias_pct": 100 * statistics.fmean(errs),
        "within10_pct": 100 * sum(a <= 0.10 for a in absd) / n,
        "within20_pct": 100 * sum(a <= 0.20 for a in absd) / n,
        "ran_called_oom": sum(not r.cost.feasible for r in results),
        "max_peak_over_capacity": max(r.peak_over_capacity for r in results),
    }


def groups(results: list[Result]) -> dict[str, list[Result]]:
    out: dict[str, list[Result]] = {}
    for r in sorted(results, key=lambda r: (r.case.family, r.case.gpu)):
        out.setdefault(f"{r.case.family} / {r.case.gpu}", []).append(r)
        out.setdefault(f"{r.case.family} (all)", []).append(r)
    out["all"] = list(results)
    return out


def table(results: list[Result]) -> str:
    head = (
        f"{'group':34} {'n':>4} {'med|e|%':>8} {'MAPE%':>7} {'bias%':>7} {'≤10%':>6} {'≤20%':>6} {'OOM':>4}"
        f" {'pk/cap':>6}"
    )
    lines = [head, "-" * len(head)]
    for name, rs in groups(results).items():
        s = summary(rs)
        lines.append(
            f"{name:34} {s['n']:>4} {s['median_abs_pct']:>8.1f} {s['mape_pct']:>7.1f} {s['bias_pct']:>+7.1f} "
            f"{s['within10_pct']:>6.0f} {s['within20_pct']:>6.0f} {s['ran_called_oom']:>4}"
            f" {s['max_peak_over_capacity']:>6.2f}"
        )
    return "\n".join(lines)


def row_lines(results: list[Result]) -> str:
    lines = [f"{'run':58} {'measured s':>10} {'predicted':>10} {'err%':>7}  bottleneck"]
    for r in results:
        c = r.cost
        lines.append(
            f"{r.case.run_id:58} {r.case.measured_s:>10.3f} {c.step_time_s:>10.3f} {100 * r.error:>+7.1f}  "
            f"{c.bottleneck}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--rows", action="store_true", help="print every run's measured and predicted step")
    ap.add_argument("--json", type=Path, default=None, help="write per-run results here")
    ap.add_argument(
        "--stack",
        choices=("row", "runtime"),
        default="row",
        help="price each row's own framework stack (default) or meshplan's runtime stack",
    )
    ap.add_argument(
        "--runtime",
        choices=("row", *sorted(RUNTIMES)),
        default="row",
        help="price each row under its framework's overlap (default) or the named runtime's (planner.cost.overlap)",
    )
    args = ap.parse_args(argv)
    data = args.data or next((p for p in DEFAULT_DATA if p.exists()), None)
    if data is None or not data.exists():
        print(f"no published_dev.csv (looked in {', '.join(map(str, DEFAULT_DATA))}); pass --data", file=sys.stderr)
        return 2
    cases, skipped = load(data, args.stack, args.runtime)
    results, failed = price(cases)
    skipped.update(failed)
    print(f"{data}: {len(results)} runs priced, {sum(map(len, skipped.values()))} not expressible")
    print(f"compared: predicted step_time_s vs measured seconds per optimizer step; note: {ASSUMED}")
    print(
        f"runtime (overlap): {args.runtime}; stack: {args.stack}; pk/cap = the largest predicted peak memory / device memory of the group"
    )
    if DEFAULT_KERNELS != PRIOR:
        # never fit silently: the unfitted (sourced prior) figures first, then the fitted ones in use
        print(f"kernel efficiencies UNFITTED ({PRIOR.source}):")
        print(table(price(cases, PRIOR)[0]))
        print(f"kernel efficiencies FITTED, in use ({DEFAULT_KERNELS.source}):")
    print(table(results))
    for reason, ids in sorted(skipped.items()):
        print(f"not expressible ({len(ids)}): {reason}: {', '.join(ids)}")
    if args.rows:
        print(row_lines(results))
    if args.json:
        blob = [
            {"run_id": r.case.run_id, "measured_s": r.case.measured_s, **r.cost.model_dump(mode="json")}
            for r in results
        ]
        args.json.write_text(json.dumps(blob, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
