"""The catalog's kernel curves on a GPU against bench/gpu_kernels.py's measurements of it: GEMMs in
bf16 and fp8, decode attention. Prints each measured point's predicted / measured and the medians;
never passes or fails. Points under --floor-us are left out: a call from Python takes about 25 us,
so shorter kernels time the launch, not the GPU.

    python bench/gpu_kernels_compare.py [docs/gpu-runs/h200-kernels-2026-12-04.jsonl] [--hardware h200] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from simulator.cost.model import CostModel

SHIPPED = Path(__file__).resolve().parents[1] / "docs" / "gpu-runs" / "h200-kernels-2026-12-04.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernels", type=Path, nargs="?", default=SHIPPED)
    parser.add_argument("--hardware", default="h200")
    parser.add_argument("--floor-us", type=float, default=40.0)
    parser.add_argument("--quick", action="store_true", help="the same (it is quick): for bench/smoke.sh")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.kernels.read_text().splitlines() if line.strip()]
    model = CostModel.load(args.hardware)  # the catalog device alone: no serving engine's scales
    ratios: dict[str, list[float]] = {"gemm bf16": [], "gemm fp8": [], "decode attention": []}
    floor = args.floor_us * 1e-6
    print(f"{'kernel':44s} {'measured us':>12s} {'predicted us':>13s} {'pred/meas':>9s}")
    for r in rows:
        if r["part"] == "gemm":
            for dtype in ("bf16", "fp8"):
                measured = r.get(f"{dtype}_s")
                if measured is None or measured < floor:
                    continue
                predicted = model.source("gemm", (r["n"], r["k"], dtype, r["op"].removeprefix("expert_"), None)
                                         ).time(r["m"])
                ratios[f"gemm {dtype}"].append(predicted / measured)
                print(f"{r['model'] + ' ' + r['op'] + ' ' + dtype + ' m=' + str(r['m']):44s} {measured * 1e6:12.1f} "
                      f"{predicted * 1e6:13.1f} {predicted / measured:9.2f}")
        elif r["part"] == "decode_attention" and r["seconds"] >= floor:
            source = model.source("attention_decode", (r["batch"], r["heads"], r["kv_heads"], r["head_dim"], "bf16"))
            predicted = source.time(r["batch"] * r["context"]) * 1.0
            ratios["decode attention"].append(predicted / r["seconds"])
            print(f"{'decode b=%d ctx=%d' % (r['batch'], r['context']):44s} {r['seconds'] * 1e6:12.1f} "
                  f"{predicted * 1e6:13.1f} {predicted / r['seconds']:9.2f}")
        elif r["part"] == "copy":
            print(f"copy bandwidth: {r['gbps']:,.0f} GB/s measured (read + write)")
    for name, values in ratios.items():
        if values:
            print(f"{name}: median predicted / measured {statistics.median(values):.2f} over {len(values)} points "
                  f"(range {min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
