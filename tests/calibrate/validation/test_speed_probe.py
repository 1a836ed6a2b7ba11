"""The speed probe's clock, and reading slowdowns from probe times."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import calibrate.validation.speed_probe as speed_probe
from calibrate.validation.speed_probe import ProbedClock, SpeedProbe, slowdowns


def test_the_probed_clock_stops_while_the_probe_runs(monkeypatch) -> None:
    ticks = itertools.count(0.0, 1.0)  # perf_counter advances one second per reading
    monkeypatch.setattr(speed_probe.time, "perf_counter", lambda: next(ticks))
    clock, probe = ProbedClock(), SpeedProbe(repeats=1)
    assert clock() == 0.0
    assert clock.probe(probe) == 1.0  # read at 1 and 2
    assert clock.paused_s == 1.0
    assert clock() == 2.0  # perf_counter reads 3: the probe's second is not on the clock
    clock.probe(probe)
    assert clock() == 4.0 and clock.paused_s == 2.0


def test_slowdowns_are_relative_to_the_reference_probes() -> None:
    probe_s = np.r_[np.full(300, 1e-3), np.full(300, 1.2e-3)]
    first_half = np.arange(600) < 300
    factors = slowdowns(probe_s, first_half, window=50, elasticity=1.0)
    assert factors[:275] == pytest.approx(1.0) and factors[325:] == pytest.approx(1.2)
    # The moving average passes from one speed to the other across the window, in order.
    assert np.all(np.diff(factors) >= -1e-12) and 1.0 < factors[300] < 1.2
    factors = slowdowns(probe_s, ~first_half, window=50, elasticity=1.0)
    assert factors[:275] == pytest.approx(1 / 1.2) and factors[325:] == pytest.approx(1.0)


def test_steps_share_the_probes_slowdown_by_the_elasticity() -> None:
    probe_s = np.r_[np.full(300, 1e-3), np.full(300, 1.44e-3)]
    factors = slowdowns(probe_s, np.arange(600) < 300, window=50, elasticity=0.5)
    assert factors[:275] == pytest.approx(1.0) and factors[325:] == pytest.approx(1.2)  # sqrt(1.44)


def test_a_steady_machine_has_no_slowdown_even_at_the_ends() -> None:
    factors = slowdowns(np.full(30, 2e-4), np.zeros(30, dtype=bool), window=100)
    assert factors == pytest.approx(np.ones(30))


def test_the_probe_takes_time() -> None:
    assert SpeedProbe(repeats=2).time() > 0
