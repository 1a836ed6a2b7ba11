"""Where an operator's time comes from: a profile's measured series, a roofline x efficiency
curve, or a formula. Each source times one operator at one shape as a function of its size,
once: `time(size)` is the fast path the simulator calls every step, `predict(size)` the same
number with its provenance and expected error. No torch."""

from __future__ import annotations

from collections.abc import Callable

from simulator.cost.efficiency import EfficiencyCurve
from simulator.cost.series import Series
from simulator.cost.types import Prediction


class Source:
    def time(self, size) -> float:
        raise NotImplementedError

    def predict(self, size) -> Prediction:
        raise NotImplementedError


class Measured(Source):
    """Read from a profile's series (measured at its sizes, interpolated between them). `reads`
    maps the operator's size onto the series' axis (decode attention: total context -> mean)."""

    def __init__(self, series: Series, errors: dict, reads: Callable[[int], int] | None = None) -> None:
        self.series, self.errors, self.reads = series, errors, reads

    def time(self, size) -> float:
        return self.series.at(self.reads(size) if self.reads else size)[0]

    def predict(self, size) -> Prediction:
        t, provenance = self.series.at(self.reads(size) if self.reads else size)
        return Prediction(t, provenance, self.errors[provenance])


class Modeled(Source):
    """Roofline x efficiency: work(size) -> (FLOPs, bytes) timed on a fitted curve, never below the
    roofline. `scale` (CostModel.scales: a speed fitted on real runs of memory-bound steps) divides
    the bandwidth the curve sees: it moves the memory-bound side only, never past the roofline.
    `compute_speed` (likewise fitted, below 1 for a kernel whose arithmetic runs far from the
    device's peak, as decode attention's does) multiplies the peak its compute side sees."""

    def __init__(self, curve: EfficiencyCurve, additive: bool, peak: float, bandwidth_of: Callable[[float], float],
                 work: Callable[[int], tuple[float, float]], provenance: str, expected_error: float,
                 scale: float = 1.0, compute_speed: float = 1.0) -> None:
        self.curve, self.additive, self.peak, self.bandwidth_of, self.work = curve, additive, peak, bandwidth_of, work
        self.provenance, self.expected_error, self.scale = provenance, expected_error, scale
        self.compute_speed = compute_speed

    def time(self, size) -> float:
        flops, nbytes = self.work(size)
        bandwidth = self.bandwidth_of(nbytes)
        peak = self.peak
        t = self.curve.time(flops, nbytes, peak * self.compute_speed, bandwidth / self.scale, self.additive)
        roofline = flops / peak
        if nbytes / bandwidth > roofline:
            roofline = nbytes / bandwidth
        return t if t >= roofline else roofline  # max(t, max(...)), without the calls: a hot path

    def predict(self, size) -> Prediction:
        return Prediction(self.time(size), self.provenance, self.expected_error)


class Formula(Source):
    """A time from a function of the size (collectives without measurements, composites)."""

    def __init__(self, time_of: Callable[[int], float], provenance: str, expected_error: float) -> None:
        self.time_of, self.provenance, self.expected_error = time_of, provenance, expected_error

    def time(self, size) -> float:
        return self.time_of(size)

    def predict(self, size) -> Prediction:
        return Prediction(self.time_of(size), self.provenance, self.expected_error)


class Composite(Source):
    """A time from other predictions (predict_of(size) -> Prediction): operators whose shape on
    the size is more than one series (MoE experts at a step's expected load)."""

    def __init__(self, predict_of: Callable[[int], Prediction]) -> None:
        self.predict_of = predict_of

    def time(self, size) -> float:
        return self.predict_of(size).time_s

    def predict(self, size) -> Prediction:
        return self.predict_of(size)
