"""F.linear vs the oneDNN-packed GEMM that engine/linear.py uses on CPU, side by side.

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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 repeats, decode and one prefill size")
    args = parser.parse_args()
    if args.quick:
        main(3, (1, 64))
    else:
        main(args.repeats)
