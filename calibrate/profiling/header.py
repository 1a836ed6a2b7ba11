"""What a profile's header says about the device it measured (calibrate/profiling/profiler.py writes it):
the fingerprint (device name, torch, threads, dtype, kernels), the best matmul rate and copy
bandwidth (measure_peaks), and read bandwidth over working-set sizes (measure_bandwidth_by_size).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from calibrate.profiling.operator_timing import median_time
from calibrate.profiling.plan import ProfileGrid
from engine.linear import Linear
from simulator.catalog.hardware import canonical_dtype


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(device: torch.device, dtype: str, calls_per_sample: int = 1) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return {"device_name": name, "device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(), "dtype": canonical_dtype(dtype), "attention": "servecast paged sdpa",
            "gemm": "onednn packed" if device.type == "cpu" else "torch F.linear",
            "calls_per_sample": calls_per_sample}


def measure_peaks(device: torch.device, dtype: torch.dtype, sync) -> dict[str, float]:
    """Best square-matmul rate (plain and through the engine's packed linear) and copy bandwidth."""
    best = 0.0
    timing = ProfileGrid(min_repeats=5, min_seconds=0.05)
    for size in (256, 512, 1024, 2048):
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        layer = Linear(size, size, bias=False).to(device, dtype)
        if device.type == "cpu":
            layer.pack_for_cpu()
        with torch.inference_mode():
            for fn in (lambda: torch.mm(a, b), lambda: layer(a)):
                best = max(best, 2 * size**3 / median_time(fn, timing, sync))
    src = torch.empty(64 * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    t = median_time(lambda: dst.copy_(src), ProfileGrid(min_repeats=5, min_seconds=0.05), sync)
    return {"matmul_flops": best, "memory_bandwidth": 2 * src.numel() * 4 / t}


def measure_bandwidth_by_size(device: torch.device, sync) -> list[tuple[int, float]]:
    """Read bandwidth over working sets from 256 KiB to 256 MiB (caches, then DRAM)."""
    timing = ProfileGrid(min_repeats=5, min_seconds=0.05)
    curve = []
    for shift in range(18, 29, 1):
        nbytes = 2**shift
        x = torch.randn(nbytes // 4, device=device)
        curve.append((nbytes, nbytes / median_time(lambda: x.sum(), timing, sync)))
    return curve
