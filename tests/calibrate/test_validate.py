"""Aggregation of a validation level's repeats (calibrate/validate.py); the end-to-end run is
tests/app/test_simulate_cli.py's validate test."""

import math

import pandas as pd
import pytest

from calibrate.validate import LevelResult, Measurement, error_table


def _measurement(measured: dict[str, float], predicted: dict[str, float]) -> Measurement:
    return Measurement(measured, predicted, pd.DataFrame(), pd.DataFrame(), {"total_ratio": 1.0})


def test_level_medians_error_range_and_engine_spread() -> None:
    level = LevelResult("near saturation", 10.0, [
        _measurement({"tpot_mean": 1.0, "throughput": 50.0}, {"tpot_mean": 0.9, "throughput": 50.0}),
        _measurement({"tpot_mean": 1.1, "throughput": 50.0}, {"tpot_mean": 1.1, "throughput": 51.0}),
        _measurement({"tpot_mean": 0.8, "throughput": 50.0}, {"tpot_mean": 0.9, "throughput": 49.0}),
    ])
    assert level.measured == {"tpot_mean": 1.0, "throughput": 50.0}
    assert level.errors["tpot_mean"] == pytest.approx(0.0)  # median of -10%, 0%, +12.5%
    assert level.error_range["tpot_mean"] == pytest.approx((-0.1, 0.125))
    # The engine's own repeats of the same requests: the farthest (0.8) lies 20% from the median.
    assert level.engine_spread == pytest.approx({"tpot_mean": 0.2, "throughput": 0.0})
    table = error_table([level]).set_index("metric")
    assert table.loc["tpot_mean", "engine_spread"] == pytest.approx(0.2)
    assert table.loc["tpot_mean", "within_target"] and not math.isnan(table.loc["throughput", "engine_spread"])


def test_one_repeat_has_no_engine_spread() -> None:
    level = LevelResult("light", 1.0, [_measurement({"ttft_p99": 0.3}, {"ttft_p99": 0.33})])
    assert level.engine_spread == {"ttft_p99": 0.0}
    assert level.errors["ttft_p99"] == pytest.approx(0.1)


def test_calibration_halves_mirror_around_the_level() -> None:
    """Each calibration load is replayed as far before the level as after it."""
    from calibrate.validate import CALIBRATION_LOADS, calibration_order

    before, after = calibration_order(0), calibration_order(1)
    assert sorted(before) == sorted(after) == list(enumerate(CALIBRATION_LOADS))
    timeline = before + ["level"] + after
    level = timeline.index("level")
    for entry in before:
        assert level - timeline.index(entry) == len(timeline) - 1 - timeline[::-1].index(entry) - level


def test_previous_step_tokens_restart_after_idle() -> None:
    from types import SimpleNamespace

    from calibrate.validate import previous_step_tokens

    def step(*tokens: int, idle_s: float = 0.0):
        return [SimpleNamespace(num_tokens=t) for t in tokens], 0.01, idle_s

    steps = [step(128, 1), step(1, 1), step(1, 1, 1), step(64, idle_s=0.2), step(1)]
    assert previous_step_tokens(steps) == [None, 129, 2, None, 64]
