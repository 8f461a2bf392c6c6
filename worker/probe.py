"""Probe this node: identity (host, CPU, memory, GPUs, NVLink) and measured compute and memory speed.

Identity is read from the OS and the driver and is cheap (no torch import unless asked for GPUs);
speeds are measured, never assumed: the median of several timed runs after warm-up. A CPU rank is
one process with one thread (torch.set_num_threads(1)), so its matmul figure is what one planner
"device" can do while its neighbours run too. Run `python -m worker.probe` to print a probe as JSON.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

NODE_NAME_ENV = "MESHPLAN_NODE_NAME"
# GPUs need a big matmul to approach their peak; 1024³ takes microseconds on an H100.
GPU_MIN_MATMUL = 8192
CPU_COPY_BYTES = 64 << 20
GPU_COPY_BYTES = 1 << 30


def node_name() -> str:
    """The node's identity: the hostname, unless MESHPLAN_NODE_NAME names a simulated node."""
    return os.environ.get(NODE_NAME_ENV) or socket.gethostname()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def num_cores() -> int:
    """Cores this process may run on (the affinity mask), which is what ranks will share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def host_info() -> dict[str, Any]:
    """Identity of this node without importing torch."""
    return {
        "node": node_name(),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "num_cores": num_cores(),
        "memory_bytes": memory_bytes(),
    }


def cuda_devices() -> list[dict[str, Any]]:
    """Every visible CUDA device: name as torch reports it, memory, SMs, compute capability."""
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(
            {
                "index": i,
                "name": p.name,
                "memory_bytes": int(p.total_memory),
                "sm_count": int(p.multi_processor_count),
                "capability": f"{p.major}.{p.minor}",
            }
        )
    return out


def nvlink_topology() -> list[dict[str, Any]] | None:
    """Active NVLinks per GPU from NVML, or None when pynvml is not installed or NVML fails."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        links = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                        continue
                    peer = pynvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(handle, link)
                    peer_bus = peer.busId.decode() if isinstance(peer.busId, bytes) else str(peer.busId)
                except pynvml.NVMLError:
                    continue  # links past the device's count raise; that is the end of its list
                links.append({"gpu": i, "link": link, "peer_pci_bus": peer_bus})
        return links
    finally:
        pynvml.nvmlShutdown()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def median_time_s(fn: Callable[[], object], device: str, repeats: int = 5, warmup: int = 2, inner: int = 1) -> float:
    """Median over `repeats` of the time of `inner` calls of fn, divided by `inner`, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def matmul_dtype(device: str) -> str:
    """bf16 on GPUs that have it (fp16 otherwise), fp32 on CPU: the dtype training would use there."""
    import torch

    if not device.startswith("cuda"):
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def measure_matmul_flop_per_s(device: str, size: int = 1024, repeats: int = 5) -> tuple[float, str, int]:
    """(FLOP/s, dtype, size) of a square matmul: 2·n³ FLOPs per call, median of `repeats`."""
    import torch

    dtype_name = matmul_dtype(device)
    if device.startswith("cuda"):
        size = max(size, GPU_MIN_MATMUL)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    t = median_time_s(lambda: torch.mm(a, b, out=out), device, repeats=repeats)
    return 2.0 * size**3 / t, dtype_name, size


def measure_memory_bandwidth_bytes_per_s(device: str, nbytes: int | None = None, repeats: int = 5) -> float:
    """Copy bandwidth: a copy reads and writes every byte, so 2·nbytes move per call."""
    import torch

    if nbytes is None:
        nbytes = GPU_COPY_BYTES if device.startswith("cuda") else CPU_COPY_BYTES
    src = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    t = median_time_s(lambda: dst.copy_(src), device, repeats=repeats)
    return 2.0 * src.numel() * 4 / t


def probe_device(device: str, matmul_size: int = 1024, repeats: int = 5) -> dict[str, Any]:
    """Measured speed of one device ('cpu' or 'cuda:i') as this process sees it."""
    flop, dtype, size = measure_matmul_flop_per_s(device, matmul_size, repeats)
    return {
        "device": device,
        "matmul_flop_per_s": flop,
        "matmul_dtype": dtype,
        "matmul_size": size,
        "memory_bandwidth_bytes_per_s": measure_memory_bandwidth_bytes_per_s(device, repeats=repeats),
    }


def probe_local(matmul_size: int = 1024, repeats: int = 5) -> dict[str, Any]:
    """A whole-node probe from one process: identity, GPUs, NVLink, and each device's speed."""
    import torch

    torch.set_num_threads(1)
    gpus = cuda_devices()
    devices = [f"cuda:{g['index']}" for g in gpus] or ["cpu"]
    return {
        **host_info(),
        "gpus": gpus,
        "nvlink": nvlink_topology(),
        "devices": [probe_device(d, matmul_size, repeats) for d in devices],
    }


def identity() -> dict[str, Any]:
    """This node's identity and its CUDA devices, measuring nothing (`python -m worker.probe --identity`)."""
    return {"host": host_info(), "gpus": cuda_devices()}


if __name__ == "__main__":
    import sys

    print(json.dumps(identity() if "--identity" in sys.argv[1:] else probe_local(), indent=2))
