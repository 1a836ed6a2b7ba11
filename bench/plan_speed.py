"""Plan in seconds (issue 38): the bounded search against the exhaustive one, side by side in one
run, each a fresh `servecast plan` process as from the shell. Prints seconds, their ratio and
whether the answers agree; never passes or fails.

1. The default plan (72 deployments), bounded and --exhaustive: wall time, simulations, the
   recommendation, and every candidate the bounded search still searched against the exhaustive
   answer (replicas, p99s; headroom and slow end where both have them).
2. The full grid (every priced accelerator x bf16/fp8/int4 x TP 1-8 x speculation none/ngram x
   disaggregation none/1:1), bounded: wall time (--full-exhaustive adds the exhaustive one).
3. A 10,000-request what-if on 8 x H100 (`servecast simulate`), whole process.

    python bench/plan_speed.py [--full-exhaustive]
    python bench/plan_speed.py --quick    # smoke run: a 4-candidate grid, a 300-request what-if
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

FULL_GRID = ["--quant", "bf16,fp8,int4", "--tp", "1,2,4,8", "--speculation", "none,ngram:4:0.6",
             "--disaggregate", "none,1:1"]
QUICK_GRID = ["--hardware", "h100-sxm,l40s", "--quant", "bf16,fp8", "--tp", "1"]


def plan(options: list[str]) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "app.cli", "plan", "--json", *options], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 3):
        raise SystemExit(f"servecast plan {' '.join(options)} failed:\n{done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout)


def compare(fast: dict, full: dict) -> str:
    """The bounded plan's answers against the exhaustive plan's, in words."""
    rows = {(r["candidate"], r["rate_scale"]): r for r in full["candidates"]}
    searched = [r for r in fast["candidates"] if r.get("replicas_at_least") is None]
    same = [r for r in searched if (r["feasible"], r["replicas"], r["ttft_p99_s"], r["tpot_p99_s"])
            == (lambda o: (o["feasible"], o["replicas"], o["ttft_p99_s"], o["tpot_p99_s"]))(rows[(r["candidate"],
                                                                                               r["rate_scale"])])]
    extras = [r for r in searched if r["headroom"] is not None or r["replicas_slow_end"] is not None]
    extras_same = [r for r in extras if (r["headroom"], r["replicas_slow_end"]) == (
        rows[(r["candidate"], r["rate_scale"])]["headroom"], rows[(r["candidate"], r["rate_scale"])]["replicas_slow_end"])]
    bounded = [r for r in fast["candidates"] if r.get("replicas_at_least") is not None]
    sound = [r for r in bounded if not rows[(r["candidate"], r["rate_scale"])]["feasible"]
             or rows[(r["candidate"], r["rate_scale"])]["replicas"] >= r["replicas_at_least"]]
    recommended = all((fast["recommendation"][g] or {}).get("candidate") == (full["recommendation"][g] or {}).get(
        "candidate") and (fast["recommendation"][g] or {}).get("replicas") == (full["recommendation"][g] or {}).get(
        "replicas") for g in full["recommendation"])
    return (f"same recommendation: {'yes' if recommended else 'NO'}; searched to the end {len(searched)} of "
            f"{len(fast['candidates'])}, same replicas and p99s on {len(same)}; headroom and slow end found for "
            f"{len(extras)}, the same on {len(extras_same)}; bounded out {len(bounded)}, the exhaustive answer at or "
            f"above the bound on {len(sound)}")


def simulations(document: dict) -> int:
    return sum(r.get("simulations") or 0 for r in document["candidates"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: a 4-candidate grid, a 300-request what-if")
    parser.add_argument("--full-exhaustive", action="store_true", help="also time the full grid --exhaustive")
    args = parser.parse_args()
    grid = QUICK_GRID if args.quick else []
    fast_s, fast = plan(grid)
    full_s, full = plan(grid + ["--exhaustive"])
    name = "4-candidate plan" if args.quick else "default plan (72 deployments)"
    print(f"1. {name}: bounded {fast_s:.1f} s ({simulations(fast)} simulations), --exhaustive {full_s:.1f} s "
          f"({simulations(full)} simulations): x{full_s / fast_s:.1f}")
    print(f"   {compare(fast, full)}")
    wide = (QUICK_GRID[:-1] + ["1,2"]) if args.quick else FULL_GRID
    wide_s, wide_plan = plan(wide)
    line = f"2. full grid ({len(wide_plan['candidates'])} deployments): bounded {wide_s:.1f} s"
    if args.full_exhaustive:
        wide_full_s, wide_full = plan(wide + ["--exhaustive"])
        line += f", --exhaustive {wide_full_s:.1f} s: x{wide_full_s / wide_s:.1f}; {compare(wide_plan, wide_full)}"
    print(line)
    requests = 300 if args.quick else 10_000
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "app.cli", "simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm",
                    "--replicas", "8", "--trace", f"synthetic:num={requests},lengths=traces/sharegpt_lengths.csv,"
                    "rate=40"], check=True, capture_output=True)
    print(f"3. what-if, {requests:,} requests on 8 x h100-sxm (servecast simulate, whole process): "
          f"{time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
