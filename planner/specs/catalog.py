"""GPU catalog: datasheet figures per accelerator, keyed by exact device name, each with its source.

The figures live in data/gpus.toml (named columns, units in the names, a source per figure), read and
validated once at import. `GpuSpec` holds them in SI units: bytes, bytes/s, FLOP/s; dense (no sparsity)
peaks, bandwidths per direction. `lookup()` also accepts the names torch reports
(`torch.cuda.get_device_name()`, e.g. "NVIDIA A100-SXM4-80GB") through `ALIASES`.
"""

from __future__ import annotations

import tomllib
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.errors import UnknownNameError, closest

GB = 1e9
GIB = 2**30
TFLOP = 1e12


class GpuSpec(BaseModel):
    """One accelerator's datasheet figures. `None` means the vendor publishes no such number."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    vendor: str
    architecture: str
    memory_bytes: int = Field(gt=0)
    memory_bandwidth_bytes_per_s: float = Field(gt=0)
    peak_bf16_flop_per_s: float | None = Field(default=None, gt=0)
    peak_fp16_flop_per_s: float = Field(gt=0)
    peak_fp32_flop_per_s: float = Field(gt=0)
    fabric_bytes_per_s: float | None = Field(default=None, gt=0, description="NVLink/XGMI per GPU, per direction")
    fabric: str | None = None
    pcie_gen: int = Field(ge=3, le=6)
    source: str
    source_url: str
    estimated: bool = Field(default=False, description="a figure is not published and was inferred (see notes)")
    notes: str = ""
    num_sms: int | None = Field(default=None, gt=0, description="streaming multiprocessors (GEMM wave quantisation)")
    peak_fp8_flop_per_s: float | None = Field(
        default=None, gt=0, description="dense fp8 tensor-core peak (None: the part has no fp8 tensor cores)"
    )
    sustained_gemm_flop_per_s: float | None = Field(
        default=None,
        gt=0,
        description="measured fp16/bf16 rate of one large cuBLAS GEMM run back to back, where the board's "
        "power cap holds the clock well below boost (None: not power-limited at the datasheet peak)",
    )

    def peak_flop_per_s(self, dtype: str = "bf16") -> float:
        """Dense peak for a training dtype; bf16 falls back to fp16 on parts without bf16 (V100, T4)."""
        if dtype == "fp32":
            return self.peak_fp32_flop_per_s
        if dtype == "bf16" and self.peak_bf16_flop_per_s is not None:
            return self.peak_bf16_flop_per_s
        return self.peak_fp16_flop_per_s


class _Row(BaseModel):
    """One [[gpu]] table of data/gpus.toml as written: units in the key names, a source beside every figure."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    vendor: str
    architecture: str
    memory_gib: float | None = Field(default=None, gt=0)
    memory_gb: float | None = Field(default=None, gt=0)
    memory_bandwidth_gb_per_s: float = Field(gt=0)
    peak_bf16_tflop_per_s: float | None = Field(default=None, gt=0)
    peak_fp16_tflop_per_s: float = Field(gt=0)
    peak_fp32_tflop_per_s: float = Field(gt=0)
    fabric_gb_per_s: float | None = Field(default=None, gt=0)
    fabric: str | None = None
    pcie_gen: int
    source: str = Field(min_length=1)
    source_url: str = Field(pattern=r"^https://")
    estimated: bool = False
    notes: str = ""
    num_sms: int | None = None
    num_sms_source: str | None = None
    peak_fp8_tflop_per_s: float | None = None
    peak_fp8_source: str | None = None
    sustained_gemm_tflop_per_s: float | None = None
    sustained_gemm_source: str | None = None

    @model_validator(mode="after")
    def _whole(self) -> _Row:
        if (self.memory_gib is None) == (self.memory_gb is None):
            raise ValueError(f"{self.name}: give exactly one of memory_gib, memory_gb")
        if (self.num_sms is None) != (self.num_sms_source is None):
            raise ValueError(f"{self.name}: num_sms and num_sms_source go together")
        if (self.peak_fp8_tflop_per_s is None) != (self.peak_fp8_source is None):
            raise ValueError(f"{self.name}: peak_fp8_tflop_per_s and peak_fp8_source go together")
        if (self.sustained_gemm_tflop_per_s is None) != (self.sustained_gemm_source is None):
            raise ValueError(f"{self.name}: sustained_gemm_tflop_per_s and sustained_gemm_source go together")
        return self

    def spec(self) -> GpuSpec:
        memory = self.memory_gib * GIB if self.memory_gib is not None else self.memory_gb * GB
        return GpuSpec(
            name=self.name,
            vendor=self.vendor,
            architecture=self.architecture,
            memory_bytes=int(memory),
            memory_bandwidth_bytes_per_s=self.memory_bandwidth_gb_per_s * GB,
            peak_bf16_flop_per_s=_scaled(self.peak_bf16_tflop_per_s, TFLOP),
            peak_fp16_flop_per_s=self.peak_fp16_tflop_per_s * TFLOP,
            peak_fp32_flop_per_s=self.peak_fp32_tflop_per_s * TFLOP,
            fabric_bytes_per_s=_scaled(self.fabric_gb_per_s, GB),
            fabric=self.fabric,
            pcie_gen=self.pcie_gen,
            source=self.source,
            source_url=self.source_url,
            estimated=self.estimated,
            notes=self.notes,
            num_sms=self.num_sms,
            peak_fp8_flop_per_s=_scaled(self.peak_fp8_tflop_per_s, TFLOP),
            sustained_gemm_flop_per_s=_scaled(self.sustained_gemm_tflop_per_s, TFLOP),
        )


