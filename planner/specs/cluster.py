"""Cluster specs: nodes of devices joined by links, from a TOML file or from discovery.

A node group (`[[nodes]]` with `count = N`) stands for N identical nodes. Each node has an
intra-node link (NVLink, PCIe, or loopback between CPU ranks) and an inter-node link. A LinkSpec's
bandwidth is per device and per direction (a rail-optimised fabric gives each GPU its own NIC); a
cluster file may instead give a node's total, `{kind = "roce", bandwidth_bytes_per_s = 200e9,
per = "node"}` (e.g. "1600 Gb/s per node"), which is divided over the node's devices when read, so
everything downstream sees per-device figures (`per = "device"` is the default and may be stated).
Link presets come from ../shared/data/interconnects.csv (datasheets, the IBTA roadmap,
stas00/ml-engineering); latencies are typical NCCL small-message figures, marked as such.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planner.errors import MeshplanError, UnknownNameError, closest
from planner.limits import (
    MAX_DEVICE_MEMORY_BYTES,
    MAX_FLOP_PER_S,
    MAX_LINK_BYTES_PER_S,
    MAX_MEMORY_BYTES_PER_S,
    MAX_OVER_CATALOG,
)
from planner.specs.catalog import GpuSpec, is_known, lookup
from planner.validation import parse, parse_toml

GB = 1e9


class LinkSpec(BaseModel):
    """One link class: bandwidth per device per direction, and the per-message latency (α)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    bandwidth_bytes_per_s: float = Field(gt=0, le=MAX_LINK_BYTES_PER_S)  # planner/limits.py: why
    latency_s: float = Field(default=10e-6, ge=0, le=1.0)
    measured: bool = False
    source: str = ""


def _link(kind: str, gbyte_per_s: float, latency_s: float, source: str) -> LinkSpec:
    return LinkSpec(kind=kind, bandwidth_bytes_per_s=gbyte_per_s * GB, latency_s=latency_s, source=source)


_MLE = "stas00/ml-engineering network/README.md"
_LAT = "latency: typical NCCL small-message figure"
LINK_PRESETS: dict[str, LinkSpec] = {
    link.kind: link
    for link in [
        _link("nvlink2", 150, 5e-6, f"{_MLE}; {_LAT}"),
        _link("nvlink3", 300, 5e-6, f"{_MLE}; {_LAT}"),
        _link("nvlink4", 450, 5e-6, f"{_MLE}; {_LAT}"),
        _link("nvlink5", 900, 5e-6, f"{_MLE}; {_LAT}"),
        _link("xgmi-mi250x", 350, 5e-6, f"{_MLE}; {_LAT}"),
        _link("xgmi-mi300x", 448, 5e-6, f"{_MLE}; {_LAT}"),
        _link("pcie3", 15.75, 10e-6, f"PCI-SIG spec arithmetic; {_LAT}"),
        _link("pcie4", 31.5, 10e-6, f"{_MLE}; {_LAT}"),
        _link("pcie5", 63, 10e-6, f"{_MLE}; {_LAT}"),
        _link("ib-edr", 12.5, 10e-6, f"{_MLE} (IBTA roadmap); {_LAT}"),
        _link("ib-hdr", 25, 10e-6, f"{_MLE} (IBTA roadmap); {_LAT}"),
        _link("ib-ndr", 50, 10e-6, f"{_MLE} (IBTA roadmap); {_LAT}"),
        _link("ib-xdr", 100, 10e-6, f"{_MLE} (IBTA roadmap); {_LAT}"),
        _link("eth-100g", 12.5, 20e-6, f"{_MLE}; {_LAT}"),
        _link("eth-200g", 25, 20e-6, f"{_MLE}; {_LAT}"),
        _link("eth-400g", 50, 20e-6, f"Llama 3 paper §3.3.1; {_LAT}"),
        _link("eth-800g", 100, 20e-6, f"{_MLE}; {_LAT}"),
        _link("efa-p5", 50, 20e-6, f"AWS p5: 3200 Gb/s per node = 400 GB/s / 8 GPUs; {_LAT}"),
        _link("eth-10g", 1.25, 50e-6, f"IEEE 802.3 line rate; {_LAT}"),
    ]
}


