"""The engine flags `servecast serve` and `servecast generate` share, declared once, and the
EngineConfig they make. The knobs the engine shares with the simulator (block size, KV blocks,
limits, chunked prefill, prefix caching, TP, CP) are the simulator's declarations
(simulator/fleet/knobs.py) at the engine's defaults; the rest are the engine's own typer options,
used as the commands' defaults."""

from __future__ import annotations

import typer

from app.knob_options import Knobs, Options
from simulator.fleet.knobs import KVCache, Parallelism, SchedulerLimits

KNOBS = (Options(KVCache, only=("block_size", "num_gpu_blocks", "enable_prefix_caching"),
                 names={"num_gpu_blocks": "num-blocks"}),
         Options(SchedulerLimits, only=("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill"),
                 defaults={"max_num_seqs": 64, "max_num_batched_tokens": 512}),
         Options(Parallelism, only=("tp", "cp"),
                 notes={"tp": "the engine runs one process per rank (gloo on CPU, NCCL on GPUs)",
                        "cp": "the engine runs one process per rank, with --tp 1"}))
# The simulator's names of EngineConfig fields, where they differ.
ENGINE_NAMES = {"num_gpu_blocks": "num_blocks", "tp": "tensor_parallel_size", "cp": "context_parallel_size"}

DEVICE = typer.Option("cpu")
DTYPE = typer.Option("float32")
QUANTIZATION = typer.Option(None, help="int8, int4 or fp8 weights (weight-only), or w8a8 (int8 weights and "
                                        "activations; CPU)")
QUANT_KERNEL = typer.Option(None, help="pin the quantized layers' kernel (e.g. int8pack-bf16, fbgemm-w8a8); "
                                       "default: the fastest per layer shape, measured at load")
QUANT_GROUP_SIZE = typer.Option(128, help="int4 group size (32, 64, 128 or 256)")
KV_CACHE_DTYPE = typer.Option(None, help="KV cache stored as int8 or fp8")


def engine_config(knobs: Knobs, device: str, dtype: str, quantization: str | None, quant_group_size: int,
                  kv_cache_dtype: str | None, quant_kernel: str | None = None, **more):
    """The EngineConfig of the shared flags (more: the command's own EngineConfig fields); ValueError
    naming a bad one."""
    from engine import EngineConfig

    return EngineConfig(**{ENGINE_NAMES.get(name, name): value for name, value in knobs.items()}, device=device,
                        dtype=dtype, quantization=quantization, quant_group_size=quant_group_size,
                        quant_kernel=quant_kernel, kv_cache_dtype=kv_cache_dtype, **more)