def _scaled(value: float | None, unit: float) -> float | None:
    return None if value is None else value * unit


def _load() -> dict[str, GpuSpec]:
    """Read and validate data/gpus.toml (a package file, so the catalog is data, not code)."""
    text = resources.files("planner.specs").joinpath("data/gpus.toml").read_text(encoding="utf-8")
    rows = [_Row.model_validate(row) for row in tomllib.loads(text)["gpu"]]
    catalog = {row.name: row.spec() for row in rows}
    if len(catalog) != len(rows):
        raise ValueError("data/gpus.toml names a GPU twice")
    return catalog


CATALOG: dict[str, GpuSpec] = _load()

# Names as torch / nvidia-smi report them, and common short names, mapped to catalog keys.
ALIASES: dict[str, str] = {
    "Tesla V100-SXM2-16GB": "V100-SXM2-16GB",
    "Tesla V100-SXM2-32GB": "V100-SXM2-32GB",
    "Tesla V100-PCIE-16GB": "V100-PCIe-16GB",
    "Tesla V100-PCIE-32GB": "V100-PCIe-32GB",
    "A100-SXM4-40GB": "A100-SXM4-40GB",
    "A100-PCIE-40GB": "A100-PCIe-40GB",
    "A100 80GB PCIe": "A100-PCIe-80GB",
    "H100 80GB HBM3": "H100-SXM5-80GB",
    "H100 PCIe": "H100-PCIe-80GB",
    "H200": "H200-SXM-141GB",
    "GH200 480GB": "GH200-96GB",
    "H100 NVL": "H100-NVL-94GB",
    "GeForce RTX 2080 Ti": "RTX-2080-Ti",
    "TITAN RTX": "Titan-RTX",
    "Tesla T4": "T4",
    "GeForce RTX 3090": "RTX-3090",
    "GeForce RTX 4090": "RTX-4090",
    "AMD Instinct MI250X": "MI250X",
    "AMD Instinct MI300X": "MI300X",
}


def lookup(name: str) -> GpuSpec:
    """The catalog entry for `name` (exact key, or a name torch reports); suggests close names if unknown."""
    if name in CATALOG:
        return CATALOG[name]
    bare = name.removeprefix("NVIDIA ").strip()
    for key in (bare, ALIASES.get(name), ALIASES.get(bare)):
        if key and key in CATALOG:
            return CATALOG[key]
    suggestions = closest(name, list(CATALOG))
    hint = f"did you mean {', '.join(suggestions)}?" if suggestions else ""
    raise UnknownNameError(
        "gpu",
        name,
        f"not in the GPU catalog; {hint} (`meshplan gpus` lists all {len(CATALOG)})".replace("; (", " ("),
    )


def is_known(name: str) -> bool:
    try:
        lookup(name)
    except UnknownNameError:
        return False
    return True
