"""Collectives as NCCL runs them: its own tuning model picks the algorithm and protocol by message size.

NCCL does not run one α–β line per link. For every collective it predicts, per (algorithm, protocol),
    t = latency + bytes / algorithm bandwidth
and runs the fastest (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel / ncclTopoGetAlgoTime).
The figures are planner/specs/data/nccl.toml (read and validated once, at import), each with its
source; this module is the arithmetic:

- Algorithms: Ring (all-reduce, all-gather, reduce-scatter) and Tree (all-reduce only). NVLS
  (NVLink SHARP) and CollNet need switch support the catalog does not state: not priced.
- Protocols: LL (8-byte lines, 4 of them data: ¼ of the bus bandwidth for all-reduce or across nodes,
  ⅓ otherwise, capped by llMaxBws: by GPU in a node, by CPU across nodes), LL128 (0.92, or 0.7 with one rank per node; enabled by NCCL only with NVLink inside
  the node on Volta, Ampere or Hopper) and Simple (the whole bus bandwidth, the highest latency).
- Bus bandwidth: the ring's (cost.devices.Link.nccl_bandwidth_bytes_per_s: each link at NCCL's rated
  fraction of its line rate, topo.h, k NIC shares for k ranks per node). Algorithm bandwidth = bus
  bandwidth × n / nsteps for the ring (nsteps = 2(n − 1) all-reduce, n − 1 gather/scatter), × 0.92
  × ½ for the tree (× 1/3.8 LL, × 7/9 or 120/128 LL128), tree bandwidth corrected by message size.
- Latency (µs): base[algorithm][protocol] + per step hwLat[hop kind][algorithm][protocol]; a ring
  of n ranks on N nodes takes nsteps − nInterSteps intra-node steps (each at least the network
  overhead once it spans nodes: 1 µs, × 3 for Simple) and nInterSteps = 2N (all-reduce) or N − 1
  network steps; the tree 2((n/N − 1)·intra + log₂N·net). A multi-node Ring/Simple all-reduce's
  latency × 1.4 (× 1.9 before Ampere), NCCL's "plateau effect of ring".

Approximations, stated: NCCL's per-channel caps (llMaxBws, perChMaxTreeBws, …) are not applied (the
channel count is the topology search's); the plateau applies to every message ≥ 64 B per rank; the
network adds no latency beyond hwLat (NCCL's IB and socket transports report 0).
CPU ranks run gloo, not NCCL: cost.stage keeps the α–β ring formulas there (formulas.py).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from planner.measure.ops import COLLECTIVE_OPS, BenchOp

if TYPE_CHECKING:
    from planner.cost.devices import Link

FILE = "data/nccl.toml"
ALGORITHMS = ("ring", "tree")
PROTOCOLS = ("ll", "ll128", "simple")
HOPS = ("nvlink", "pci", "net")
OPS = COLLECTIVE_OPS
# GPUs NCCL enables LL128 on by default (tuning.cc: compute capability 7.0, 8.0, 9.0 with NVLink)
LL128_ARCHS = ("Volta", "Ampere", "Hopper")
PRE_AMPERE = ("Pascal", "Volta", "Turing")


def _figures(doc: dict[str, Any], table: str) -> dict[str, Any]:
    rows = doc.get(table)
    if not isinstance(rows, dict):
        raise ValueError(f"{FILE}: needs a [{table}] table")
    out: dict[str, Any] = {}
    for key, value in rows.items():
        if key.endswith("_source"):
            if key[: -len("_source")] not in rows:
                raise ValueError(f"{FILE} [{table}]: {key} names no figure")
            continue
        src = rows.get(f"{key}_source")
        if not isinstance(src, str) or not src.strip():
            raise ValueError(f"{FILE} [{table}] {key}: needs a {key}_source string")
        out[key] = value
    return out


def _number(table: str, key: str, v: Any, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise ValueError(f"{FILE} [{table}] {key} = {v!r}, want a number in [{lo:g}, {hi:g}]")
    return float(v)


@dataclass(frozen=True)
class Tuning:
    """NCCL's tuning figures (data/nccl.toml), validated."""

    latency_us: dict[str, float]
    bandwidth: dict[str, float]
    ll_max_gbps: dict[str, float]
    tree_correction: dict[str, tuple[float, ...]]
    link_fraction: dict[str, float]

    def lat(self, key: str) -> float:
        return self.latency_us[key]


