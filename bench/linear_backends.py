"""F.linear vs the oneDNN-packed GEMM that engine/linear.py uses on CPU, side by side; then every
quantized kernel (engine/quant_kernels.py) against that fp32 GEMM, and the one the engine chooses.

Prints the median time of each over interleaved repeats and the speed-up, for the GEMM shapes of
the throughput benchmark's model (hidden 512, FFN 1408, vocab 16384) at decode and prefill sizes.

    python bench/linear_backends.py [--repeats 21] [--quick]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from engine.linear import Linear
from engine.quant_kernels import KERNELS, candidates
from engine.quantization import quantize_weight

SHAPES = {"qkv": (512, 1024), "o_proj": (512, 512), "gate_up": (512, 2816), "down": (1408, 512),
          "lm_head": (512, 16384)}


def median_time(fn, x, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


@torch.inference_mode()
def main(repeats: int = 21, rows: tuple[int, ...] = (1, 16, 64, 256, 1024)) -> None:
    print(f"{'layer':<8} {'tokens':>6} {'F.linear ms':>12} {'packed ms':>10} {'speed-up':>9}")
    for name, (k, n) in SHAPES.items():
        layer = Linear(k, n, bias=False)
        plain = lambda x, w=layer.weight: F.linear(x, w)  # noqa: E731
        if not layer.pack_for_cpu():
            print("this torch build has no oneDNN packed linear; nothing to compare")
            return
        for m in rows:
            x = torch.randn(m, k)
            torch.testing.assert_close(layer(x), plain(x), rtol=1e-4, atol=1e-3)
            a = median_time(plain, x, repeats)
            b = median_time(layer, x, repeats)
            print(f"{name:<8} {m:>6} {a * 1e3:12.3f} {b * 1e3:10.3f} {a / b:9.2f}")
    quantized_rows(repeats, rows)


@torch.inference_mode()
def quantized_rows(repeats: int, rows: tuple[int, ...]) -> None:
    """Per mode and shape: each candidate kernel's time over the packed fp32 GEMM's (x fp32 > 1 is
    faster), and the engine's measured choice at that row count (marked *)."""
    print(f"\n{'mode':<6} {'layer':<8} {'tokens':>6} {'fp32 ms':>8}  kernels: ms (x fp32)")
    for mode, group in (("int8", 128), ("int4", 32), ("w8a8", 128), ("fp8", 128)):
        for name, (k, n) in SHAPES.items():
            dense = Linear(k, n, bias=False)
            dense.pack_for_cpu()
            layer = Linear(k, n, bias=False)
            layer.weight.data.copy_(dense.weight.data)
            layer.quantize(mode, group)
            choice = layer.quantized.choice
            options = candidates(mode, torch.device("cpu"), torch.float32, (n, k))
            stored = quantize_weight(dense.weight, mode, group)  # every candidate's form (the layer keeps its choice's)
            for kernel in options:
                if kernel.prepare is not None:
                    kernel.prepare(stored)
            for m in rows:
                x = torch.randn(m, k)
                base = median_time(dense, x, repeats)
                cells = []
                for kernel in options:
                    t = median_time(lambda x, f=KERNELS[kernel.name].run: f(x, stored), x,
                                    max(3, repeats // 4) if m >= 256 else repeats)
                    mark = "*" if choice.for_rows(m) == kernel.name else " "
                    cells.append(f"{kernel.name}{mark} {t * 1e3:.3f} ({base / t:.2f})")
                print(f"{mode:<6} {name:<8} {m:>6} {base * 1e3:8.3f}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 repeats, decode and one prefill size")
    args = parser.parse_args()
    if args.quick:
        main(3, (1, 64))
    else:
        main(args.repeats)
