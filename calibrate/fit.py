"""Fit efficiency curves (simulator/efficiency.py) to measured operator times. No torch.

`fit_curve` fits one operator family of one or more profiles by least squares on log time.
`servecast calibrate` (and `python -m calibrate.fit`) fits the shipped parameter file
simulator/catalog/efficiency.json from the Vidur A100 profiles in ../shared.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from simulator.efficiency import EfficiencyCurve
from simulator.profile import Measurement

LOWER = [0.0, 0.01, math.log(1e-9), 0.2, 0.01, math.log(1e-9), 0.2]
UPPER = [5e-3, 1.0, math.log(1.0), 4.0, 1.0, math.log(1.0), 4.0]


@dataclass(frozen=True)
class Sample:
    flops: float
    nbytes: float
    time_s: float


def fit_curve(samples: Sequence[Sample], peak_flops: float, bandwidth: float,
              start: EfficiencyCurve | None = None) -> EfficiencyCurve:
    if len(samples) < 4:
        raise ValueError(f"need at least 4 measurements to fit an efficiency curve, got {len(samples)}")
    flops = np.array([s.flops for s in samples])
    nbytes = np.array([s.nbytes for s in samples])
    log_t = np.log([s.time_s for s in samples])

    def residuals(v):
        t0, ec, lsc, ac, em, lsm, am = v
        tc, tm = flops / peak_flops, nbytes / bandwidth
        with np.errstate(divide="ignore", over="ignore"):
            compute = np.where(tc > 0, tc * (1 + (np.exp(lsc) / np.maximum(tc, 1e-30)) ** ac) / ec, 0.0)
            memory = np.where(tm > 0, tm * (1 + (np.exp(lsm) / np.maximum(tm, 1e-30)) ** am) / em, 0.0)
        return np.log(t0 + np.maximum(compute, memory) + 1e-30) - log_t

    best = None
    starts = [start.vector()] if start else []
    starts += [EfficiencyCurve(t0=t0, log_sc=math.log(sc), log_sm=math.log(sc)).vector()
               for t0 in (1e-6, 2e-5) for sc in (1e-6, 1e-5, 1e-4)]
    for x0 in starts:
        x0 = np.clip(x0, LOWER, UPPER)
        result = least_squares(residuals, x0, bounds=(LOWER, UPPER), method="trf", loss="soft_l1", f_scale=0.1)
        if best is None or result.cost < best.cost:
            best = result
    return EfficiencyCurve.from_vector(best.x)


def mape(predicted: Iterable[float], measured: Iterable[float]) -> float:
    p, m = np.asarray(list(predicted)), np.asarray(list(measured))
    return float(np.mean(np.abs(p - m) / m))


def samples_of(measurements: Iterable[Measurement], work) -> list[Sample]:
    """work(measurement) -> (flops, bytes)."""
    return [Sample(*work(m), m.time_s) for m in measurements]


def write_params(path: str | Path, params: dict) -> None:
    Path(path).write_text(json.dumps(params, indent=2) + "\n")