def parse_tuning(text: str) -> Tuning:
    """The figures of `text` (nccl.toml); ValueError naming the table and key of the first bad one."""
    doc = tomllib.loads(text)
    lat = {k: _number("latency", k, v, 0.0, 1000.0) for k, v in _figures(doc, "latency").items()}
    want = {f"{a}_{p}" for a in ALGORITHMS for p in PROTOCOLS}
    want |= {f"{h}_{a}_{p}" for h in HOPS for a in ALGORITHMS for p in PROTOCOLS}
    want |= {"net_overhead", "ring_plateau", "ring_plateau_pre_ampere"}
    bw = {k: _number("bandwidth", k, v, 0.0, 1.0) for k, v in _figures(doc, "bandwidth").items()}
    bw_want = {
        "ring_ll", "ring_ll_single_node", "ring_ll128", "ring_ll128_one_per_node", "tree", "tree_ll",
        "tree_ll128_single_node", "tree_ll128", "tree_ratio",
    }  # fmt: skip
    for table, have, need in (("latency", lat, want), ("bandwidth", bw, bw_want)):
        missing, extra = sorted(need - have.keys()), sorted(have.keys() - need)
        if missing or extra:
            raise ValueError(f"{FILE} [{table}]: missing {missing or 'nothing'}, unknown {extra or 'nothing'}")
    llmax = {k: _number("ll_max_gbps", k, v, 0.1, 10000.0) for k, v in _figures(doc, "ll_max_gbps").items()}
    if set(llmax) != {"volta", "ampere", "hopper", "two_nodes", "more_nodes"}:
        raise ValueError(f"{FILE} [ll_max_gbps]: want volta, ampere, hopper, two_nodes, more_nodes")
    corr: dict[str, tuple[float, ...]] = {}
    for p, v in _figures(doc, "tree_correction").items():
        if p not in PROTOCOLS or not isinstance(v, list) or len(v) != 23:
            raise ValueError(f"{FILE} [tree_correction] {p}: want one list of 23 factors per protocol {PROTOCOLS}")
        corr[p] = tuple(_number("tree_correction", p, x, 0.01, 1.0) for x in v)
    if set(corr) != set(PROTOCOLS):
        raise ValueError(f"{FILE} [tree_correction]: want {', '.join(PROTOCOLS)}")
    links = {k: _number("link", k, v, 0.01, 1.0) for k, v in _figures(doc, "link").items()}
    if "pcie_p2p_through_cpu" not in links:
        raise ValueError(f"{FILE} [link]: missing pcie_p2p_through_cpu")
    return Tuning(lat, bw, llmax, corr, links)


TUNING = parse_tuning(resources.files("planner.specs").joinpath(FILE).read_text(encoding="utf-8"))


def link_fraction(kind: str) -> float:
    """NCCL's rated share of a link kind's line rate (topo.h); 1 for kinds not listed (taken as an
    achieved bus bandwidth already, e.g. a measured or a TCP-derated link)."""
    return TUNING.link_fraction.get(kind, 1.0)


def pcie_p2p_fraction() -> float:
    """What a PCIe P2P path through an Intel host bridge keeps (INTEL_P2P_OVERHEAD: 5/6)."""
    return TUNING.link_fraction["pcie_p2p_through_cpu"]


@dataclass(frozen=True, slots=True)
class Choice:
    """NCCL's pick for one collective: algorithm, protocol, latency (s) and algorithm bandwidth (B/s)."""

    algorithm: str
    protocol: str
    latency_s: float
    algbw_bytes_per_s: float

    def time_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.algbw_bytes_per_s


def ll_max_bytes_per_s(link: Link) -> float:
    """LL's cap on the bus bandwidth (llMaxBws): by GPU inside a node, by CPU (Intel) across nodes."""
    m, nodes = TUNING.ll_max_gbps, max(1, link.num_nodes)
    if nodes == 2:
        return m["two_nodes"] * 1e9
    if nodes > 2:
        return m["more_nodes"] * 1e9
    return (
        m["hopper" if link.arch in ("Hopper", "Blackwell") else "ampere" if link.arch in ("Ampere", "Ada") else "volta"]
        * 1e9
    )


def _enabled(algo: str, proto: str, op: str, link: Link) -> bool:
    if algo == "tree" and op != BenchOp.ALL_REDUCE:
        return False
    if proto == "ll128":
        return link.intra_hw == "nvlink" and link.arch in LL128_ARCHS
    return True


