"""Fitting a serving-engine profile on real runs, and judging it on runs it was not fitted on. No torch.

The fitted parameters are few and each is one physical thing. For the engine, on every device: its
host time per step, the latency a request spends outside the engine's steps (API server,
tokenization, streaming), how many steps late a sampled token reaches the client, and the speed
of its all-reduces, elementwise kernels and MoE experts relative to the cited collective figures
and the shipped curves (in situ, under its fusions). Per device with runs: the speed of its GEMMs
and of its decode attention relative to the shipped curves (a device without runs keeps them).
Everything else in the profile (CUDA graphs, the all-reduce algorithms) is fixed from public
sources. The fit minimises a robust (soft L1) loss of the log errors of the E2E mean, TTFT mean
and TPOT of the unsaturated runs and the TPOT of the saturated ones, each run simulated in full
through the engine's scheduler (stages shortened by time_scale). Runs are rows of runs tables or
replays of traces against a server (calibrate/runs/measured.py MeasuredRun). A fit of an engine that
adds nothing (servecast's own, on a profiled device) starts from the device's profile as it is
(neutral_start), a fit of a production engine from values typical of vLLM on an H100.

Cross-validation refits without the held-out runs -- afresh from the same start (refit "full"), or,
where fits are dear, by one robust Gauss-Newton step from the full fit on the kept runs, taken only
where their simulated loss falls (refit "step", refit_without: how the shipped vLLM profile was
judged) -- then simulates each held-out run at its own refitted parameters: leave one run out, and
leave one model out (every run of the model held out together; none where every run is of one model).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from calibrate.runs.tables import METRICS
from calibrate.runs.measured import MeasuredRun, Replayed, replay
from simulator.catalog.engines import INTERVAL, EngineProfile, residual_quantile
from simulator.cost.model import CostModel
from simulator.fleet.costs import cost_model_for

FIT_METRICS = ("e2e_mean", "ttft_mean", "tpot")
# An overloaded run's latencies are its queue's, but its TPOT is the step at a full batch of long
# contexts, which no unsaturated run reaches: it is fitted on that alone.
SATURATED_FIT_METRICS = ("tpot",)
# The engine's own terms, on every device (units that make finite differences sane), the last
# ENGINE_SCALES of them operator families' speeds under the engine.
# attention_decode_compute: the arithmetic speed of decode attention (a fraction of the shipped
# curve's): grouped-query heads share each K/V read, so their attention does more arithmetic per byte.
SHARED = ("step_ms", "request_ms", "output_delay_steps", "all_reduce", "elementwise", "moe",
          "attention_decode_compute")
SHARED_START = (1.5, 6.0, 1.0, 1.5, 0.6, 1.0, 0.05)
SHARED_BOUNDS = ((0.0, 20.0), (0.0, 500.0), (0.0, 4.0), (0.3, 10.0), (0.2, 3.0), (0.3, 3.0), (0.005, 1.0))
ENGINE_SCALES = 4
# Per device with runs: its own speeds, and its GEMMs' floors as a share of the shipped curves'
# (pinned by runs at small decode batches, where a GEMM's floor is its time).
DEVICE = ("gemm", "attention_decode", "gemm_floor")
DEVICE_START, DEVICE_BOUNDS = (0.8, 1.0, 1.0), ((0.3, 3.0), (0.3, 3.0), (0.1, 3.0))
# Shortened for the fit, a run still spans this many seconds (its steady state, not its ramp-up).
MIN_FIT_S = 300.0
DIFF_STEP, F_SCALE = 0.05, 0.05  # finite-difference step (relative); where the robust loss turns linear
REFIT_STEPS = (1.0, 0.4)  # lengths of the Gauss-Newton step a cross-validation refit tries
# A run that could not serve every request is off the scale: its residuals count as this factor.
OFF_SCALE = math.log(100.0)


@dataclass(frozen=True)
class FitResult:
    profile: EngineProfile  # fitted on every run given
    in_sample: list[Replayed]
    leave_one_run_out: list[Replayed]
    leave_one_model_out: list[Replayed]  # empty where the runs are of one model
    theta: tuple[float, ...]
    names: tuple[str, ...]


def parameter_names(devices: Sequence[str]) -> tuple[str, ...]:
    return (*SHARED, *(f"{d}:{p}" for d in devices for p in DEVICE))


def theta_of(profile: EngineProfile, devices: Sequence[str]) -> np.ndarray:
    """The parameter vector of a fitted profile (profile_at's inverse), starting values where it lacks one."""
    start, _, _ = _bounds(devices)
    out = start.copy()
    out[:3] = (profile.framework.get("step_s", start[0] * 1e-3) * 1e3, profile.request_s * 1e3,
               profile.output_delay_steps)
    for k, name in enumerate(SHARED[-ENGINE_SCALES:]):
        out[len(SHARED) - ENGINE_SCALES + k] = profile.scales.get(name, out[len(SHARED) - ENGINE_SCALES + k])
    for i, device in enumerate(devices):
        for k, name in enumerate(DEVICE):
            j = len(SHARED) + len(DEVICE) * i + k
            out[j] = profile.device_scales.get(device, {}).get(name, out[j])
    return out


def profile_at(base: EngineProfile, devices: Sequence[str], theta: Sequence[float]) -> EngineProfile:
    step_ms, request_ms, delay_steps = theta[:3]
    engine_scales = {**base.scales, **{name: float(v) for name, v in
                                       zip(SHARED[-ENGINE_SCALES:], theta[len(SHARED) - ENGINE_SCALES:len(SHARED)])}}
    scales = dict(base.device_scales)
    for i, device in enumerate(devices):
        start = len(SHARED) + len(DEVICE) * i
        scales[device] = {name: float(v) for name, v in zip(DEVICE, theta[start:start + len(DEVICE)])}
    framework = {"step_s": step_ms * 1e-3}  # the engine's host terms are the fit's alone
    return replace(base, framework=framework, request_s=request_ms * 1e-3, output_delay_steps=float(delay_steps),
                   scales=engine_scales, device_scales=scales)


def fit_scale(run: MeasuredRun, time_scale: float, min_s: float = MIN_FIT_S) -> float:
    """time_scale, or more for a short run, so that it spans at least min_s seconds."""
    return min(1.0, max(time_scale, min_s / run.duration_s))


def predict(profile: EngineProfile, run: MeasuredRun, time_scale: float) -> Replayed:
    config = run.sim_config()
    return replay(run, cost_model_for(config, engine=profile), time_scale, config)


def fit_metrics(run: MeasuredRun) -> tuple[str, ...]:
    return SATURATED_FIT_METRICS if run.saturated else FIT_METRICS


def log_residuals(replayed: Replayed, metrics: Sequence[str] | None = None) -> list[float]:
    out = []
    metrics = fit_metrics(replayed.run) if metrics is None else metrics
    for metric in metrics:
        measured = replayed.run.measured.get(metric)
        if measured is None:
            continue
        predicted = replayed.predicted[metric]
        out.append(math.log(predicted / measured) if math.isfinite(predicted) and predicted > 0 else OFF_SCALE)
    return out


def neutral_start(runs: Sequence[MeasuredRun], devices: Sequence[str]) -> np.ndarray:
    """Where a fit of an engine that adds nothing (servecast's own) starts: the base as it is, so
    the first evaluation is the uncalibrated prediction -- the device's own host time per step (a
    profiled device's fitted step_s, which the engine's replaces), no request latency or output
    delay, every speed 1."""
    config = runs[0].sim_config()
    framework = CostModel.load(config.hardware, profile=config.profile, hardware_file=config.hardware_file).framework
    shared = {"step_ms": framework.get("step_s", 0.0) * 1e3, "request_ms": 0.0, "output_delay_steps": 0.0}
    return np.array([*(shared.get(name, 1.0) for name in SHARED), *(1.0,) * (len(DEVICE) * len(devices))])


def _start(base: EngineProfile, runs: Sequence[MeasuredRun], devices: Sequence[str]) -> np.ndarray:
    """Where a fit starts unless told: neutral_start for an engine that adds nothing, else SHARED_START."""
    return neutral_start(runs, devices) if base.adds_nothing else _bounds(devices)[0]


def _bounds(devices: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, lower, upper) of the parameter vector for these devices."""
    bounds = [*SHARED_BOUNDS, *DEVICE_BOUNDS * len(devices)]
    return (np.array([*SHARED_START, *DEVICE_START * len(devices)]), np.array([b[0] for b in bounds]),
            np.array([b[1] for b in bounds]))


class _Objective:
    """The fit's residuals over some runs (log errors of their FIT_METRICS, each run simulated at
    its fit scale), remembered per parameter vector."""

    def __init__(self, base: EngineProfile, runs: Sequence[MeasuredRun], devices: Sequence[str], time_scale: float,
                 min_s: float, progress: Callable[[str], None] | None = None) -> None:
        self.base, self.runs, self.devices, self.time_scale, self.min_s = base, runs, devices, time_scale, min_s
        self.progress, self.calls, self.seen = progress, 0, {}

    def __call__(self, theta: np.ndarray) -> np.ndarray:
        key = tuple(np.round(theta, 12))
        if key not in self.seen:
            self.calls += 1
            profile = profile_at(self.base, self.devices, theta)
            self.seen[key] = np.array([x for run in self.runs for x in log_residuals(
                predict(profile, run, fit_scale(run, self.time_scale, self.min_s)))])
            if self.progress is not None:
                rms = float(np.sqrt(np.mean(np.square(self.seen[key]))))
                self.progress(f"fit evaluation {self.calls}: rms log error {rms:.3f}")
        return self.seen[key]


def _solve(objective: _Objective, x0: np.ndarray, lower: np.ndarray, upper: np.ndarray, max_steps: int):
    """Bounded least squares under the robust loss (soft L1 past F_SCALE: the targets are median
    errors, and one odd run -- an offloading or a nearly saturated one -- must not pull every other
    run off)."""
    x_scale = np.array([0.5, 5.0, 0.3, 0.1, 0.1, 0.1, 0.02, *(0.1,) * (len(x0) - len(SHARED))])
    return least_squares(objective, x0, bounds=(lower, upper), diff_step=DIFF_STEP, ftol=1e-3, xtol=1e-3,
                         max_nfev=max_steps, loss="soft_l1", f_scale=F_SCALE, x_scale=x_scale)


def fit_engine(base: EngineProfile, runs: Sequence[MeasuredRun], time_scale: float = 0.1,
               max_evaluations: int = 40, progress: Callable[[str], None] | None = None,
               min_s: float = MIN_FIT_S, x0: np.ndarray | None = None) -> tuple[
                   EngineProfile, np.ndarray, np.ndarray, tuple[str, ...], np.ndarray]:
    """Least squares over the runs (the fit_metrics of each): (profile, theta, plain Jacobian of
    the stacked per-run residuals at theta, names, those residuals). x0: where to start (default:
    the starting values; a previous fit's theta_of to resume it)."""
    fitting = list(runs)
    if all(r.saturated for r in fitting):
        raise ValueError("no unsaturated run to fit on: every run given was overloaded")
    devices = sorted({r.hardware for r in fitting})
    start, lower, upper = _bounds(devices)
    x0 = np.clip(np.asarray(_start(base, fitting, devices) if x0 is None else x0, dtype=float), lower, upper)
    objective = _Objective(base, fitting, devices, time_scale, min_s, progress)
    if max_evaluations <= 0:  # no fit: theta is x0 (a fitted profile's own, for its cross-validation)
        result = type("Fixed", (), {"x": x0, "fun": objective(x0)})
    else:  # max_nfev counts the steps' evaluations, not the Jacobians' (one per parameter each step)
        result = _solve(objective, x0, lower, upper, max(1, max_evaluations // (len(x0) + 1)))
    # The plain Jacobian at the solution (least_squares returns one scaled by the robust loss).
    jac = np.empty((len(result.fun), len(x0)))
    for j in range(len(x0)):
        h = DIFF_STEP * max(1.0, abs(result.x[j]))
        h = h if result.x[j] + h <= upper[j] else -h
        moved = result.x.copy()
        moved[j] += h
        jac[:, j] = (objective(moved) - result.fun) / h
    return profile_at(base, devices, result.x), result.x, jac, parameter_names(devices), result.fun


def robust_cost(resid: np.ndarray) -> float:
    """The fit's loss: soft L1 past F_SCALE."""
    return float(np.sum(2 * F_SCALE ** 2 * (np.sqrt(1 + (resid / F_SCALE) ** 2) - 1)))


def refit_without(base: EngineProfile, fitting: Sequence[MeasuredRun], devices: Sequence[str], theta: np.ndarray,
                  jac: np.ndarray, resid: np.ndarray, owner: np.ndarray, held: Sequence[int], time_scale: float,
                  min_s: float, steps: Sequence[float] = REFIT_STEPS) -> tuple[np.ndarray, bool]:
    """The fit redone without the held-out runs, from the full fit theta: the Gauss-Newton step on
    the kept runs' rows (weighted as the robust loss weighs them), tried at full length and shorter
    (steps), each simulated on the kept runs; the first that lowers their loss below theta's is
    taken, else theta stays (it is then the kept runs' local optimum as far as the simulator can
    tell). A parameter no kept run depends on (say the MoE speed with every MoE run held out)
    learnt its value from the held-out runs alone: it goes back to its starting value. Returns
    (parameters, whether they moved)."""
    start, lower, upper = _bounds(devices)
    keep = ~np.isin(owner, held)
    kept = [run for i, run in enumerate(fitting) if i not in set(held)]
    rows = jac[keep]
    # Blind: informed by the held-out runs alone. A parameter no run at all moves (a speed pinned
    # at the roofline) keeps its value.
    blind = (np.linalg.norm(rows, axis=0) < 1e-9) & (np.linalg.norm(jac, axis=0) >= 1e-9)
    base_theta = np.where(blind, start, theta)
    w = np.sqrt(1.0 / np.sqrt(1.0 + (resid[keep] / F_SCALE) ** 2))
    step = np.zeros_like(theta)
    if (~blind).any():
        step[~blind], *_ = np.linalg.lstsq(rows[:, ~blind] * w[:, None], -resid[keep] * w, rcond=None)
    objective = _Objective(base, kept, devices, time_scale, min_s)
    best = robust_cost(resid[keep]) if not blind.any() else robust_cost(objective(base_theta))
    for length in steps:
        trial = np.clip(base_theta + length * step, lower, upper)
        if robust_cost(objective(trial)) < best:
            return trial, True
    return base_theta, bool(blind.any())


def _fold(task) -> tuple[np.ndarray, bool, list[Replayed]]:
    """One cross-validation fold (a process's unit of work): the refit without the held-out runs
    and their predictions at it. refit "full": fitted afresh on the kept runs alone, from where the
    full fit started (x0); "step": refit_without, one step from the full fit."""
    (refit, base, fitting, devices, theta, jac, resid, owner, members, fit_time_scale, min_fit_s, time_scale,
     max_evaluations, x0) = task
    if refit == "full":
        kept = [run for i, run in enumerate(fitting) if i not in set(members)]
        if all(run.saturated for run in kept):  # nothing to fit on: the start stands
            theta_out, changed = _start(base, fitting, devices) if x0 is None else np.asarray(x0), False
            profile = profile_at(base, devices, theta_out)
        else:
            kept_devices = sorted({run.hardware for run in kept})
            start = None if x0 is None else theta_of(profile_at(base, devices, x0), kept_devices)
            profile, *_ = fit_engine(base, kept, fit_time_scale, max_evaluations, None, min_fit_s, start)
            theta_out, changed = theta_of(profile, devices), True
    else:
        theta_out, changed = refit_without(base, fitting, devices, theta, jac, resid, owner, members,
                                           fit_time_scale, min_fit_s)
        profile = profile_at(base, devices, theta_out)
    return theta_out, changed, [predict(profile, fitting[i], time_scale) for i in members]


def cross_validate(base: EngineProfile, runs: Sequence[MeasuredRun], fit_time_scale: float = 0.1,
                   time_scale: float = 1.0, max_evaluations: int = 40,
                   progress: Callable[[str], None] | None = None, min_fit_s: float = MIN_FIT_S,
                   x0: np.ndarray | None = None, workers: int = 1, refit: str = "full") -> FitResult:
    """The fit on every run (from x0, default the starting values), its in-sample predictions, and
    leave-one-run-out and leave-one-model-out predictions (each held-out run simulated at
    time_scale on its own refit); the folds in `workers` processes. refit "full": each fold fitted
    afresh from x0 on the kept runs alone, as the full fit was (a fold's cost is a fit's); "step":
    one robust Gauss-Newton step from the full fit (refit_without; a fraction of a fit's cost, but
    where the kept runs are already fitted exactly -- as many parameters as their figures -- it
    keeps the full fit, which the held-out run helped make)."""
    if refit not in ("full", "step"):
        raise ValueError(f"refit must be 'full' or 'step', got {refit!r}")
    fitted_profile, theta, jac, names, resid = fit_engine(base, runs, fit_time_scale, max_evaluations, progress,
                                                          min_fit_s, x0)
    fitting = list(runs)
    devices = sorted({r.hardware for r in fitting})
    owner = np.array([i for i, run in enumerate(fitting) for m in fit_metrics(run) if m in run.measured])

    moved: dict[str, int] = {}

    def held_out(groups: dict, label: str) -> dict[int, Replayed]:
        out = {}
        tasks = [(refit, base, fitting, devices, theta, jac, resid, owner, members, fit_time_scale, min_fit_s,
                  time_scale, max_evaluations, x0) for members in groups.values()]
        with ProcessPoolExecutor(workers) if workers > 1 else nullcontext() as pool:
            folds = pool.map(_fold, tasks) if pool is not None else map(_fold, tasks)
            for n, (members, (theta_out, changed, predicted)) in enumerate(zip(groups.values(), folds), 1):
                moved[label] = moved.get(label, 0) + changed
                out.update(zip(members, predicted))
                if progress is not None:
                    progress(f"{label} {n}/{len(groups)}: parameters {'moved' if changed else 'kept'} "
                             + ", ".join(f"{k}={v:.3g}" for k, v in zip(names, theta_out)))
        return out

    loo = held_out({i: [i] for i in range(len(fitting))}, "leave one run out")
    families: dict[str, list[int]] = {}
    for i, run in enumerate(fitting):
        families.setdefault(run.family, []).append(i)
    # With one model, holding it out leaves nothing to fit on: there is no leave-one-model-out.
    lomo = held_out(families, "leave one model out") if len(families) > 1 else {}
    in_sample = [predict(fitted_profile, r, time_scale) for r in runs]
    loo_all, lomo_all = [loo[i] for i in range(len(runs))], [lomo[i] for i in sorted(lomo)]
    residuals = {m: [-x for rep in loo_all if not rep.run.saturated for x in log_residuals(rep, (m,))]
                 for m in METRICS}
    errors = {"leave_one_run_out": {**summary_errors(loo_all), "refits_moved": moved.get("leave one run out", 0)}}
    if lomo:
        errors["leave_one_model_out"] = {**summary_errors(lomo_all),
                                         "refits_moved": moved.get("leave one model out", 0)}
    errors["in_sample"] = summary_errors(in_sample)
    latency = [r for r in runs if not r.saturated]
    fitted_on = (f"{len(latency)} unsaturated real runs ({', '.join(devices)}; "
                 f"{', '.join(sorted({r.family for r in latency}))}) and the TPOT of "
                 f"{len(runs) - len(latency)} saturated ones")
    final = replace(fitted_profile, fitted_on=fitted_on, errors=errors, residuals=residuals)
    return FitResult(final, in_sample, loo_all, lomo_all, tuple(float(x) for x in theta), names)


def summary_errors(replayed: Sequence[Replayed]) -> dict:
    """Median absolute percentage error per metric over the unsaturated runs, the worst unsaturated
    E2E error, and how many saturated runs came out saturated."""
    latency = [r for r in replayed if not r.run.saturated]
    out: dict = {}
    for metric in METRICS:
        errors = [abs(e) for r in latency if (e := r.error(metric)) is not None and math.isfinite(e)]
        if errors:
            out[f"{metric}_mdape"] = round(100 * float(np.median(errors)), 2)
    e2e = [abs(e) for r in latency if (e := r.error("e2e_mean")) is not None]
    out["e2e_mean_max_ape"] = round(100 * max(e2e), 2) if e2e else None
    saturated = [r for r in replayed if r.run.saturated]
    out["saturated_predicted"] = f"{sum(r.saturated for r in saturated)}/{len(saturated)}"
    out["runs"] = len(latency)
    return out


def interval_coverage(replayed: Sequence[Replayed], metric: str, quantiles=INTERVAL) -> tuple[int, int]:
    """Of the unsaturated held-out runs, how many measured values fall inside the interval built
    from the other runs' held-out residuals (nested: a run's own residual never widens its interval)."""
    rows = [(r, r.run.measured.get(metric)) for r in replayed if not r.run.saturated]
    rows = [(r, m) for r, m in rows if m is not None and math.isfinite(r.predicted[metric])]
    inside = 0
    for k, (rep, measured) in enumerate(rows):
        others = [math.log(m / r.predicted[metric]) for j, (r, m) in enumerate(rows) if j != k]
        lo, hi = (float(residual_quantile(others, q)) for q in quantiles)
        inside += rep.predicted[metric] * math.exp(lo) <= measured <= rep.predicted[metric] * math.exp(hi)
    return inside, len(rows)
