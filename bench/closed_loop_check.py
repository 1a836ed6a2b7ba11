"""Closed-loop check: the public `vllm bench serve --max-concurrency` results of
calibrate/runs/closed_loop.py (H100/H200/MI300X; gpt-oss, Qwen3-MoE, Llama-3.1-8B), replayed as
`synthetic:...,concurrency=C` with each run's server flags and release profile, predicted against
measured. The runs marked `fit` are among those the default vLLM profile was fitted on
(bench/vllm_runs.py --closed-loop); the others (another device, a release it does not span, a row
flagged by its source) never were. Prints the errors; never passes or fails. Cross-validated
figures of the fitted ones are bench/vllm_runs.py's.

    python bench/closed_loop_check.py [--quick]
    python bench/closed_loop_check.py --fit-device mi300x   # that device's own speeds fitted on its
                                      # runs (calibrate/fitting/device_speeds.py), in sample and
                                      # leave one run out; the shipped profile is left as it is
"""

from __future__ import annotations

import argparse
import statistics

from calibrate.fitting.device_speeds import fit_device_speeds, leave_one_out
from calibrate.fitting.engine_profile import predict as predict_with
from calibrate.runs.closed_loop import RUNS, ClosedLoopRun
from simulator.catalog.engines import DEFAULT_GPU_ENGINE, load_engine
from simulator.fleet.run import simulate


def predict(run: ClosedLoopRun, prompts: int) -> dict[str, float]:
    return run.figures(simulate(run.sim_config(), run.workload(prompts=prompts)).summary)


def fit_device(device: str) -> None:
    runs = [run for run in RUNS if run.hardware == device]
    if len(runs) < 2:
        raise SystemExit(f"{len(runs)} closed-loop runs on {device}: a fit and its leave-one-out need two or more")
    base = load_engine(DEFAULT_GPU_ENGINE)
    profile, speeds = fit_device_speeds(base, runs, device)
    start = base.speeds_on(device)
    print(f"{device}: " + ", ".join(f"{k} {start.get(k, 1.0):.3g} -> {v:.3g}" for k, v in speeds.items()))
    print(f"{'run':58s} {'scaled':>7s} {'fitted':>7s} {'loo':>7s} {'measured':>8s}  (TPOT ms)")
    for run, held in zip(runs, leave_one_out(base, runs, device)):
        before, after = predict_with(base, run, 1.0), predict_with(profile, run, 1.0)
        print(f"{run.id:58s} " + " ".join(f"{r.predicted['tpot']:7.2f}" for r in (before, after, held))
              + f" {run.tpot_ms:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three runs, two waves of prompts each")
    parser.add_argument("--fit-device", metavar="DEVICE", help="fit DEVICE's own speeds on its runs instead")
    args = parser.parse_args()
    if args.fit_device:
        fit_device(args.fit_device)
        return
    runs = [RUNS[0], RUNS[14], RUNS[19]] if args.quick else RUNS
    print(f"{'source':8s} {'model':14s} {'hardware':9s} tp {'quant':5s} {'kv':4s} {'ISL/OSL':>10s}    C  "
          f"{'TPOT pred/meas ms':>22s}  {'TTFT pred/meas ms':>24s}  fit")
    errors: dict[str, dict[str, list[float]]] = {"fit": {"tpot": [], "ttft": []}, "not": {"tpot": [], "ttft": []}}
    signed: dict[str, list[float]] = {}  # hardware -> signed TPOT errors
    for run in runs:
        predicted = predict(run, min(run.prompts, 2 * run.concurrency) if args.quick else run.prompts)
        group = errors["fit" if run.fits else "not"]
        e = 100 * (predicted["tpot"] / run.tpot_ms - 1)
        group["tpot"].append(abs(e))
        signed.setdefault(run.hardware, []).append(e)
        cells = f"{run.tpot_stat:4s} {predicted['tpot']:6.2f}/{run.tpot_ms:6.2f} {e:+4.0f}%"
        if run.ttft:
            f = 100 * (predicted["ttft"] / run.ttft[1] - 1)
            group["ttft"].append(abs(f))
            cells += f"  {run.ttft[0]:4s} {predicted['ttft']:7.1f}/{run.ttft[1]:7.1f} {f:+4.0f}%"
        else:
            cells += " " * 26
        print(f"{run.source:8s} {run.model:14s} {run.hardware:9s} {run.tp:2d} {run.quant:5s} "
              f"{run.kv_dtype:4s} {run.isl:>5d}/{run.osl:<5d} {run.concurrency:3d}  {cells}  {'yes' if run.fits else 'no'}"
              + (f"  ({run.note})" if run.note else ""))
    every = {m: errors["fit"][m] + errors["not"][m] for m in ("tpot", "ttft")}
    print()
    for label, group in (("all runs", every), ("fitted on", errors["fit"]), ("never fitted", errors["not"])):
        if group["tpot"]:
            print(f"median absolute error, {label:12s}: TPOT {statistics.median(group['tpot']):.1f} % over "
                  f"{len(group['tpot'])}" + (f", TTFT {statistics.median(group['ttft']):.1f} % over "
                                             f"{len(group['ttft'])}" if group["ttft"] else ""))
    for hardware, values in signed.items():
        print(f"  {hardware:9s} TPOT errors {min(values):+.0f} to {max(values):+.0f} % over {len(values)}")
    print("(the issue's target for closed-loop sweeps: TPOT <= 8 %, TTFT <= 20 %)")


if __name__ == "__main__":
    main()
