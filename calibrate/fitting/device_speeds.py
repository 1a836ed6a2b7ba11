"""A device's own speeds under an engine profile, fitted on that device's runs with the engine's
shared terms held (host time per step, request latency, output delay, the other families'
speeds). No torch.

A device the campaign never ran on is first predicted from another's fitted speeds scaled by
published figures (EngineProfile.scaled_devices). Where public runs on it exist, the memory-side
speeds of its GEMMs, expert GEMMs and decode attention, and its GEMM floors, are fitted on them
alone: a handful of runs cannot move the shared terms the campaign pinned, and must not. The fit
starts from the scaled speeds, so a speed the runs say nothing about stays there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from scipy.optimize import least_squares

from calibrate.fitting.engine_profile import DIFF_STEP, F_SCALE, log_residuals, predict
from calibrate.runs.measured import MeasuredRun, Replayed
from simulator.catalog.engines import EngineProfile

FITTED = ("gemm", "moe", "attention_decode", "gemm_floor")  # each a factor on its time, 1: the curves'
BOUNDS = (0.1, 5.0)


def with_speeds(base: EngineProfile, device: str, speeds: dict[str, float]) -> EngineProfile:
    """base with these speeds of device's own (over whatever it scaled or took from another)."""
    return replace(base, device_scales={**base.device_scales, device: {**base.device_scales.get(device, {}), **speeds}})


def fit_device_speeds(base: EngineProfile, runs: Sequence[MeasuredRun], device: str, time_scale: float = 1.0,
                      max_evaluations: int = 40) -> tuple[EngineProfile, dict[str, float]]:
    """base with device's FITTED speeds fitted on runs (every one on that device); those speeds."""
    if not runs or any(run.hardware != device for run in runs):
        raise ValueError(f"fit_device_speeds takes runs on {device} only")
    start = base.speeds_on(device)
    x0 = np.clip([start.get(name, 1.0) for name in FITTED], *BOUNDS)

    def residuals(x: np.ndarray) -> np.ndarray:
        profile = with_speeds(base, device, dict(zip(FITTED, map(float, x))))
        return np.array([r for run in runs for r in log_residuals(predict(profile, run, time_scale))])

    # The engine fit's robust least squares (engine_profile._solve), over these speeds alone.
    result = least_squares(residuals, x0, bounds=BOUNDS, diff_step=DIFF_STEP, ftol=1e-3, xtol=1e-3,
                           loss="soft_l1", f_scale=F_SCALE, max_nfev=max(1, max_evaluations // (len(FITTED) + 1)))
    speeds = dict(zip(FITTED, map(float, result.x)))
    return with_speeds(base, device, speeds), speeds


def leave_one_out(base: EngineProfile, runs: Sequence[MeasuredRun], device: str, time_scale: float = 1.0,
                  max_evaluations: int = 40) -> list[Replayed]:
    """Each run predicted by the device's speeds fitted on the others (a full refit per fold)."""
    out = []
    for i, run in enumerate(runs):
        profile, _ = fit_device_speeds(base, [r for j, r in enumerate(runs) if j != i], device, time_scale,
                                       max_evaluations)
        out.append(predict(profile, run, time_scale))
    return out
