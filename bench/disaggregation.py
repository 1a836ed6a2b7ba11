"""DistServe's motivating comparison, simulated: goodput per GPU of co-located serving against
prefill/decode disaggregation, beside the paper's figures.

The published setup (DistServe, Zhong et al., OSDI 2024, arXiv 2401.09670, Figure 1 and section 1):
"an LLM with 13B parameters under a synthetic workload with input length = 512 and output length
= 64 on one NVIDIA 80GB A100"; SLOs of P90 TTFT 0.4 s and P90 TPOT 0.04 s (the authors' blog post,
hao-ai-lab.github.io, blogs/distserve; the paper text gives none); goodput = the highest rate at
which 90 % of requests meet them. Published: co-located (vLLM of 2023) "about 1.6 requests per
second"; one GPU per phase "5.6 rps for the prefill phase and 10 rps for decoding"; 2 prefill GPUs +
1 decode GPU "overall goodput of 10 rps, or equally 3.3 rps per GPU, which is 2.1x higher".

Simulated here: Llama-2-13B (the paper does not name its 13B model) in bf16 on one A100-80GB,
Poisson arrivals, the vllm-v0.15 engine profile; co-located on one GPU (as published) and on three
(the same GPUs as the split: round robin smooths each replica's arrivals), and disaggregated 2:1 over NVLink (300 GB/s one way, the
A100's NVLink 3 in a DGX A100; DistServe places the phases of a model in one node). For each, the
highest Poisson rate (bisected on a log scale) at which P90 TTFT and P90 TPOT hold. Figures only.

    python bench/disaggregation.py [--requests 600] [--quick]
"""

from __future__ import annotations

import argparse
import math

from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload

SLO = {"ttft_p90": 0.4, "tpot_p90": 0.04}
PUBLISHED = {"co-located": 1.6, "prefill only": 5.6, "decode only": 10.0, "2 prefill + 1 decode": 10.0}
NVLINK_A100_GBPS = 300.0  # one way: NVLink 3's 600 GB/s both ways per A100


def meets(config: SimConfig, rate: float, requests: int, output: int = 64) -> bool:
    workload = load_workload(f"synthetic:num={requests},input=512,output={output},rate={rate:g}", seed=0)
    if output == 1:  # a prefill-only fleet: TTFT's SLO alone (one token has no TPOT)
        config = config.model_copy(update={"slo": {"ttft_p90": SLO["ttft_p90"]}})
    summary = simulate(config, workload).summary
    return bool(summary.slo.all_met) and summary.num_rejected == 0


def goodput(config: SimConfig, requests: int, output: int = 64, low: float = 0.25, high: float = 64.0) -> float:
    """The highest rate (to 3 %) at which the config meets the SLOs; 0 if it misses them at `low`."""
    if not meets(config, low, requests, output):
        return 0.0
    while meets(config, high, requests, output):
        low, high = high, high * 2
    while high / low > 1.03:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if meets(config, middle, requests, output) else (low, middle)
    return low


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--quick", action="store_true", help="60 requests a rate")
    args = parser.parse_args()
    if args.quick:
        args.requests = 60
    base = dict(model="llama-2-13b", hardware="a100-80gb", quant="bf16", slo=SLO, engine="vllm-v0.15")
    rows = [  # (a 512-token prompt fits vLLM's token budget whole: chunked prefill never splits one here)
        ("co-located", 1, "co-located", SimConfig(**base)),
        ("co-located, 3 replicas", 3, "co-located", SimConfig(**base, replicas=3)),
        ("prefill only (1 output token)", 1, "prefill only", SimConfig(**base)),
        ("2 prefill + 1 decode", 3, "2 prefill + 1 decode",
         SimConfig(**base, disaggregate="2:1", kv_transfer_gbps=NVLINK_A100_GBPS, kv_transfer_latency_s=0.0)),
    ]
    print(f"Llama-2-13B bf16 on A100-80GB, input 512 / output 64, P90 TTFT <= {SLO['ttft_p90']} s and P90 TPOT <= "
          f"{SLO['tpot_p90']} s, {args.requests} Poisson requests a rate")
    print(f"{'fleet':34s} {'GPUs':>4s} {'goodput rps':>11s} {'per GPU':>8s} {'published':>10s}")
    per_gpu = {}
    for label, gpus, published, config in rows:
        rate = goodput(config, args.requests, output=1 if label.startswith("prefill only") else 64)
        per_gpu[label] = rate / gpus
        paper = PUBLISHED[published]
        print(f"{label:34s} {gpus:4d} {rate:11.2f} {rate / gpus:8.2f} {paper:10.1f}"
              + (f" ({paper / gpus:.1f}/GPU)" if gpus > 1 and published != "co-located" else ""))
    for co in ("co-located", "co-located, 3 replicas"):
        ratio = per_gpu["2 prefill + 1 decode"] / per_gpu[co] if per_gpu[co] else math.inf
        print(f"2P1D per GPU / {co} per GPU: {ratio:.2f}x (published, one co-located GPU of vLLM of 2023: 2.1x)")


if __name__ == "__main__":
    main()
