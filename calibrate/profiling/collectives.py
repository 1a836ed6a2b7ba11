"""Time all-reduce, all-to-all and the context-parallel ring's hop over torch.distributed (gloo on
CPU, NCCL on CUDA) across `world` local processes.

The profiler calls this for tensor- and context-parallel profiles: one process group is started for
all sizes, since starting processes costs far more than the collectives themselves.
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


def _worker(rank: int, world: int, port: int, op: str, sizes: list[int], device_type: str, dtype_name: str,
            repeats: int, out: str) -> None:
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
        dtype = getattr(torch, dtype_name)
        element = torch.empty((), dtype=dtype).element_size()
        results = {}
        for nbytes in sizes:
            # all_to_all: each rank sends nbytes in all, an even share to every rank.
            count = max(world, nbytes // element // world * world) if op == "all_to_all" else max(1, nbytes // element)
            tensor = torch.ones(count, dtype=dtype, device=device)
            received = torch.empty_like(tensor)

            def collective() -> None:
                if op == "all_to_all":
                    dist.all_to_all_single(received, tensor)
                elif op == "kv_ring":  # as engine/tp_group.py start_ring_pass posts them
                    ops = [lambda: dist.isend(tensor, (rank + 1) % world), lambda: dist.irecv(received, (rank - 1) % world)]
                    for work in [o() for o in (ops if rank % 2 == 0 else ops[::-1])]:
                        work.wait()
                else:
                    dist.all_reduce(tensor)
            for _ in range(3):  # warm-up: connections and buffers
                collective()
            times = []
            for _ in range(repeats):
                dist.barrier()
                if device_type == "cuda":
                    torch.cuda.synchronize(device)
                t = time.perf_counter()
                collective()
                if device_type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - t)
            results[nbytes] = statistics.median(times)
        if rank == 0:
            Path(out).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def measure_collective(op: str, world: int, sizes: list[int], device_type: str = "cpu", dtype_name: str = "float32",
                       repeats: int = 10) -> dict[int, float]:
    """Median seconds of one `op` (all_reduce, all_to_all, kv_ring) of each size (bytes per rank)
    across `world` processes on this machine."""
    if op not in ("all_reduce", "all_to_all", "kv_ring"):
        raise ValueError(f"cannot time collective {op!r}: use all_reduce, all_to_all or kv_ring")
    if world < 2:
        raise ValueError(f"an {op} needs a world of at least 2 processes, got {world}")
    if device_type == "cuda" and torch.cuda.device_count() < world:
        raise ValueError(f"all-reduce over {world} GPUs asked for, but this machine has {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, f"{op}.json")
        mp.spawn(_worker, args=(world, _free_port(), op, sizes, device_type, dtype_name, repeats, out), nprocs=world)
        return {int(k): v for k, v in json.loads(Path(out).read_text()).items()}
