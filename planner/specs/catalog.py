"""GPU catalog: datasheet figures per accelerator, keyed by exact device name, each with its source.

Numbers are dense (no sparsity) peaks, seeded from ../shared/data/gpus.csv (datasheets, corroborated
by Lightning's `_CUDA_FLOPS` table and llm.c's `mfu.h`). Units are SI: bytes, bytes/s, FLOP/s.
Bandwidths are per direction. `lookup()` also accepts the names torch reports
(`torch.cuda.get_device_name()`, e.g. "NVIDIA A100-SXM4-80GB") through `ALIASES`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

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

    def peak_flop_per_s(self, dtype: str = "bf16") -> float:
        """Dense peak for a training dtype; bf16 falls back to fp16 on parts without bf16 (V100, T4)."""
        if dtype == "fp32":
            return self.peak_fp32_flop_per_s
        if dtype == "bf16" and self.peak_bf16_flop_per_s is not None:
            return self.peak_bf16_flop_per_s
        return self.peak_fp16_flop_per_s


def _g(
    name: str,
    vendor: str,
    arch: str,
    mem_gb: float,
    bw_gbps: float,
    bf16: float | None,
    fp16: float,
    fp32: float,
    fabric_gbps_dir: float | None,
    fabric: str | None,
    pcie: int,
    source: str,
    url: str,
    estimated: bool = False,
    notes: str = "",
    mem_binary: bool = False,
) -> GpuSpec:
    return GpuSpec(
        name=name,
        vendor=vendor,
        architecture=arch,
        memory_bytes=int(mem_gb * (GIB if mem_binary else GB)),
        memory_bandwidth_bytes_per_s=bw_gbps * GB,
        peak_bf16_flop_per_s=None if bf16 is None else bf16 * TFLOP,
        peak_fp16_flop_per_s=fp16 * TFLOP,
        peak_fp32_flop_per_s=fp32 * TFLOP,
        fabric_bytes_per_s=None if fabric_gbps_dir is None else fabric_gbps_dir * GB,
        fabric=fabric,
        pcie_gen=pcie,
        source=source,
        source_url=url,
        estimated=estimated,
        notes=notes,
    )


_V100 = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_ADA = "https://images.nvidia.com/aem-dam/Solutions/Data-Center/l4/nvidia-ada-gpu-architecture-whitepaper-v2.1.pdf"

# Memory: NVIDIA datasheets quote GB for HBM parts that are really GiB-sized (80 GB = 80 GiB on the
# device, as torch reports 79.x GiB usable), so HBM sizes are stored as GiB.
_SPECS: list[GpuSpec] = [
    _g(
        "V100-SXM2-16GB",
        "NVIDIA",
        "Volta",
        16,
        900,
        None,
        125,
        15.7,
        150,
        "NVLink 2",
        3,
        "NVIDIA V100 datasheet",
        _V100,
        notes="no bf16; fp16 tensor cores",
        mem_binary=True,
    ),
    _g(
        "V100-SXM2-32GB",
        "NVIDIA",
        "Volta",
        32,
        900,
        None,
        125,
        15.7,
        150,
        "NVLink 2",
        3,
        "NVIDIA V100 datasheet",
        _V100,
        notes="no bf16; fp16 tensor cores",
        mem_binary=True,
    ),
    _g(
        "V100-PCIe-16GB",
        "NVIDIA",
        "Volta",
        16,
        900,
        None,
        112,
        14,
        None,
        None,
        3,
        "NVIDIA V100 datasheet",
        _V100,
        notes="no bf16",
        mem_binary=True,
    ),
    _g(
        "V100-PCIe-32GB",
        "NVIDIA",
        "Volta",
        32,
        900,
        None,
        112,
        14,
        None,
        None,
        3,
        "NVIDIA V100 datasheet",
        _V100,
        notes="no bf16",
        mem_binary=True,
    ),
    _g(
        "A100-SXM4-40GB",
        "NVIDIA",
        "Ampere",
        40,
        1555,
        312,
        312,
        19.5,
        300,
        "NVLink 3",
        4,
        "NVIDIA A100 datasheet",
        _A100,
        mem_binary=True,
    ),
    _g(
        "A100-SXM4-80GB",
        "NVIDIA",
        "Ampere",
        80,
        2039,
        312,
        312,
        19.5,
        300,
        "NVLink 3",
        4,
        "NVIDIA A100 datasheet",
        _A100,
        mem_binary=True,
    ),
    _g(
        "A100-PCIe-40GB",
        "NVIDIA",
        "Ampere",
        40,
        1555,
        312,
        312,
        19.5,
        None,
        None,
        4,
        "NVIDIA A100 datasheet",
        _A100,
        notes="NVLink bridge pairs only; sustained clocks below SXM",
        mem_binary=True,
    ),
    _g(
        "A100-PCIe-80GB",
        "NVIDIA",
        "Ampere",
        80,
        1935,
        312,
        312,
        19.5,
        None,
        None,
        4,
        "NVIDIA A100 datasheet",
        _A100,
        notes="NVLink bridge pairs only; sustained clocks below SXM",
        mem_binary=True,
    ),
    _g(
        "H100-SXM5-80GB",
        "NVIDIA",
        "Hopper",
        80,
        3350,
        989,
        989,
        67,
        450,
        "NVLink 4",
        5,
        "NVIDIA H100 datasheet",
        _H100,
        mem_binary=True,
    ),
    _g(
        "H100-PCIe-80GB",
        "NVIDIA",
        "Hopper",
        80,
        2000,
        756,
        756,
        51,
        None,
        None,
        5,
        "NVIDIA H100 datasheet",
        _H100,
        notes="NVLink bridge pairs only",
        mem_binary=True,
    ),
    _g(
        "H200-SXM-141GB",
        "NVIDIA",
        "Hopper",
        141,
        4800,
        989,
        989,
        67,
        450,
        "NVLink 4",
        5,
        "NVIDIA H200 product page",
        "https://www.nvidia.com/en-us/data-center/h200/",
    ),
    _g(
        "A10",
        "NVIDIA",
        "Ampere",
        24,
        600,
        125,
        125,
        31.2,
        None,
        None,
        4,
        "NVIDIA A10 datasheet",
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf",
        mem_binary=True,
    ),
    _g(
        "A10G",
        "NVIDIA",
        "Ampere",
        24,
        600,
        125,
        125,
        31.2,
        None,
        None,
        4,
        "AWS g5 instance page (24 GB); peaks from the A10 datasheet",
        "https://aws.amazon.com/ec2/instance-types/g5/",
        estimated=True,
        notes="NVIDIA publishes no A10G datasheet; A10 figures used, as Lightning does",
        mem_binary=True,
    ),
    _g(
        "L4",
        "NVIDIA",
        "Ada",
        24,
        300,
        121,
        121,
        30.3,
        None,
        None,
        4,
        "NVIDIA L4 product page / Ada whitepaper",
        _ADA,
        mem_binary=True,
    ),
    _g(
        "L40S",
        "NVIDIA",
        "Ada",
        48,
        864,
        362,
        362,
        91.6,
        None,
        None,
        4,
        "NVIDIA L40S product page",
        "https://www.nvidia.com/en-us/data-center/l40s/",
        mem_binary=True,
    ),
    _g(
        "T4",
        "NVIDIA",
        "Turing",
        16,
        320,
        None,
        65,
        8.1,
        None,
        None,
        3,
        "NVIDIA T4 datasheet",
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
        notes="no bf16; fp16 tensor cores",
        mem_binary=True,
    ),
    _g(
        "A40",
        "NVIDIA",
        "Ampere",
        48,
        696,
        149.7,
        149.7,
        37.4,
        56.25,
        "NVLink bridge",
        4,
        "NVIDIA A40 datasheet",
        "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf",
        notes="NVLink bridge pairs only",
        mem_binary=True,
    ),
    _g(
        "RTX-3090",
        "NVIDIA",
        "Ampere",
        24,
        936,
        71,
        71,
        35.6,
        56.25,
        "NVLink bridge",
        4,
        "NVIDIA GA102 whitepaper",
        "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf",
        notes="GeForce: fp32-accumulate tensor rate (training)",
        mem_binary=True,
    ),
    _g(
        "RTX-4090",
        "NVIDIA",
        "Ada",
        24,
        1008,
        165.2,
        165.2,
        82.6,
        None,
        None,
        4,
        "NVIDIA Ada whitepaper",
        _ADA,
        notes="GeForce: fp32-accumulate tensor rate; no PCIe P2P",
        mem_binary=True,
    ),
    _g(
        "MI250X",
        "AMD",
        "CDNA2",
        128,
        3277,
        383,
        383,
        47.9,
        350,
        "Infinity Fabric",
        4,
        "AMD MI250X product page",
        "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html",
        notes="one package = 2 GCDs that software sees as 2 devices of 64 GB",
        mem_binary=True,
    ),
    _g(
        "MI300X",
        "AMD",
        "CDNA3",
        192,
        5300,
        1307.4,
        1307.4,
        163.4,
        448,
        "Infinity Fabric",
        5,
        "AMD MI300X product page",
        "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",
        mem_binary=True,
    ),
    # Added for issue 14 (../shared/data/gpus.csv rows; sources and confidence as recorded there).
    _g(
        "GH200-96GB",
        "NVIDIA",
        "Hopper",
        96,
        4000,
        989,
        989,
        67,
        450,
        "NVLink 4 / NVLink-C2C",
        5,
        "stas00/ml-engineering accelerator tables (GH200 96GB HBM3 4.0 TB/s; same TFLOPS as H100 SXM)",
        "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/",
        notes="confidence medium; fp16 = bf16 as on H100 SXM; GPU-GPU links depend on the system (give them in the cluster file)",
        mem_binary=True,
    ),
    _g(
        "H100-NVL-94GB",
        "NVIDIA",
        "Hopper",
        94,
        3900,
        835,
        835,
        67 * 835 / 989,
        300,
        "NVLink 4 bridge",
        5,
        "NVIDIA H100 datasheet (NVL column, halved sparse numbers)",
        _H100,
        estimated=True,
        notes="fp16 taken = bf16 and fp32 scaled from H100 SXM by the bf16 ratio (not in gpus.csv); bridge 600 GB/s bidir",
        mem_binary=True,
    ),
    _g(
        "H100-HBM2e-96GB-500W",
        "NVIDIA",
        "Hopper",
        96,
        2400,
        835,
        835,
        67 * 835 / 989,
        None,
        "NVLink (8 GPUs fully connected)",
        5,
        "torchtitan benchmark docs, hardware section (Meta Grand Teton H100 variant, 500 W)",
        "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md",
        estimated=True,
        notes="peak not published: torchtitan says it lies between H100 SXM and NVL; the lower (NVL, 835 TF) is used",
        mem_binary=True,
    ),
    _g(
        "RTX-2080-Ti",
        "NVIDIA",
        "Turing",
        11,
        616,
        None,
        53.8,
        13.4,
        None,
        "NVLink 2 bridge",
        3,
        "NVIDIA Turing whitepaper (RTX 2080 Ti reference-clock column)",
        "https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf",
        estimated=True,
        notes="no bf16; GeForce fp16 tensor math with fp32 accumulate at half rate (53.8 TF); confidence low-medium",
        mem_binary=True,
    ),
    _g(
        "Titan-RTX",
        "NVIDIA",
        "Turing",
        24,
        672,
        None,
        130,
        16.3,
        50,
        "NVLink 2 bridge",
        3,
        "NVIDIA Titan RTX spec / Turing whitepaper",
        "https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf",
        notes="no bf16; full-rate fp32-accumulate tensor math; bridge 100 GB/s bidir; confidence medium",
        mem_binary=True,
    ),
]

# Streaming multiprocessors enabled on each product (NVIDIA architecture whitepapers: Volta (V100:
# 80), Turing (T4: 40, RTX 2080 Ti: 68, Titan RTX: 72), Ampere (A100: 108, A10: 72, A10G: 80, A40:
# 84, RTX 3090: 82), Ada (L4: 58, L40S: 142, RTX 4090: 128), Hopper (H100 SXM5 / NVL, H200, GH200:
# 132; H100 PCIe: 114)). GEMMs run in waves of one tile per SM (planner.cost.compute).
NUM_SMS: dict[str, int] = {
    **dict.fromkeys(("V100-SXM2-16GB", "V100-SXM2-32GB", "V100-PCIe-16GB", "V100-PCIe-32GB"), 80),
    **dict.fromkeys(("A100-SXM4-40GB", "A100-SXM4-80GB", "A100-PCIe-40GB", "A100-PCIe-80GB"), 108),
    **dict.fromkeys(("H100-SXM5-80GB", "H100-NVL-94GB", "H200-SXM-141GB", "GH200-96GB"), 132),
    "H100-PCIe-80GB": 114,
    "A10": 72,
    "A10G": 80,
    "A40": 84,
    "RTX-3090": 82,
    "L4": 58,
    "L40S": 142,
    "RTX-4090": 128,
    "T4": 40,
    "RTX-2080-Ti": 68,
    "Titan-RTX": 72,
}

# Dense fp8 (E4M3/E5M2) tensor-core peaks in TFLOP/s, the fp8_dense_tflops column of
# ../shared/data/gpus.csv (each from the product's datasheet named in its row's source: NVIDIA H100
# datasheet (SXM5 / PCIe / NVL columns, sparse figures halved), H200 product page, GH200 (ml-engineering
# tables: as H100 SXM), L4 product page / Ada whitepaper, L40S product page, Ada whitepaper Table 2
# (RTX 4090, fp32 accumulate, the training rate), AMD MI300X product page). Parts not listed have no
# fp8 tensor cores (Volta, Turing, Ampere: fp8 linears are refused there, planner.cost.estimate) or
# publish no figure (the H100 HBM2e 96 GB variant).
FP8_TFLOPS: dict[str, float] = {
    "H100-SXM5-80GB": 1979,
    "H100-PCIe-80GB": 1513,
    "H100-NVL-94GB": 1670,
    "H200-SXM-141GB": 1979,
    "GH200-96GB": 1979,
    "L4": 242.5,
    "L40S": 733,
    "RTX-4090": 330.3,
    "MI300X": 2614.9,
}

CATALOG: dict[str, GpuSpec] = {
    g.name: g.model_copy(
        update={
            "num_sms": NUM_SMS.get(g.name),
            "peak_fp8_flop_per_s": FP8_TFLOPS[g.name] * TFLOP if g.name in FP8_TFLOPS else None,
        }
    )
    for g in _SPECS
}

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
