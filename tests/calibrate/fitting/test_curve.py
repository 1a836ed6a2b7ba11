"""Curve fitting: an operator's own curve follows its measurements even when its family's shape does not."""

from __future__ import annotations

import math

from calibrate.fitting.curve import Sample, fit_curve
from simulator.cost.efficiency import EfficiencyCurve

PEAK, BANDWIDTH = 1e11, 5e10


def _streaming_op(overhead_s: float, sizes) -> list[Sample]:
    # A fixed call overhead plus bytes at 80% of the bandwidth: what a cheap elementwise op measures.
    return [Sample(0.0, float(b), overhead_s + b / (0.8 * BANDWIDTH)) for b in sizes]


def test_operator_curve_fits_its_own_floor_not_its_familys() -> None:
    sizes = [2**p for p in range(10, 24)]
    family = EfficiencyCurve(t0=0.0, log_fm=math.log(7e-6), pm=0.7, em_max=0.4)  # a floor 6x too high
    samples = _streaming_op(1.1e-6, sizes)
    curve = fit_curve(samples, PEAK, BANDWIDTH, start=family, shape_from=family)
    errors = [abs(curve.time(s.flops, s.nbytes, PEAK, BANDWIDTH) - s.time_s) / s.time_s for s in samples]
    assert max(errors) < 0.05
    assert curve.pm == family.pm  # the family's sharpness is kept


def test_fit_is_monotone_and_bounded_by_the_roofline() -> None:
    samples = _streaming_op(3e-6, [2**p for p in range(12, 26)])
    curve = fit_curve(samples, PEAK, BANDWIDTH)
    times = [curve.time(0.0, float(2**p), PEAK, BANDWIDTH) for p in range(8, 30)]
    assert all(b >= a for a, b in zip(times, times[1:]))
    assert all(t >= 2**p / BANDWIDTH for t, p in zip(times, range(8, 30)))
