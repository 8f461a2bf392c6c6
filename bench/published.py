"""The GPU cost model against published measured runs: the runtime profiles on ../shared/data/published_dev.csv.

    .venv/bin/python bench/published.py [--data PATH] [--rows] [--json OUT] [--no-fit] [--runtime NAME]

Each CSV row becomes a ModelSpec, a ClusterSpec and a Plan, priced under its stack family's runtime
profile (planner.cost.runtimes) with no layer profiles. Five families, one runtime each:
- mpt (llm-foundry on Composer, FSDP1; bf16 and amp_fp8 as TE fp8 linears): `composer`;
- megatron-sc21 (Megatron-LM SC'21 Table 1): `megatron-sc21` (eager fused softmax, dropout, fp32 loss);
- nemo (DGX Cloud recipes v25.02.01, Megatron-Core + TE, tp/pp/cp/vpp, distributed optimizer = zero1,
  recompute not stated = none): `megatron`;
- torchtitan (2024-08 tables, FSDP2 = zero3, TP with sequence parallel, 'selective layer' = full
  recompute of every 2nd block, 'selective op' = selective): `torchtitan`;
- amp-deepspeed (AMP's 16 × T4 sweep, DeepSpeed + Megatron-LM v1.1.5, fp16, heads 16, layers split
  evenly, 50 Gb/s in a node as AMP's paper states it (G4DN_INTRA), 50 Gb/s per 4-GPU node at NCCL TCP
  sockets' achieved 0.376 of line rate, G4DN_INTER): `deepspeed-amp` (the deepspeed row with AMP's ds_config.json: fp32_allreduce, so
  gradients cross the network as fp32); its failed trials have no
  measured time and are scored only on whether the model calls them out of memory.
Links the sources do not state are assumed and printed (ASSUMED_LINKS).

The last table is the issue's: per family, MAPE / bias / runs-that-ran-called-OOM (failed-OOM-trials
not called OOM / failed trials) for the unfitted prior, the runtime figures fitted on all the
family's rows, leave-that-family-out (figures fitted on the other families), and 3-shot (figures
fitted on 3 rows of the family chosen by random.Random(SEED), scored on the rest); see family_tables.
The tables above it price with each runtime's derived kernel fractions (RuntimeProfile.kernels: the
sourced [[kernel]] rows of planner/specs/data/runtimes.toml, nothing fitted), and, for comparison,
with planner.cost.fitted's MPT-fitted fractions (a calibration, not a default).

What is compared: predicted `step_time_s` with the measured time of one optimizer step. MFU
definitions differ between the sources (MPT counts 3 passes of model FLOPs incl. attention, Megatron's
Eq. 3 counts the recompute forward), so the bench compares seconds, never MFU:
- MPT, torchtitan: global_batch × seq_len / tokens_per_sec; NeMo, AMP: the published iteration time;
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
import random
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from planner.cost.compute import KernelEfficiency  # noqa: E402
from planner.cost.fitted import FITTED  # noqa: E402
from planner.cost.runtimes import (  # noqa: E402
    COMPOSER_RT,
    MEGATRON_RT,
    MEGATRON_SC21_RT,
    MIN_RUNS_JOINT,
    PRIOR_FIGURES,
    REG,
    RUNTIME_NAMES,
    TORCHTITAN_RT,
    Figures,
    RuntimeProfile,
    fit_terms,
    price_under,
    profile_named,
    slots,
)
from planner.errors import MeshplanError  # noqa: E402
from planner.measure.runs_file import row_plan  # noqa: E402
from planner.specs.cluster import LINK_PRESETS, ClusterSpec, LinkSpec, NodeSpec  # noqa: E402
from planner.specs.model import ModelSpec  # noqa: E402
from planner.specs.plan import CostBreakdown, Plan  # noqa: E402

DEFAULT_DATA = [ROOT.parent / "shared/data/published_dev.csv", Path("/work/shared/data/published_dev.csv")]
INTRA = {"A100": "nvlink3", "H100": "nvlink4"}
SEED = 30  # the 3-shot rows of each family: random.Random(SEED).sample(family's measured rows, 3)


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
    measured_s: float | None  # None: a trial that failed out of memory
    profile: RuntimeProfile = COMPOSER_RT


@dataclass(frozen=True)
class Result:
    case: Case
    cost: CostBreakdown

    @property
    def error(self) -> float:
        assert self.case.measured_s is not None
        return self.cost.step_time_s / self.case.measured_s - 1.0

    @property
    def peak_over_capacity(self) -> float:
        return max(p / c for p, c in zip(self.cost.peak_memory_bytes, self.cost.memory_capacity_bytes, strict=True))


def family_of(row: dict[str, str]) -> str:
    """The row's stack family: mpt (llm-foundry/Composer, bf16 and fp8), megatron-sc21, nemo
    (NeMo/Megatron-Core DGX Cloud recipes), torchtitan, amp-deepspeed (AMP's T4 sweep)."""
    src = row["source"]
    if "Narayanan" in src:
        return "megatron-sc21"
    if "DGX Cloud" in src:
        return "nemo"
    if "torchtitan" in src:
        return "torchtitan"
    if "AMP" in src:
        return "amp-deepspeed"
    return "mpt"


FAMILY_PROFILE = {
    "mpt": COMPOSER_RT,
    "megatron-sc21": MEGATRON_SC21_RT,
    "nemo": MEGATRON_RT,
    "torchtitan": TORCHTITAN_RT,
    "amp-deepspeed": profile_named("deepspeed-amp"),  # deepspeed as AMP configured it: fp32 gradient all-reduce
}
# AMP's g4dn.12xlarge: 4 T4 on PCIe Gen3 (no NVLink), 50 Gb/s Ethernet per node shared by its 4 GPUs.
# No EFA and no GPUDirect RDMA on g4dn: NCCL runs its TCP socket transport, staging through host memory.
# What that transport achieves of an AWS ENA line rate: 4.7 GB/s all-reduce bus bandwidth on p3dn's
# 100 Gb/s (12.5 GB/s) ENA, 2 nodes × 8 V100 (NVIDIA/nccl issue #398, 2020), i.e. 0.376 of line rate
# (issue #209, 2019, same instances: iperf3 92 Gb/s, NCCL sockets 11–41 Gb/s by version). Assumed: the
# same fraction at 50 Gb/s. Not fitted; no AMP row was used.
TCP_SOCKET_EFFICIENCY = 4.7 / 12.5
G4DN_INTER = LinkSpec(
    kind="eth-50g/4-tcp",
    bandwidth_bytes_per_s=50e9 / 8 / 4 * TCP_SOCKET_EFFICIENCY,
    latency_s=50e-6,
    source="AWS g4dn.12xlarge 50 Gb/s per node / 4 GPUs × NCCL TCP socket efficiency 0.376 (NVIDIA/nccl#398)",
)
# Inside a g4dn.12xlarge the 4 T4 sit on PCIe Gen3 (15.75 GB/s line rate, NCCL's topology rates a P2P
# path through the host bridge at 10 GB/s) but talk at far less: AMP's paper states the cluster's
# "4 T4 GPUs with 50 Gbps PCIe connection intra-node bandwidth, and 50 Gbps inter-node bandwidth" (Li et
# al., NeurIPS'22, §5 hardware; AMP's own cost model prices intra = inter = 50 Gb/s,
# nips_scripts/amp_4_4_nips_homo_gpt2_no_placement.py cluster_info). Taken as the achieved bus bandwidth
# of the node's collectives and p2p (a kind NCCL's tuning table does not list: fraction 1, no P2P TLP
# factor), PCIe's 10 µs latency. Not fitted; the figure is the rows' own paper's.
G4DN_INTRA = LinkSpec(
    kind="g4dn-intra-50g",
    bandwidth_bytes_per_s=50e9 / 8,
    latency_s=10e-6,
    source="AMP (Li et al., NeurIPS'22) §5: g4dn.12xlarge, 50 Gbps PCIe intra-node bandwidth",
)
# A T4 with ECC on (AWS's default) reports 15,109 MiB in nvidia-smi on a g4dn.12xlarge, not the
# datasheet's 16 GiB (ray-project/ray#15495, nvidia-smi output of that instance): the capacity of AMP's rows.
T4_ECC_MEMORY_BYTES = 15109 * 2**20
ASSUMED_LINKS = (
    "MPT H100 sections and torchtitan state no fabric: DGX H100's 8 × 400 Gb/s NDR per node (MPT H100), "
    "Selene-like 8 × HDR (torchtitan A100), 8 × 400G RoCE (torchtitan Grand Teton) assumed; AMP rows: heads "
    "= 16 (GPT-2 medium) and layers split evenly (AMP's uneven partitions are over its own 30 layers)"
)


def _int(row: dict[str, str], key: str) -> int:
    return int(float(row[key]))


def inter_link(row: dict[str, str], family: str) -> LinkSpec:
    """One GPU's share of the node's NICs."""
    if family == "amp-deepspeed":
        return G4DN_INTER
    if family == "megatron-sc21":
        return LINK_PRESETS["ib-hdr"]  # Selene: 8 × HDR 200 Gb/s per DGX A100
    if "1600 Gbps" in row["interconnect"]:
        return LINK_PRESETS["eth-200g"]  # 1600 Gb/s per node over 8 GPUs = 200 Gb/s = 25 GB/s each
    if family == "torchtitan":
        return LINK_PRESETS["ib-hdr" if row["gpu"].startswith("A100") else "eth-400g"]
    if row["gpu"].startswith("H100"):
        return LINK_PRESETS["ib-ndr"]  # see ASSUMED_LINKS
    raise Unsupported(f"unknown interconnect {row['interconnect']!r}")


def dtype_of(precision: str) -> str:
    """The working dtype; fp8 rows are bf16 with fp8 linears (Plan.fp8, build_case)."""
    if precision.startswith("fp16"):
        return "fp16"
    if precision in ("amp_bf16", "bf16", "amp_fp8", "fp8", "bf16+float8 linears"):
        return "bf16"
    raise Unsupported(f"precision {precision!r}")


def sharding_of(row: dict[str, str]) -> str:
    s = row["sharding"]
    if not s:
        return "none"
    if s in ("FSDP FULL_SHARD", "FSDP2"):
        return "zero3"
    if s == "FSDP SHARD_GRAD_OP":
        return "zero2"
    if s.startswith("distributed optimizer"):
        return "zero1"
    raise Unsupported(f"sharding {s!r}")


def recompute_of(row: dict[str, str]) -> tuple[str, int]:
    """(recompute, recompute_every): torchtitan's 'selective layer' is its layer AC at frequency 2."""
    r = row["recompute"]
    if r.startswith("full"):
        return "full", 1
    if r in ("none", ""):
        return "none", 1  # not stated (NeMo recipes, AMP): none, and the OOM column checks it
    if r == "selective op":
        return "selective", 1
    if r == "selective layer":
        return "full", 2
    raise Unsupported(f"recompute {r!r}")


def measured_step_s(row: dict[str, str], family: str) -> float | None:
    """Seconds per optimizer step; None for AMP's failed (out-of-memory) trials."""
    if row.get("measurement_kind") == "failed real trial":
        return None
    if row.get("iteration_time_s"):
        return float(row["iteration_time_s"])
    if row.get("tokens_per_sec"):
        return _int(row, "global_batch") * _int(row, "seq_len") / float(row["tokens_per_sec"])
    return float(row["derived_iteration_time_s"])


def build_case(row: dict[str, str]) -> Case:
    """The row as (model, cluster, plan); Unsupported names what cannot be expressed."""
    family = family_of(row)
    if row.get("heterogeneous", "no") != "no":
        raise Unsupported("heterogeneous cluster")
    profile = FAMILY_PROFILE[family]
    dtype = dtype_of(row["precision"])
    llama = family in ("nemo", "torchtitan")
    kv = row.get("kv_heads")
    hidden = _int(row, "hidden")
    model = ModelSpec(
        name=row["model_name"],
        family="llama" if llama else "gpt",
        num_layers=_int(row, "layers"),
        hidden=hidden,
        num_heads=_int(row, "heads") if row.get("heads") else 16,
        num_kv_heads=int(kv) if kv else None,
        ffn_hidden=_int(row, "ffn_hidden") if row.get("ffn_hidden") else 4 * hidden,
        vocab_size=_int(row, "vocab"),
        seq_len=_int(row, "seq_len"),
        tie_embeddings=not llama,
        learned_positions=family in ("megatron-sc21", "amp-deepspeed"),
    )
    gpus, per_node = _int(row, "num_gpus"), _int(row, "gpus_per_node")
    if gpus % per_node:
        raise Unsupported(f"{gpus} GPUs are not whole nodes of {per_node}")
    gpu = row["gpu"].split(" (")[0]
    arch = gpu[:4]
    node = NodeSpec(
        name="n",
        device=gpu,
        num_devices=per_node,
        count=gpus // per_node,
        intra_link=G4DN_INTRA if gpu == "T4" else LINK_PRESETS[INTRA[arch]],
        inter_link=inter_link(row, family),
        device_memory_bytes=T4_ECC_MEMORY_BYTES if gpu == "T4" else None,
    )
    fp8 = "fp8" in row["precision"] or "float8" in row["precision"]
    if fp8 and node.peak_fp8_flop_per_s is None and node.gpu is not None and node.gpu.architecture == "Hopper":
        # the catalog has no fp8 figure for Meta's H100 variant: Hopper's dense fp8 peak is twice its bf16
        node = node.model_copy(update={"device_peak_fp8_flop_per_s": 2 * node.peak_flop_per_s("bf16")})
    cluster = ClusterSpec(name=row["run_id"], nodes=(node,))
    tp, pp, dp = _int(row, "tp"), _int(row, "pp"), _int(row, "dp")
    cp = _int(row, "cp") if row.get("cp") else 1
    if tp * pp * dp * cp != gpus:
        raise Unsupported(f"tp×cp×pp×dp = {tp * pp * dp * cp} != {gpus} GPUs")
    vpp = _int(row, "vpp") if row.get("vpp") else 1
    nst = pp * vpp
    layers = model.num_layers
    if layers < nst:
        raise Unsupported(f"{nst} stages for {layers} layers")
    (rec, every), shard = recompute_of(row), sharding_of(row)
    gb, mbs = _int(row, "global_batch"), _int(row, "micro_batch")
    if gb % (dp * mbs):
        raise Unsupported(f"global batch {gb} is not a multiple of dp × micro-batch = {dp * mbs}")
    plan = row_plan(
        model, cluster.name, tp=tp, pp=pp, dp=dp, cp=cp, vpp=vpp, global_batch=gb, micro_batch=mbs,
        recompute=rec, sharding=shard, dtype=dtype, fp8=fp8, recompute_every=every,
        sequence_parallel=profile.sequence_parallel, attention=profile.attention, loss=profile.loss,
        dropout=profile.dropout,
    )  # fmt: skip
    return Case(row["run_id"], family, gpu, model, cluster, plan, measured_step_s(row, family), profile)


def runtime_stack(case: Case) -> Case:
    """The case priced as if it ran meshplan's own runtime stack (SDPA, torch cross entropy, no
    dropout): what the memory terms of the row's real stack are worth (--stack runtime)."""
    plan = case.plan.model_copy(update={"attention": "sdpa", "loss": "torch", "dropout": False})
    return replace(case, plan=plan)


def with_runtime(case: Case, runtime: str) -> Case:
    """The case priced under another runtime (--runtime NAME; default: the row's framework)."""
    if runtime == "row":
        return case
    return replace(case, profile=profile_named(runtime))


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


def price(
    cases: list[Case], figures: Figures | dict[str, Figures] = PRIOR_FIGURES, kernels: KernelEfficiency | None = None
) -> tuple[list[Result], dict[str, list[str]]]:
    """Every case priced under its runtime profile with `figures` (one set, or one per family)."""
    out: list[Result] = []
    failed: dict[str, list[str]] = {}
    for c in cases:
        fig = figures.get(c.family, PRIOR_FIGURES) if isinstance(figures, dict) else figures
        try:
            cost = price_under(c.plan, c.model, c.cluster, c.profile, fig, restack=False, kernels=kernels)
            out.append(Result(c, cost))
        except MeshplanError as err:
            failed.setdefault(f"estimate: {err}", []).append(c.run_id)
    return out, failed


def fit(cases: list[Case], kernels: KernelEfficiency | None = None, label: str = "") -> Figures:
    """(kernel_scale, microbatch_s) fitted on the measured cases (planner.cost.runtimes.fit_figures)."""
    ran = [c for c in cases if c.measured_s is not None]

    def rows(scale: float) -> list[tuple[float, int, float]]:
        rs, _ = price(ran, Figures(scale, 0.0), kernels)
        return [(r.cost.step_time_s, slots(r.case.plan), r.case.measured_s) for r in rs]  # type: ignore[misc]

    # as `meshplan calibrate` fits: kernel_scale and the per-micro-batch cost jointly from 3 runs,
    # regularised toward the runtimes' priors (planner.cost.runtimes.fit_terms)
    prior_mb = statistics.median(c.profile.microbatch_s for c in ran)
    scale, mb, _ = fit_terms(rows, fit_microbatch=len(ran) >= MIN_RUNS_JOINT, prior=(prior_mb, 0.0), reg=REG)
    return Figures(scale, mb, len(ran), f"fitted on {len(ran)} rows{': ' + label if label else ''}")


def summary(results: list[Result]) -> dict[str, float]:
    ran = [r for r in results if r.case.measured_s is not None]
    errs = [r.error for r in ran]
    absd = [abs(e) for e in errs]
    n = len(errs)
    failed = [r for r in results if r.case.measured_s is None]
    return {
        "n": n,
        "median_abs_pct": 100 * statistics.median(absd) if n else float("nan"),
        "mape_pct": 100 * statistics.fmean(absd) if n else float("nan"),
        "bias_pct": 100 * statistics.fmean(errs) if n else float("nan"),
        "within10_pct": 100 * sum(a <= 0.10 for a in absd) / n if n else float("nan"),
        "ran_called_oom": sum(not r.cost.feasible for r in ran),
        "failed": len(failed),
        "failed_not_called_oom": sum(r.cost.feasible for r in failed),
        "failed_called_oom": sum(not r.cost.feasible for r in failed),
        "max_peak_over_capacity": max((r.peak_over_capacity for r in ran), default=0.0),
    }


def three_shot(cases: list[Case]) -> tuple[list[Case], list[Case]]:
    """(3 measured rows chosen by SEED, the rest) of one family."""
    ran = sorted((c for c in cases if c.measured_s is not None), key=lambda c: c.run_id)
    pick = {c.run_id for c in random.Random(SEED).sample(ran, min(3, len(ran)))}
    return [c for c in ran if c.run_id in pick], [c for c in cases if c.run_id not in pick]


def family_tables(cases: list[Case], kernels: KernelEfficiency | None = None) -> tuple[str, dict]:
    """Per family, four columns, all on the derived, unfitted kernels (each runtime's own:
    RuntimeProfile.kernels, the [[kernel]] rows of data/runtimes.toml; or `kernels`) so that only the
    runtime figures (planner.cost.runtimes.Figures) are fitted:
    - prior: no figures fitted;
    - fit all: the family's runtime figures fitted on all its development rows (in-sample: the ceiling);
    - leave-family-out: kernel_scale fitted on every other family's rows (what a runtime with no
      measured run of its own gets from the others), the per-micro-batch cost the family's own
      runtime prior (a stack's fixed cost does not travel to another stack);
    - 3-shot: kernel_scale and the per-micro-batch cost fitted jointly (regularised toward the
      priors) on 3 of the family's rows (random.Random(SEED)), scored on the rest (what `meshplan
      calibrate` fits from 3 runs; calibrate also refuses a fit whose leave-one-out error does not
      beat the prior's, which this column does not)."""
    fams = sorted({c.family for c in cases})
    ksrc = kernels.source if kernels is not None else "derived per runtime (RuntimeProfile.kernels, data/runtimes.toml)"
    blob: dict = {"kernels": ksrc, "seed": SEED, "families": {}}
    lines = [
        f"runtime figures per family; kernels {ksrc}",
        "cell = MAPE% / bias% / ran-called-OOM / failed-OOM-trials-called-OOM of failed trials",
    ]
    head = f"{'family':15} {'n':>4} {'prior':>27} {'fit all':>27} {'leave-family-out':>27} {'3-shot':>27}"
    lines += [head, "-" * len(head)]
    for fam in fams:
        mine = [c for c in cases if c.family == fam]
        others = [c for c in cases if c.family != fam]
        own = fit(mine, kernels, f"all {fam} rows")
        # what travels from other stacks is the kernel efficiency; a fixed cost per micro-batch
        # belongs to a stack (its scheduling, p2p handshakes, Python), so the family keeps its own
        # runtime's prior for it (Figures.microbatch_s = None), as `meshplan calibrate` keys figures
        # per (device kind, runtime)
        fitted = fit(others, kernels, f"all but {fam}")
        lofo = Figures(
            fitted.kernel_scale, None, fitted.runs, f"{fitted.source}; per-micro-batch cost: {fam}'s runtime prior"
        )
        shots, rest = three_shot(mine)
        shot_fig = fit(shots, kernels, f"3 {fam} rows {[c.run_id for c in shots]}")
        cols = {
            "prior": price(mine, PRIOR_FIGURES, kernels)[0],
            "fit_all": price(mine, own, kernels)[0],
            "leave_family_out": price(mine, lofo, kernels)[0],
            "three_shot": price(rest, shot_fig, kernels)[0],
        }
        sums = {k: summary(v) for k, v in cols.items()}
        cells = [
            f"{s['mape_pct']:6.1f} /{s['bias_pct']:+6.1f} / {s['ran_called_oom']:>2} / {s['failed_called_oom']} of {s['failed']}"
            for s in sums.values()
        ]
        n = sum(c.measured_s is not None for c in mine)
        lines.append(f"{fam:15} {n:>4} " + " ".join(f"{c:>27}" for c in cells))
        blob["families"][fam] = {
            "summaries": sums,
            "figures": {"fit_all": repr(own), "leave_family_out": repr(lofo), "three_shot": repr(shot_fig)},
            "three_shot_rows": [c.run_id for c in shots],
        }
    for fam, b in blob["families"].items():
        lines.append(f"  {fam}: {b['figures']}")
    return "\n".join(lines), blob


def groups(results: list[Result]) -> dict[str, list[Result]]:
    out: dict[str, list[Result]] = {}
    for r in sorted(results, key=lambda r: (r.case.family, r.case.gpu)):
        out.setdefault(f"{r.case.family} / {r.case.gpu}", []).append(r)
        out.setdefault(f"{r.case.family} (all)", []).append(r)
    out["all"] = list(results)
    return out


def table(results: list[Result]) -> str:
    head = f"{'group':40} {'n':>4} {'med|e|%':>8} {'MAPE%':>7} {'bias%':>7} {'≤10%':>6} {'OOM':>4} {'fail':>5} {'pk/cap':>6}"
    lines = [head, "-" * len(head)]
    for name, rs in groups(results).items():
        s = summary(rs)
        lines.append(
            f"{name:40} {s['n']:>4} {s['median_abs_pct']:>8.1f} {s['mape_pct']:>7.1f} {s['bias_pct']:>+7.1f} "
            f"{s['within10_pct']:>6.0f} {s['ran_called_oom']:>4} {s['failed_not_called_oom']:>2}/{s['failed']:<2}"
            f" {s['max_peak_over_capacity']:>6.2f}"
        )
    return "\n".join(lines)


def row_lines(results: list[Result]) -> str:
    """Per run: measured and predicted step, error, the worst stage's peak memory against its device's
    capacity (GiB), and the bottleneck."""
    lines = [f"{'run':58} {'measured s':>10} {'predicted':>10} {'err%':>7} {'peak/cap GiB':>13}  bottleneck"]
    for r in results:
        c = r.cost
        m = r.case.measured_s
        err = f"{100 * r.error:>+7.1f}" if m is not None else "   fail"
        j = max(range(len(c.peak_memory_bytes)), key=lambda k: c.peak_memory_bytes[k] / c.memory_capacity_bytes[k])
        mem = f"{c.peak_memory_bytes[j] / 2**30:.2f}/{c.memory_capacity_bytes[j] / 2**30:.2f}"
        lines.append(
            f"{r.case.run_id:58} {m or float('nan'):>10.3f} {c.step_time_s:>10.3f} {err} {mem:>13}  "
            f"{c.bottleneck}{'' if c.feasible else ' (OOM)'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--rows", action="store_true", help="print every run's measured and predicted step")
    ap.add_argument("--json", type=Path, default=None, help="write the family table's figures and summaries here")
    ap.add_argument("--no-fit", action="store_true", help="the prior table only (no fitting: fast)")
    ap.add_argument(
        "--stack",
        choices=("row", "runtime"),
        default="row",
        help="price each row's own framework stack (default) or meshplan's runtime stack",
    )
    ap.add_argument(
        "--runtime",
        choices=("row", *RUNTIME_NAMES),
        default="row",
        help="price each row under its framework's runtime profile (default) or the named one (planner.cost.runtimes)",
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
    print(f"compared: predicted step_time_s vs measured seconds per optimizer step; note: {ASSUMED_LINKS}")
    print(
        f"runtime: {args.runtime} (row = each family's profile); stack: {args.stack}; kernels: derived per runtime"
        " (RuntimeProfile.kernels: the [[kernel]] rows of data/runtimes.toml, nothing fitted)"
    )
    print(table(results))
    print(f"for comparison, a calibration: kernel efficiencies FITTED on MPT rows ({FITTED.source}):")
    print(table(price(cases, PRIOR_FIGURES, FITTED)[0]))
    for reason, ids in sorted(skipped.items()):
        print(f"not expressible ({len(ids)}): {reason}: {', '.join(ids)}")
    if args.rows:
        print(row_lines(results))
    if not args.no_fit:
        text, blob = family_tables(cases)
        print(text)
        if args.json:
            args.json.write_text(json.dumps(blob, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
