"""Across devices: the vLLM profile (fitted on H100 runs only) against a published vLLM measurement
of the same model and load on an H100 and on an A100, side by side, and the A100/H100 ratio.

The published figures: Lambda's vLLM benchmark (github.com/LambdaLabsML/vllm-benchmark,
results/prompt_10/1x{H100,A100}-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2048.json; vLLM of
September 2024): Llama-3-8B-Instruct in BF16 at TP1, 10 ShareGPT prompts sent at once (1,369 input
tokens in all), max-model-len 2048. Median TPOT 7.56 ms on H100 SXM and 12.01 ms on A100 SXM 80GB;
mean TTFT 62.4 and 126.9 ms. The output lengths are not in the files: the replay forces 256.
The model is the catalog's Llama-3.1-8B (Llama-3-8B's architecture). The engine is older than the
profile's; the figure to read is the ratio, which a device transfer error moves and an engine-wide
term barely does.

No L40S figure of vLLM at low concurrency was found (only TensorRT-LLM's, FP8), so none is printed.
Prints the errors; never passes or fails.

    python bench/cross_device.py [--engine vllm-v0.15]
"""

from __future__ import annotations

import argparse

from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload

# hardware -> (median TPOT ms, mean TTFT ms), published (see above).
PUBLISHED = {"h100-sxm": (7.56, 62.4), "a100-80gb": (12.01, 126.9)}
SPEC = "synthetic:num=10,input=137,output=256,rate=inf"


def predicted(hardware: str, engine: str) -> tuple[float, float]:
    config = SimConfig(model="llama-3.1-8b", hardware=hardware, tp=1, max_model_len=2048, engine=engine)
    summary = simulate(config, load_workload(SPEC, seed=0)).summary
    return summary.tpot_s.p50 * 1e3, summary.ttft_s.mean * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="vllm-v0.15")
    parser.add_argument("--quick", action="store_true", help="accepted for the smoke run (this bench is quick)")
    args = parser.parse_args()
    rows = {hw: (predicted(hw, args.engine), published) for hw, published in PUBLISHED.items()}
    print(f"Llama-3-8B BF16 TP1, 10 prompts at once, engine profile {args.engine}: predicted / published (ms)")
    for hw, ((tpot, ttft), (tpot_pub, ttft_pub)) in rows.items():
        print(f"  {hw:10s} TPOT p50 {tpot:6.2f} / {tpot_pub:6.2f} ({100 * (tpot / tpot_pub - 1):+.0f} %)   "
              f"TTFT mean {ttft:6.1f} / {ttft_pub:6.1f} ({100 * (ttft / ttft_pub - 1):+.0f} %)")
    (h, _), (a, _) = rows["h100-sxm"][0], rows["a100-80gb"][0]
    ratio_pub = PUBLISHED["a100-80gb"][0] / PUBLISHED["h100-sxm"][0]
    print(f"  A100/H100 TPOT ratio: predicted {a / h:.2f}, published {ratio_pub:.2f} "
          f"({100 * (a / h / ratio_pub - 1):+.0f} %)")


if __name__ == "__main__":
    main()
