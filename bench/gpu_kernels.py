"""Kernel speeds of a CUDA GPU that a serving engine's step is made of, measured with torch alone, for
checking the simulator's catalog curves on that GPU (bench/gpu_kernels_compare.py reads the file):

1. bf16 GEMMs (torch.matmul) and FP8 GEMMs (torch._scaled_mm, e4m3, per-tensor scales, bf16 out)
   at the linear layers' shapes of llama-3.1-8b, llama-3.1-70b at TP 4 and qwen3-30b-a3b's
   experts, over 1 to 8,192 tokens;
2. decode attention (scaled_dot_product_attention, one query per sequence, GQA) over batches and
   contexts: seconds and the KV bytes read per second;
3. a device-to-device copy of 1 GiB: the reachable memory bandwidth.

Each figure is the mean of `reps` back-to-back calls between two CUDA events after a warm-up (no
host round trip per call). Writes JSON lines to --out. Prints and never fails on a part that cannot
run (it is recorded with its error).

    python bench/gpu_kernels.py --out gpu-out/h200-kernels.jsonl
    python bench/gpu_kernels.py --quick     # a smoke run (without CUDA it says so and exits 0)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

# (model, operator, n, k): one rank's linear layers (engine/policy/model_description.py's shapes).
GEMMS = [
    ("llama-3.1-8b", "qkv_proj", 6144, 4096), ("llama-3.1-8b", "o_proj", 4096, 4096),
    ("llama-3.1-8b", "gate_up_proj", 28672, 4096), ("llama-3.1-8b", "down_proj", 4096, 14336),
    ("llama-3.1-70b@tp4", "qkv_proj", 2560, 8192), ("llama-3.1-70b@tp4", "gate_up_proj", 14336, 8192),
    ("llama-3.1-70b@tp4", "down_proj", 8192, 7168),
    ("qwen3-30b-a3b", "expert_gate_up", 1536, 2048), ("qwen3-30b-a3b", "expert_down", 2048, 768),
]
TOKENS = [1, 8, 32, 128, 512, 2048, 8192]
# (batch, heads, kv_heads, head_dim, context)
DECODES = [(b, 32, 8, 128, c) for b in (1, 16, 64, 128) for c in (512, 2048, 8192)]


def timed(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def gemms(write, reps: int) -> None:
    dev = "cuda"
    for model, op, n, k in GEMMS:
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
        w8 = w.to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev, dtype=torch.float32)
        for m in TOKENS:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            row = dict(part="gemm", model=model, op=op, m=m, n=n, k=k)
            row["bf16_s"] = timed(lambda: torch.matmul(x, w.t()), reps)
            try:
                x8 = x.to(torch.float8_e4m3fn)
                # _scaled_mm wants a row-major first operand and a column-major second one.
                row["fp8_s"] = timed(lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one,
                                                              out_dtype=torch.bfloat16), reps)
            except Exception as exc:  # noqa: BLE001 -- recorded, not fatal
                row["fp8_error"] = f"{type(exc).__name__}: {exc}"[:200]
            write(row)
        del w, w8
        torch.cuda.empty_cache()


def decodes(write, reps: int) -> None:
    f = torch.nn.functional
    for batch, heads, kv_heads, head_dim, context in DECODES:
        q = torch.randn(batch, heads, 1, head_dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, kv_heads, context, head_dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        seconds = timed(lambda: f.scaled_dot_product_attention(q, k, v, enable_gqa=True), reps)
        kv_bytes = 2 * batch * kv_heads * context * head_dim * 2
        write(dict(part="decode_attention", batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                   context=context, seconds=seconds, kv_gbps=kv_bytes / seconds / 1e9))
        del q, k, v
    torch.cuda.empty_cache()


def copy_bandwidth(write, reps: int) -> None:
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), reps)
    write(dict(part="copy", bytes=2**30, seconds=seconds, gbps=2 * 2**30 / seconds / 1e9))  # read + write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-out/kernels.jsonl"))
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 calls per point")
    args = parser.parse_args()
    if args.quick:
        args.reps = 3
    if not torch.cuda.is_available():
        print("bench/gpu_kernels.py needs a CUDA GPU: torch sees none")
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as out:
        def write(row: dict) -> None:
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)

        write(dict(part="machine", gpu=torch.cuda.get_device_name(0), torch=torch.__version__,
                   capability=list(torch.cuda.get_device_capability(0))))
        for part in (copy_bandwidth, gemms, decodes):
            started = time.perf_counter()
            try:
                part(write, args.reps)
            except Exception as exc:  # noqa: BLE001 -- one part's failure leaves the others
                write(dict(part=part.__name__, error=f"{type(exc).__name__}: {exc}"[:300]))
            print(f"# {part.__name__}: {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