def _coerce_link(value: Any) -> Any:
    if isinstance(value, str):
        if value in LINK_PRESETS:
            return LINK_PRESETS[value]
        hint = ", ".join(closest(value, list(LINK_PRESETS)))
        raise UnknownNameError(
            "link",
            value,
            f"unknown link kind{'; did you mean ' + hint + '?' if hint else ''} "
            f"(presets: {', '.join(LINK_PRESETS)}; or a table {{kind, bandwidth_bytes_per_s, latency_s}})",
        )
    return value


class NodeSpec(BaseModel):
    """A group of `count` identical nodes, each with `num_devices` devices of one kind."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    device: str = Field(description="GPU catalog name, or 'cpu' for CPU ranks")
    num_devices: int = Field(gt=0, le=256)
    count: int = Field(default=1, gt=0, le=100_000)
    intra_link: LinkSpec
    inter_link: LinkSpec
    # bounds: planner/limits.py says why each
    device_memory_bytes: int | None = Field(
        default=None, gt=0, le=MAX_DEVICE_MEMORY_BYTES, description="overrides the catalog (required for cpu)"
    )
    device_peak_flop_per_s: float | None = Field(
        default=None, gt=0, le=MAX_FLOP_PER_S, description="overrides the catalog (required for cpu)"
    )
    device_memory_bandwidth_bytes_per_s: float | None = Field(
        default=None, gt=0, le=MAX_MEMORY_BYTES_PER_S, description="overrides the catalog"
    )
    device_peak_fp8_flop_per_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_FLOP_PER_S,
        description="dense fp8 peak (overrides the catalog; fp8 linears need one)",
    )
    measured: bool = Field(default=False, description="figures come from discovery, not a datasheet")

    @field_validator("intra_link", "inter_link", mode="before")
    @classmethod
    def _link_preset(cls, value: Any) -> Any:
        return _coerce_link(value)

    @model_validator(mode="before")
    @classmethod
    def _per_node_links(cls, data: Any) -> Any:
        """`per = "node"` in a link table: the node's total bandwidth, divided over its devices."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for field in ("intra_link", "inter_link"):
            link = out.get(field)
            if not isinstance(link, dict) or "per" not in link:
                continue
            link = dict(link)
            per = link.pop("per")
            if per not in ("device", "node"):
                raise MeshplanError(f"nodes.{data.get('name', '?')}.{field}.per", per, 'use "device" or "node"')
            n = data.get("num_devices")
            if per == "node" and isinstance(n, int) and n > 0 and "bandwidth_bytes_per_s" in link:
                link["bandwidth_bytes_per_s"] = float(link["bandwidth_bytes_per_s"]) / n
                link["source"] = (str(link.get("source", "")) + f" (given per node, / {n} devices)").strip()
            out[field] = link
        return out

    @model_validator(mode="after")
    def _check_device(self) -> NodeSpec:
        if self.device == "cpu":
            if self.device_memory_bytes is None or self.device_peak_flop_per_s is None:
                raise MeshplanError(
                    f"nodes.{self.name}.device",
                    "cpu",
                    "cpu nodes need device_memory_bytes and device_peak_flop_per_s (run `meshplan discover` to measure them)",
                )
        elif is_known(self.device):
            self._check_against_catalog(lookup(self.device))
        elif not is_known(self.device):
            # a device the catalog lacks, defined inline: its figures are required, never guessed
            inline = (self.device_memory_bytes, self.device_peak_flop_per_s, self.device_memory_bandwidth_bytes_per_s)
            if any(v is None for v in inline):
                try:
                    lookup(self.device)
                except UnknownNameError as err:
                    raise UnknownNameError(
                        err.field,
                        err.value,
                        f"{err.fix}; or define it inline with device_memory_bytes, device_peak_flop_per_s "
                        "(dense, training dtype) and device_memory_bandwidth_bytes_per_s",
                    ) from None
        return self

    def _check_against_catalog(self, gpu: GpuSpec) -> None:
        """An inline figure for a catalog GPU is a measurement of that part: at most MAX_OVER_CATALOG
        times its datasheet figure (1e15 bytes on an 80 GiB A100 is a typo, not a measurement)."""
        peak = max(gpu.peak_flop_per_s(d) for d in ("bf16", "fp16", "fp32"))
        for field, given, sheet in (
            ("device_memory_bytes", self.device_memory_bytes, gpu.memory_bytes),
            ("device_peak_flop_per_s", self.device_peak_flop_per_s, peak),
            ("device_memory_bandwidth_bytes_per_s", self.device_memory_bandwidth_bytes_per_s,
             gpu.memory_bandwidth_bytes_per_s),
            ("device_peak_fp8_flop_per_s", self.device_peak_fp8_flop_per_s, gpu.peak_fp8_flop_per_s or peak),
        ):  # fmt: skip
            if given is not None and given > MAX_OVER_CATALOG * sheet:
                raise MeshplanError(
                    f"nodes.{self.name}.{field}",
                    given,
                    f"more than {MAX_OVER_CATALOG:g}x the {gpu.name} datasheet's {sheet:.4g}; give the measured "
                    "figure of that part, or leave it out to use the catalog's",
                )

    @property
    def gpu(self) -> GpuSpec | None:
        """The catalog entry (None for CPU ranks and for devices defined inline in the cluster file)."""
        return None if self.device == "cpu" or not is_known(self.device) else lookup(self.device)

    @property
    def device_kind(self) -> str:
        gpu = self.gpu
        return self.device if gpu is None else gpu.name

    @property
    def memory_bytes(self) -> int:
        if self.device_memory_bytes is not None:
            return self.device_memory_bytes
        gpu = self.gpu
        assert gpu is not None
        return gpu.memory_bytes

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        if self.device_memory_bandwidth_bytes_per_s is not None:
            return self.device_memory_bandwidth_bytes_per_s
        gpu = self.gpu
        return 20e9 if gpu is None else gpu.memory_bandwidth_bytes_per_s  # cpu: one DDR4 channel pair

    def peak_flop_per_s(self, dtype: str = "bf16") -> float:
        if self.device_peak_flop_per_s is not None:
            return self.device_peak_flop_per_s
        gpu = self.gpu
        assert gpu is not None
        return gpu.peak_flop_per_s(dtype)

    @property
    def peak_fp8_flop_per_s(self) -> float | None:
        """Dense fp8 peak (None: no fp8 tensor cores, CPU ranks, or an inline device that gives none)."""
        if self.device_peak_fp8_flop_per_s is not None:
            return self.device_peak_fp8_flop_per_s
        gpu = self.gpu
        return None if gpu is None else gpu.peak_fp8_flop_per_s


