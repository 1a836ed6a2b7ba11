"""Simulator speed (issue 4). Prints figures; never passes or fails.

1. The Azure conversation trace (splitwise_conv.csv, 19,366 requests) on llama-2-7b / a100-80gb /
   1 replica: simulated requests per second of wall time, with bulk steady-decode runs on and off.
   Vidur's event loop takes about 19 s for 5,000 requests of this kind on this machine (~260
   requests/s), the figure the issue compares against. Like that figure, the timed runs leave out
   start-up: a first run over the trace's first 1,000 requests (printed too) pays for imports and
   the cost model's caches.
2. A synthetic million-request trace over 16 replicas (llama-3.1-8b / h100-sxm): wall time,
   requests/s, and peak memory at a quarter of the requests and at all of them (memory should grow
   only by the per-request metric rows).

    python bench/sim_speed.py [--shared ../shared] [--requests 1000000]
    python bench/sim_speed.py --quick      # the same runs on 300 / 2,000 requests: a smoke run
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload

VIDUR_REQUESTS_PER_S = 5000 / 19.0
SYNTHETIC = "synthetic:num={num},input=uniform(50,500),output=uniform(10,100),rate=400"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(config: SimConfig, spec: str, limit: int | None = None, **kwargs) -> tuple[float, int, dict]:
    workload = load_workload(spec)
    if limit is not None:
        workload = workload.limited(limit)
    started = time.perf_counter()
    result = simulate(config, workload, **kwargs)
    return time.perf_counter() - started, len(workload), result.summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: the trace's first 2,000 requests (start-up run 300), 2,000 synthetic ones")
    args = parser.parse_args()
    if args.quick:
        args.requests = 2_000
    startup, trace_limit = (300, 2_000) if args.quick else (1000, None)

    conv = str(args.shared / "traces" / "splitwise_conv.csv")
    config = SimConfig(model="llama-2-7b", hardware="a100-80gb")
    print("1. splitwise_conv.csv on llama-2-7b / a100-80gb / 1 replica")
    seconds, n, _ = timed(config, conv, limit=startup)
    print(f"   start-up run, first {n:,} requests: {seconds:.2f} s = {n / seconds:,.0f} requests/s")
    for bulk in (True, False):
        seconds, n, summary = timed(config, conv, limit=trace_limit, bulk_decodes=bulk)
        print(f"   bulk decode runs {'on ' if bulk else 'off'}: {n} requests in {seconds:.1f} s = {n / seconds:,.0f} "
              f"requests/s ({n / seconds / VIDUR_REQUESTS_PER_S:.1f}x Vidur's ~260/s); "
              f"{summary.time_split_s.steps:,} steps, TTFT p50 {summary.ttft_s.p50:.3f} s")

    print(f"\n2. {SYNTHETIC.format(num=args.requests)} over 16 x h100-sxm (llama-3.1-8b)")
    fleet = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", replicas=16, router="least_outstanding_tokens")
    for num in (args.requests // 4, args.requests):
        seconds, n, summary = timed(fleet, SYNTHETIC.format(num=num))
        print(f"   {n:>9,} requests: {seconds:6.1f} s = {n / seconds:,.0f} requests/s; peak RSS so far "
              f"{peak_rss_mb():,.0f} MB; TTFT p50 {summary.ttft_s.p50:.3f} s, "
              f"{summary.throughput.output_tokens_per_s:,.0f} output tok/s")


if __name__ == "__main__":
    main()
