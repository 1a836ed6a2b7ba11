"""Real-GPU fidelity (issue 24): replay the real vLLM runs of ../shared/reference/vllm-runs.md
through the simulator, fit the vLLM engine profile on them, and print per run predicted / measured
E2E, TTFT (mean, p90, p99) and TPOT, with the median absolute percentage errors in sample, leave
one run out and leave one model out, saturation, and the coverage of the 80 % intervals. Prints
figures; never passes or fails.

    python bench/vllm_runs.py                     # fit, cross-validate, print (minutes)
    python bench/vllm_runs.py --write             # ... and write the fitted profile to the catalog
    python bench/vllm_runs.py --resume --write    # the fit restarted from the catalog profile's values
    python bench/vllm_runs.py --cv-only --write   # the catalog profile's values cross-validated, not refitted
    python bench/vllm_runs.py --quick             # a smoke run: 5 runs, short stages, a short fit
    ... --closed-loop                             # the fit also takes the public closed-loop runs of
                                                  # calibrate/runs/closed_loop.py that it can (their TPOT)
    ... --closed-loop --hold-out IX828 --start P  # no cross-validation: fit from profile P without the
                                                  # closed-loop runs whose id starts IX828, predict them
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from dataclasses import replace

from calibrate.fitting.engine_profile import (MIN_FIT_S, cross_validate, fit_engine, interval_coverage, predict,
                                             summary_errors, theta_of)
from calibrate.runs.closed_loop import ClosedLoopRun, fitted_runs
from calibrate.runs.tables import METRICS, read_runs
from simulator.catalog.engines import DEFAULT_GPU_ENGINE, ENGINES_DIR, load_engine


def model_out_coverage(profile, replayed, metric: str, widen: float) -> tuple[int, int]:
    """Of the unsaturated runs predicted with their model held out, how many measured values fall in
    the profile's interval for that metric widened by `widen` (EngineProfile.interval)."""
    inside = total = 0
    for rep in replayed:
        measured = rep.run.measured.get(metric)
        if rep.run.saturated or measured is None:
            continue
        interval = profile.interval(metric, rep.predicted[metric], widen)
        if interval is not None:
            total += 1
            inside += interval[0] <= measured <= interval[1]
    return inside, total


def split_errors(result) -> dict:
    """The profile's error figures over the campaign's runs alone (as before closed-loop runs were
    fitted on), and the closed-loop runs' TPOT errors beside them."""
    errors = {}
    for label, replayed in (("leave_one_run_out", result.leave_one_run_out),
                            ("leave_one_model_out", result.leave_one_model_out), ("in_sample", result.in_sample)):
        campaign = [r for r in replayed if not isinstance(r.run, ClosedLoopRun)]
        closed = [r for r in replayed if isinstance(r.run, ClosedLoopRun)]
        errors[label] = {**result.profile.errors.get(label, {}), **summary_errors(campaign)}
        errors[f"closed_loop_{label}"] = {"tpot_mdape": summary_errors(closed).get("tpot_mdape"), "runs": len(closed)}
    return errors


def table(result) -> None:
    print(f"{'run':28s} {'model':14s} tp {'workload':14s}  " + "  ".join(f"{m:>16s}" for m in METRICS)
          + "  saturated")
    for loo in result.leave_one_run_out:
        run = loo.run
        if isinstance(run, ClosedLoopRun):
            continue
        cells = []
        for m in METRICS:
            measured = run.measured.get(m)
            cells.append(f"{loo.predicted[m]:8.1f}/{measured:7.1f}" if measured is not None else f"{'-':>16s}")
        print(f"{run.id[:28]:28s} {run.family:14s} {run.tp:2d} {run.preset.name:14s}  " + "  ".join(cells)
              + f"  {'yes' if run.saturated else 'no'}/{'yes' if loo.saturated else 'no'}")


