"""Time all-reduce over torch.distributed (gloo on CPU, NCCL on CUDA) across `world` local processes.

The profiler calls this for tensor-parallel profiles: one process group is started for all sizes,
since starting processes costs far more than the collectives themselves.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, sizes: list[int], device_type: str, dtype_name: str,
            repeats: int, out: str) -> None:
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
        dtype = getattr(torch, dtype_name)
        element = torch.empty((), dtype=dtype).element_size()
        results = {}
        for nbytes in sizes:
            tensor = torch.ones(max(1, nbytes // element), dtype=dtype, device=device)
            for _ in range(3):  # warm-up: connections and buffers
                dist.all_reduce(tensor)
            times = []
            for _ in range(repeats):
                dist.barrier()
                if device_type == "cuda":
                    torch.cuda.synchronize(device)
                t = time.perf_counter()
                dist.all_reduce(tensor)
                if device_type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - t)
            results[nbytes] = statistics.median(times)
        if rank == 0:
            Path(out).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def measure_all_reduce(world: int, sizes: list[int], device_type: str = "cpu", dtype_name: str = "float32",
                       repeats: int = 10) -> dict[int, float]:
    """Median seconds of one all-reduce of each size (bytes) across `world` processes on this machine."""
    if world < 2:
        raise ValueError(f"an all-reduce needs a world of at least 2 processes, got {world}")
    if device_type == "cuda" and torch.cuda.device_count() < world:
        raise ValueError(f"all-reduce over {world} GPUs asked for, but this machine has {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "all_reduce.json")
        mp.spawn(_worker, args=(world, _free_port(), sizes, device_type, dtype_name, repeats, out), nprocs=world)
        return {int(k): v for k, v in json.loads(Path(out).read_text()).items()}
