"""Intervals widen for what a configuration crosses beyond the engine profile's fitted runs, and
every answer says what it crossed (simulator/fleet/extrapolation.py)."""

from __future__ import annotations

import math

import pytest

from simulator.catalog.engines import load_engine
from simulator.fleet.extrapolation import extrapolation
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload

SPEC = "synthetic:num=60,input=uniform(100,600),output=uniform(20,120),rate=4"


def spread(interval) -> float:
    return math.log(interval[1] / interval[0])


def test_inside_the_fitted_runs_nothing_widens() -> None:
    engine = load_engine("vllm-v0.15")
    inside = extrapolation(engine, "llama-3.1-70b", "h100-sxm", 4, False)
    assert inside.across == () and all(inside.factor(m) == 1.0 for m in engine.residuals)
    summary = simulate(SimConfig(model="llama-3.1-70b", hardware="h100-sxm", tp=4), load_workload(SPEC)).summary
    assert summary.extrapolated_across == []
    value = summary.ttft_s.mean
    assert summary.intervals["ttft_s.mean"] == pytest.approx(list(engine.interval("ttft_mean", value)))


def test_another_gpu_model_and_tp_widen_and_are_named() -> None:
    engine = load_engine("vllm-v0.15")
    crossed = extrapolation(engine, "qwen3-30b-a3b", "h200", 16, True)
    assert any("h200" in words and "h100-sxm" in words for words in crossed.across)
    assert any("qwen3-30b-a3b" in words for words in crossed.across) and any("tp=16" in w for w in crossed.across)
    assert all(crossed.factor(m) >= extrapolation(engine, "llama-3.1-70b", "h200", 4, False).factor(m) > 1.0
               for m in engine.residuals)
    same_gpu = simulate(SimConfig(model="llama-3.1-8b", hardware="h100-sxm"), load_workload(SPEC)).summary
    other_gpu = simulate(SimConfig(model="llama-3.1-8b", hardware="h200"), load_workload(SPEC)).summary
    assert any("h200" in words for words in other_gpu.extrapolated_across)
    for key in same_gpu.intervals:
        assert spread(other_gpu.intervals[key]) > spread(same_gpu.intervals[key])


def test_a_device_on_scaled_speeds_widens_past_one_that_borrows_a_siblings() -> None:
    engine = load_engine("vllm-v0.15")
    scaled = extrapolation(engine, "llama-3.1-70b", "mi300x", 4, False)
    borrowed = extrapolation(engine, "llama-3.1-70b", "h200", 4, False)
    assert any("scaled, not fitted" in words for words in scaled.across)
    assert not any("scaled, not fitted" in words for words in borrowed.across)
    assert scaled.factor("tpot") > borrowed.factor("tpot") > 1.0