@dataclass(frozen=True, slots=True)
class Device:
    """One device of an expanded cluster: global id, node index, local index, kind, node group."""

    id: int
    node: int
    local: int
    kind: str
    group: int


class ClusterSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    nodes: tuple[NodeSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> ClusterSpec:
        names = [n.name for n in self.nodes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise MeshplanError("nodes.name", dup[0], "node group names must be unique; rename one of them")
        return self

    @property
    def num_nodes(self) -> int:
        return sum(n.count for n in self.nodes)

    @property
    def num_devices(self) -> int:
        return sum(n.count * n.num_devices for n in self.nodes)

    def devices(self) -> list[Device]:
        """Every device, numbered node-major in file order (ids are what a Plan refers to)."""
        out: list[Device] = []
        node = 0
        for g, spec in enumerate(self.nodes):
            kind = spec.device_kind
            for _ in range(spec.count):
                base = len(out)
                out.extend(Device(base + i, node, i, kind, g) for i in range(spec.num_devices))
                node += 1
        return out

    def device_kinds(self) -> dict[str, int]:
        kinds: dict[str, int] = {}
        for n in self.nodes:
            kinds[n.device_kind] = kinds.get(n.device_kind, 0) + n.count * n.num_devices
        return kinds

    def fingerprint(self) -> str:
        blob = json.dumps(self.model_dump(exclude={"name"}, mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def parse_cluster(data: dict[str, Any], origin: str = "cluster") -> ClusterSpec:
    return parse(ClusterSpec, data, origin)


def parse_cluster_toml(text: str, origin: str = "cluster.toml") -> ClusterSpec:
    """A ClusterSpec from TOML text; any problem raises a MeshplanError naming the field and fix."""
    return parse_cluster(parse_toml(text, origin), origin)
