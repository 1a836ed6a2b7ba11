"""How fast the app answers: a what-if (one fleet simulated on a 10,000-request trace, as the Explore
page asks it, in a warm process as the app's) and the full default `servecast plan` (a fresh
process, as from the shell). Prints seconds; never passes or fails.

    python bench/app_responsiveness.py [--requests 10000] [--skip-plan]
    python bench/app_responsiveness.py --quick    # a smoke run: 300 requests, the plan on one candidate
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from app.dashboard.inputs import workload_from_spec
from app.plan_defaults import trace as bundled_spec
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--skip-plan", action="store_true")
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 300 requests, and the plan over one candidate (h100-sxm, bf16, TP 1)")
    args = parser.parse_args()
    if args.quick:
        args.requests = 300
    plan_options = ["--hardware", "h100-sxm", "--quant", "bf16", "--tp", "1"] if args.quick else []
    config = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", replicas=8)
    # The app answers in a process that has served a question already (its modules imported, the
    # catalog and profiles read): warm this one the same way, on a small trace.
    simulate(config, workload_from_spec(bundled_spec(100, 40.0)))
    workers = os.cpu_count() or 1  # as the app runs it: round-robin replicas spread over the cores
    started = time.perf_counter()
    workload = workload_from_spec(bundled_spec(args.requests, 40.0))
    loaded = time.perf_counter() - started
    for processes in sorted({workers, 1}, reverse=True):
        started = time.perf_counter()
        result = simulate(config, workload, workers=processes)
        simulated = time.perf_counter() - started
        print(f"what-if: {args.requests:,} requests (bundled ShareGPT lengths at 40 req/s) on 8 x h100-sxm, "
              f"{processes} process{'es' if processes > 1 else ''}: trace {loaded:.2f} s + simulation "
              f"{simulated:.2f} s = {loaded + simulated:.2f} s ({args.requests / simulated:,.0f} simulated "
              f"requests/s; TTFT p99 {result.summary.ttft_s.p99:.3f} s)")
    # The same question on shorter prompts: the simulator's cost follows the KV blocks it manages.
    conv = args.shared / "traces" / "splitwise_conv.csv"
    if conv.is_file():
        from simulator.workload.load import load_workload

        started = time.perf_counter()
        workload = load_workload(f"{conv},limit={args.requests}")
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        simulate(config, workload, workers=workers)
        simulated = time.perf_counter() - started
        mean_prompt = sum(r.prompt_tokens for r in workload) / len(workload)
        print(f"what-if: {len(workload):,} requests of the Azure conversation trace (mean prompt {mean_prompt:,.0f} "
              f"tokens, its own arrival times) on 8 x h100-sxm, {workers} processes: trace {loaded:.2f} s + "
              f"simulation {simulated:.2f} s")
    explore_page_answer(args.requests)
    if args.skip_plan:
        return
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "app.cli", "plan", "--json", *plan_options], check=True,
                   stdout=subprocess.DEVNULL)
    what = f"plan over one candidate (servecast plan {' '.join(plan_options)})" if plan_options else \
        "full default plan (servecast plan)"
    print(f"{what}: {time.perf_counter() - started:.1f} s")


def explore_page_answer(requests: int) -> None:
    """The Explore page asked a new question (another GPU) on the bundled trace, in Streamlit's
    test harness: the simulation and the page's metrics and charts, server side (a browser then
    draws them)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app" / "dashboard" / "explore_page.py"),
                           default_timeout=600)
    at.run()
    at.number_input(key="explore_replicas").set_value(8)
    at.number_input(key="explore_num").set_value(requests)
    at.number_input(key="explore_rate").set_value(40.0)
    at.run()  # the first answer (h100-sxm): the page's modules and the catalog warmed
    for hardware in ("h200", "a100-80gb"):
        at.selectbox(key="explore_hw").set_value(hardware)
        started = time.perf_counter()
        at.run()
        took = time.perf_counter() - started
        if at.exception:
            raise RuntimeError(f"the Explore page failed: {at.exception}")
        print(f"Explore page, a new question ({requests:,} bundled requests at 40 req/s on 8 x {hardware}): "
              f"{took:.2f} s to the page's charts")
    started = time.perf_counter()
    at.run()
    print(f"Explore page, the same question again (cached): {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