def held_out_check(args, base, runs, held, devices) -> None:
    """Fit without `held` (from --start's values, else the catalog's), then predict them: TPOT
    errors on runs no fit saw, beside the fitted runs' in-sample errors."""
    if not held:
        raise SystemExit(f"no closed-loop run's id starts with {args.hold_out!r}")
    start = load_engine(path=args.start) if args.start else base
    started = time.perf_counter()
    profile, theta, _, names, _ = fit_engine(base, runs, args.fit_time_scale, args.evaluations,
                                             lambda text: print("  ..", text, flush=True),
                                             0.0 if args.quick else MIN_FIT_S, theta_of(start, devices))
    print(f"\nfitted on {len(runs)} runs without {len(held)} ({args.hold_out}*) in {time.perf_counter() - started:.0f} s")
    print("fitted:", ", ".join(f"{n}={v:.4g}" for n, v in zip(names, theta)))
    print("\nheld-out closed-loop runs (TPOT, ms): predicted, measured, error")
    replayed = [predict(profile, run, args.time_scale) for run in held]
    for rep in replayed:
        tpot = rep.predicted["tpot"]
        print(f"  {rep.run.id:58s} {tpot:7.2f} {rep.run.tpot_ms:7.2f} {100 * (tpot / rep.run.tpot_ms - 1):+6.1f} %")
    fitted = [predict(profile, r, args.time_scale) for r in runs]
    campaign = [r for r in fitted if not isinstance(r.run, ClosedLoopRun)]
    print("\nmedian absolute % error, TPOT: held out", summary_errors(replayed).get("tpot_mdape"),
          "| fitted closed-loop runs, in sample", summary_errors([r for r in fitted if r not in campaign]).get("tpot_mdape"))
    print("campaign, in sample:", "  ".join(f"{k}={v}" for k, v in summary_errors(campaign).items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    parser.add_argument("--fit-time-scale", type=float, default=0.1, help="stages shortened this much while fitting")
    parser.add_argument("--time-scale", type=float, default=1.0, help="stages shortened this much when judging")
    parser.add_argument("--evaluations", type=int, default=60, help="about the most simulations of every run while fitting")
    parser.add_argument("--write", action="store_true", help=f"write the fitted profile to {ENGINES_DIR}")
    parser.add_argument("--resume", action="store_true", help="start the fit from the catalog profile's fitted "
                        "values (the cross-validation's fallback values stay the starting ones)")
    parser.add_argument("--cv-only", action="store_true", help="no fit: cross-validate the catalog profile's "
                        "fitted values as they are (its folds refit from them)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for the folds")
    parser.add_argument("--closed-loop", action="store_true", help="fit on the closed-loop runs it can take too")
    parser.add_argument("--hold-out", metavar="PREFIX", help="fit (no cross-validation) without the closed-loop "
                        "runs whose id starts with PREFIX, then predict them: a check on runs never fitted")
    parser.add_argument("--start", type=Path, help="with --resume or --hold-out: start from this profile file's "
                        "fitted values, not the catalog's (one that never saw the held-out runs)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs = read_runs(args.shared / "reference" / "vllm-runs.md")
    closed = fitted_runs() if args.closed_loop else []
    if args.quick:
        runs = [r for r in runs if r.family in ("qwen2.5-7b", "llama-2-7b", "mistral-nemo")][:5]
        closed = [r for r in closed if r.concurrency <= 4][:1]
        args.fit_time_scale, args.time_scale, args.evaluations = 0.02, 0.02, 8
    held = [r for r in closed if args.hold_out and r.id.startswith(args.hold_out)]
    runs = [*runs, *(r for r in closed if r not in held)]
    started = time.perf_counter()
    base = load_engine(DEFAULT_GPU_ENGINE)
    devices = sorted({r.hardware for r in runs if not r.saturated})
    if args.hold_out:
        held_out_check(args, base, runs, held, devices)
        return
    result = cross_validate(base, runs, args.fit_time_scale, args.time_scale, 0 if args.cv_only else args.evaluations,
                            progress=lambda text: print("  ..", text, flush=True),
                            min_fit_s=0.0 if args.quick else MIN_FIT_S,
                            x0=theta_of(load_engine(path=args.start) if args.start else base, devices)
                            if args.resume or args.cv_only else None,
                            workers=args.workers, refit="step")  # 21 runs' full refits per fold: too dear
    print(f"\n{len(runs)} runs of {args.shared / 'reference' / 'vllm-runs.md'}; fitted in "
          f"{time.perf_counter() - started:.0f} s (fit at stage scale {args.fit_time_scale}, judged at {args.time_scale})")
    print("fitted:", ", ".join(f"{n}={v:.4g}" for n, v in zip(result.names, result.theta)))
    print("\nper run, leave one run out: predicted/measured (ms)")
    table(result)
    if closed:
        result = replace(result, profile=replace(result.profile, errors=split_errors(result)))
        print("\nclosed-loop runs (TPOT, ms): in sample / leave one run out / leave one model out, measured")
        for rows in zip(result.in_sample, result.leave_one_run_out, result.leave_one_model_out):
            if isinstance(rows[0].run, ClosedLoopRun):
                print(f"  {rows[0].run.id:58s} " + " / ".join(f"{r.predicted['tpot']:6.2f}" for r in rows)
                      + f"   {rows[0].run.tpot_ms:6.2f}")
    print("\nmedian absolute % error over the unsaturated runs (target: E2E <= 5, TTFT <= 15, TPOT <= 5)")
    for label, errors in result.profile.errors.items():
        print(f"  {label:20s} " + "  ".join(f"{k}={v}" for k, v in errors.items()))
    print("\n80 % intervals (nested leave one run out): measured inside / runs (target 70-90 %)")
    for metric in METRICS:
        inside, total = interval_coverage(result.leave_one_run_out, metric)
        if total:
            print(f"  {metric:10s} {inside}/{total} = {100 * inside / total:.0f} %")
    if result.leave_one_model_out:
        print("\n80 % intervals from the leave-one-run-out residuals, on the leave-one-model-out predictions "
              "(an unseen model), at widenings of their spread about the median residual")
        for metric in METRICS:
            cells = []
            for widen in (1.0, 1.25, 1.5, 1.75, 2.0):
                inside, total = model_out_coverage(result.profile, result.leave_one_model_out, metric, widen)
                if total:
                    cells.append(f"x{widen:g}: {inside}/{total}")
            print(f"  {metric:10s} " + "  ".join(cells))
    if args.write:
        path = ENGINES_DIR / f"{DEFAULT_GPU_ENGINE}.json"
        result.profile.save(path)
        print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