def _candidate(op: str, algo: str, proto: str, nbytes: float, n: int, link: Link) -> Choice:
    """NCCL's (latency, algorithm bandwidth) of one (algorithm, protocol) for `op` over n ranks."""
    t, b = TUNING, TUNING.bandwidth
    nodes = max(1, link.num_nodes)
    ppn = n / nodes
    bus = link.nccl_bandwidth_bytes_per_s or link.bandwidth_bytes_per_s
    if algo == "ring":
        if proto == "ll":
            bus *= b["ring_ll"] if nodes > 1 or op == BenchOp.ALL_REDUCE else b["ring_ll_single_node"]
            bus = min(bus, ll_max_bytes_per_s(link))
        elif proto == "ll128":
            bus *= b["ring_ll128_one_per_node"] if ppn < 2 else b["ring_ll128"]
        nsteps = 2 * (n - 1) if op == BenchOp.ALL_REDUCE else n - 1
        inter_steps = (2 * nodes if nodes > 1 else 0) if op == BenchOp.ALL_REDUCE else nodes - 1
        algbw = bus * n / nsteps
    else:
        bus *= b["tree"]
        if proto == "ll":
            bus = min(bus * b["tree_ll"], ll_max_bytes_per_s(link))
        elif proto == "ll128":
            bus *= b["tree_ll128_single_node"] if nodes == 1 else b["tree_ll128"]
        algbw = bus * b["tree_ratio"]
        log_size = int(math.log2(max(1.0, nbytes / 64)))
        if log_size < 23:
            algbw *= t.tree_correction[proto][log_size]
    intra_hw = link.intra_hw if link.intra_hw in ("nvlink", "pci") else "pci"
    intra = t.lat(f"{intra_hw}_{algo}_{proto}")
    net = t.lat(f"net_{algo}_{proto}")
    lat = t.lat(f"{algo}_{proto}")
    if algo == "ring":
        if nodes > 1:
            overhead = t.lat("net_overhead") * (3 if proto == "simple" else 1)
            intra = max(intra, overhead)
        lat += (nsteps - inter_steps) * intra + inter_steps * net
        if proto == "simple" and nodes > 1 and op == BenchOp.ALL_REDUCE and nbytes / n >= 64:
            lat *= t.lat("ring_plateau_pre_ampere") if link.arch in PRE_AMPERE else t.lat("ring_plateau")
    else:
        lat += 2 * ((n // nodes - 1) * intra + int(math.log2(nodes)) * net)
    return Choice(algo, proto, lat * 1e-6, algbw)


def choose(op: str, nbytes: float, n: int, link: Link) -> Choice:
    """NCCL's choice for `op` ("all_reduce", "all_gather", "reduce_scatter") of `nbytes` (the whole
    buffer: all-gather's output, reduce-scatter's input) over n ranks on `link` (a ring's Link:
    num_nodes, intra_hw, arch and its NCCL-rated bus bandwidth): the lowest predicted time."""
    key = (op, nbytes, n, link)
    out = _CHOICES.get(key)
    if out is not None:
        return out
    if op not in OPS:
        raise ValueError(f"collective {op!r}: one of {', '.join(OPS)}")
    cands = [_candidate(op, a, p, nbytes, n, link) for a in ALGORITHMS for p in PROTOCOLS if _enabled(a, p, op, link)]
    out = min(cands, key=lambda c: c.time_s(nbytes))
    if len(_CHOICES) >= _CHOICES_MAX:
        _CHOICES.clear()
    _CHOICES[key] = out
    return out


# choose's answers, memoised: a pure function of its arguments (Link is a frozen value and TUNING a
# module constant), asked ~8,000 times a search for a few hundred distinct rings and messages
# (every stage context of every dp, sharding and ring prices three collectives); bounded by clearing
_CHOICES: dict[tuple, Choice] = {}
_CHOICES_MAX = 65536


def collective_s(op: str, nbytes: float, n: int, link: Link) -> float:
    """Seconds of `op` over n ranks as NCCL picks it (0 for one rank or no bytes)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return choose(op, nbytes, n, link).time_s(nbytes)


def uses_nccl(link: Link) -> bool:
    """A ring NCCL runs: GPU ranks (a Link built for GPUs names its intra-node hop kind); CPU ranks
    run gloo and keep the α–β formulas."""
    return link.intra_hw in ("nvlink", "pci")
