"""The engine flags `servecast serve` and `servecast generate` share, declared once (typer options
used as the commands' defaults), and the EngineConfig they make."""

from __future__ import annotations

import typer

BLOCK_SIZE = typer.Option(16)
NUM_BLOCKS = typer.Option(None, help="KV pool size in blocks (default: a byte budget)")
MAX_NUM_SEQS = typer.Option(64)
MAX_NUM_BATCHED_TOKENS = typer.Option(512)
PREFIX_CACHING = typer.Option(True, "--prefix-caching/--no-prefix-caching")
CHUNKED_PREFILL = typer.Option(True, "--chunked-prefill/--no-chunked-prefill")
DEVICE = typer.Option("cpu")
DTYPE = typer.Option("float32")
TP = typer.Option(1, "--tp", help="tensor-parallel ranks (one process each; gloo on CPU, NCCL on GPUs)")
CP = typer.Option(1, "--cp", help="context-parallel ranks (one process each): every sequence's KV split by "
                                  "position, prefills by ring attention; with --tp 1")
QUANTIZATION = typer.Option(None, help="int8, int4 or fp8 weights (weight-only), or w8a8 (int8 weights and "
                                        "activations; CPU)")
QUANT_KERNEL = typer.Option(None, help="pin the quantized layers' kernel (e.g. int8pack-bf16, fbgemm-w8a8); "
                                       "default: the fastest per layer shape, measured at load")
QUANT_GROUP_SIZE = typer.Option(128, help="int4 group size (32, 64, 128 or 256)")
KV_CACHE_DTYPE = typer.Option(None, help="KV cache stored as int8 or fp8")


def engine_config(block_size: int, num_blocks: int | None, max_num_seqs: int, max_num_batched_tokens: int,
                  prefix_caching: bool, chunked_prefill: bool, device: str, dtype: str, tp: int,
                  quantization: str | None, quant_group_size: int, kv_cache_dtype: str | None,
                  quant_kernel: str | None = None, **more):
    """The EngineConfig of the shared flags (more: the command's own EngineConfig fields); ValueError
    naming a bad one."""
    from engine import EngineConfig

    return EngineConfig(block_size=block_size, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=prefix_caching,
                        enable_chunked_prefill=chunked_prefill, device=device, dtype=dtype, tensor_parallel_size=tp,
                        quantization=quantization, quant_group_size=quant_group_size, quant_kernel=quant_kernel,
                        kv_cache_dtype=kv_cache_dtype, **more)
