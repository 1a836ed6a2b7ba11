"""A device's own speeds fitted on its runs, the engine's shared terms held
(calibrate/fitting/device_speeds.py), and a scaled device's fitted speeds over its scaled ones."""

from __future__ import annotations

from dataclasses import replace

import pytest

from calibrate.fitting.device_speeds import FITTED, fit_device_speeds, with_speeds
from calibrate.fitting.engine_profile import predict
from calibrate.runs.closed_loop import ClosedLoopRun
from simulator.catalog.engines import load_engine


def small_run(tpot_ms: float) -> ClosedLoopRun:
    return ClosedLoopRun("TEST", "0.17", "mi300x", "llama-3.1-8b", 1, "bf16", 128, 64, 4, 8, "mean", tpot_ms)


def test_fitted_speeds_replace_only_their_own_on_a_scaled_device() -> None:
    base = load_engine("vllm-v0.15")
    scaled = base.speeds_on("mi300x")
    mine = with_speeds(base, "mi300x", {"moe": 2.0}).speeds_on("mi300x")
    assert mine["moe"] == 2.0
    assert {k: v for k, v in mine.items() if k != "moe"} == {k: v for k, v in scaled.items() if k != "moe"}
    assert with_speeds(base, "mi300x", {"moe": 2.0}).speeds_on("h100-sxm") == base.speeds_on("h100-sxm")


def test_a_device_fit_moves_its_speeds_toward_its_runs_and_holds_the_shared_terms() -> None:
    base = load_engine("vllm-v0.15")
    predicted = predict(base, small_run(1.0), 1.0).predicted["tpot"]
    run = small_run(1.5 * predicted)  # the device is half again slower than its scaled speeds say
    fitted, speeds = fit_device_speeds(base, [run], "mi300x")
    after = predict(fitted, run, 1.0).predicted["tpot"]
    assert abs(after / run.tpot_ms - 1) < 0.5 * abs(predicted / run.tpot_ms - 1)
    assert set(speeds) == set(FITTED) and speeds != {k: base.speeds_on("mi300x").get(k) for k in FITTED}
    assert (fitted.scales, fitted.framework, fitted.request_s) == (base.scales, base.framework, base.request_s)
    assert fitted.speeds_on("h100-sxm") == base.speeds_on("h100-sxm")
    with pytest.raises(ValueError, match="mi300x only"):
        fit_device_speeds(base, [replace(run, hardware="h200")], "mi300x")
