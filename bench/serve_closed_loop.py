"""The closed loop over HTTP on this machine: `servecast serve` (the demo model) replayed by
`servecast replay` at several rates, each replay simulated by `servecast simulate --replay` with
this device's profile and the servecast engine, and `servecast compare`'s errors; then
`servecast calibrate --runs` fits an engine profile on the replays and its leave-one-run-out
errors are printed beside the uncalibrated ones and its in-sample ones.

Everything goes through the CLI, as a user would run it. The server runs its engine on one torch
thread (--threads 1, as the profile is timed), leaving the other core to its API process and the
load generator. Not a test: figures only.

    python bench/serve_closed_loop.py [--requests 200] [--rates 4,10,16] [--profile P] [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

METRICS = (("e2e_s.mean", "E2E mean"), ("e2e_s.p99", "E2E p99"), ("ttft_s.mean", "TTFT mean"),
           ("ttft_s.p99", "TTFT p99"), ("tpot_s.mean", "TPOT mean"), ("throughput.output_tokens_per_s", "tok/s"))
FLAGS = ["--block-size", "16", "--max-num-seqs", "64", "--max-num-batched-tokens", "512", "--threads", "1"]


def servecast(*args: str, capture: bool = True) -> str:
    """Run a servecast command; its stdout (a command that fails stops the benchmark, saying why)."""
    done = subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=capture, text=True)
    if done.returncode != 0:
        sys.exit(f"servecast {' '.join(args)} failed ({done.returncode}): {(done.stderr or '').strip()[-500:]}")
    return done.stdout


def serve(port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--model", "demo", "--port", str(port), *FLAGS],
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.3)
    server.kill()
    sys.exit("servecast serve did not come up within 300 s")


def errors_of(sim: Path, replay: Path) -> dict[str, float | None]:
    rows = json.loads(servecast("compare", str(sim), str(replay), "--json"))["metrics"]
    return {path: rows[path]["relative_error"] for path, _ in METRICS}


def cell(error: float | None) -> str:
    return "     -" if error is None else f"{100 * error:+6.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rates", default="4,10,16", help="requests/s of each replay")
    p.add_argument("--trace", default="synthetic:num={n},input=uniform(16,256),output=uniform(16,128),rate={rate}")
    p.add_argument("--profile", type=Path, help="this device's profile of the demo model, timed on one thread "
                   "(default: profile it now)")
    p.add_argument("--port", type=int, default=8343)
    p.add_argument("--warmup", type=int, default=16)
    p.add_argument("--evaluations", type=int, default=200)
    p.add_argument("--out", type=Path, help="keep the replays, simulations and fitted profile here")
    p.add_argument("--quick", action="store_true", help="the tests' profile grid, 20 requests at 2 rates, a short fit")
    args = p.parse_args()
    if args.quick:
        args.requests, args.rates, args.warmup, args.evaluations = 20, "4,8", 2, 10
    out = args.out or Path(tempfile.mkdtemp(prefix="closed-loop-"))
    out.mkdir(parents=True, exist_ok=True)
    rates = [float(r) for r in args.rates.split(",")]
    print(f"servecast serve (demo model, {' '.join(FLAGS)}) on {os.cpu_count()} cores; {args.requests} requests "
          f"per replay at {args.rates} req/s; {args.warmup} warm-up requests first")
    profile = args.profile
    if profile is None:
        profile = out / "cpu-demo-profile.jsonl"
        started = time.perf_counter()
        servecast("profile", "--model", "demo", "--threads", "1", "--out", str(profile), *(["--quick"] if args.quick else []))
        print(f"profiled the demo model on one thread in {time.perf_counter() - started:.0f} s: {profile}")
    server = serve(args.port)
    replays = []
    try:
        for rate in rates:
            folder = out / "replays" / f"rate{rate:g}"
            trace = args.trace.format(n=args.requests, rate=f"{rate:g}")
            servecast("replay", "--url", f"http://127.0.0.1:{args.port}/v1", "--trace", trace, "--warmup",
                      str(args.warmup), "--out", str(folder), "--json")
            replays.append(folder)
    finally:
        server.terminate()
        server.wait(60)
    uncalibrated = {}
    for folder in replays:
        sim = out / "simulated" / folder.name
        servecast("simulate", "--replay", str(folder), "--profile", str(profile), "--engine", "servecast",
                  "--out", str(sim), "--json")
        uncalibrated[folder.name] = errors_of(sim, folder)
    fitted = out / "servecast-http.json"
    fit = json.loads(servecast("calibrate", "--runs", str(out / "replays"), "--profile", str(profile), "--out",
                               str(fitted), "--evaluations", str(args.evaluations), "--workers", "2", "--json"))
    header = "  ".join(f"{label:>9s}" for _, label in METRICS)
    print(f"\n(simulated - measured) / measured, %, per replay ({len(replays)} replays of {args.requests} requests)")
    print(f"{'replay':10s} {'engine profile':26s} {header}")
    for folder in replays:
        print(f"{folder.name:10s} {'servecast (uncalibrated)':26s} "
              + "  ".join(f"{cell(uncalibrated[folder.name][path]):>9s}" for path, _ in METRICS))
    keys = {"e2e_s.mean": "e2e_mean", "e2e_s.p99": "e2e_p99", "ttft_s.mean": "ttft_mean", "ttft_s.p99": "ttft_p99",
            "tpot_s.mean": "tpot"}
    by_id = {run["id"]: run for run in fit["runs"]}
    for label, key in (("fitted, leave one run out", "leave_one_run_out"), ("fitted, in sample", "in_sample")):
        for run in (by_id[folder.name] for folder in replays):
            cells = [cell(run[key][k] / run["measured"][k] - 1.0) if k in run["measured"] else cell(None)
                     for k in (keys.get(path) for path, _ in METRICS)]
            print(f"{run['id']:10s} {label:26s} " + "  ".join(f"{c:>9s}" for c in cells))
    def median(path: str) -> str:
        errors = sorted(abs(e[path]) for e in uncalibrated.values() if e[path] is not None)
        return f"{100 * errors[len(errors) // 2]:.2f}" if errors else "-"

    print(f"\nmedian absolute errors, %: uncalibrated E2E {median('e2e_s.mean')}, TTFT {median('ttft_s.mean')}, "
          f"TPOT {median('tpot_s.mean')}; " + "; ".join(
        f"{label} E2E {e.get('e2e_mean_mdape')}, TTFT {e.get('ttft_mean_mdape')}, TPOT {e.get('tpot_mdape')}"
        for label, e in fit["errors"].items()))
    print("fitted: " + ", ".join(f"{k} {v:.3g}" for k, v in fit["parameters"].items()))
    print(f"replays, simulations and the fitted profile in {out}")


if __name__ == "__main__":
    main()
