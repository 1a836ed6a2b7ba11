"""Aggregation of a validation level's repeats (calibrate/validation/fidelity.py); the end-to-end run is
tests/app/test_simulate_cli.py's validate test."""

import math

import pandas as pd
import pytest

from calibrate.validation.fidelity import measurement_order
from calibrate.validation.results import LevelResult, Measurement, error_table


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
    # Throughput's error (median of 0%, +2%, -2%) is 0, and so is the engine's spread of it.
    assert table.loc["throughput", "within_engine_spread"] and table.loc["tpot_mean", "within_engine_spread"]


def test_a_miss_beyond_the_engines_spread_is_told_apart() -> None:
    from app.validate_command import _verdict

    steady = LevelResult("overloaded", 5.0, [  # the engine repeats itself exactly; the simulator is 20% off
        _measurement({"ttft_p50": 1.0, "tpot_mean": 0.10}, {"ttft_p50": 1.2, "tpot_mean": 0.10}),
        _measurement({"ttft_p50": 1.0, "tpot_mean": 0.10}, {"ttft_p50": 1.2, "tpot_mean": 0.104}),
    ])
    noisy = LevelResult("light", 1.0, [  # the engine's repeats lie 23% from their median; the simulator misses by 15%
        _measurement({"ttft_p50": 1.0}, {"ttft_p50": 1.15}),
        _measurement({"ttft_p50": 1.6}, {"ttft_p50": 1.84}),
    ])
    table = error_table([steady, noisy]).set_index(["level", "metric"])
    assert not table.loc[("overloaded", "ttft_p50"), "within_engine_spread"]
    assert table.loc[("light", "ttft_p50"), "within_engine_spread"]
    assert _verdict(table.reset_index()) == ("1 of 3 errors within target; of the 2 misses, 1 is no larger than "
                                             "the engine's own spread over the repeats")


def test_one_repeat_has_no_engine_spread() -> None:
    level = LevelResult("light", 1.0, [_measurement({"ttft_p99": 0.3}, {"ttft_p99": 0.33})])
    assert level.engine_spread == {"ttft_p99": 0.0}
    assert level.errors["ttft_p99"] == pytest.approx(0.1)
    assert not error_table([level])["within_engine_spread"].any()


def test_calibration_halves_mirror_around_the_level() -> None:
    """Each calibration load is replayed as far before the level as after it."""
    from calibrate.validation.level_measurement import CALIBRATION_LOADS, calibration_order

    before, after = calibration_order(0), calibration_order(1)
    assert sorted(before) == sorted(after) == list(enumerate(CALIBRATION_LOADS))
    timeline = before + ["level"] + after
    level = timeline.index("level")
    for entry in before:
        assert level - timeline.index(entry) == len(timeline) - 1 - timeline[::-1].index(entry) - level


def test_previous_step_tokens_restart_after_idle() -> None:
    from types import SimpleNamespace

    from calibrate.validation.recorded_steps import RecordedStep, previous_step_tokens

    def step(*tokens: int, idle_s: float = 0.0):
        return RecordedStep([SimpleNamespace(num_tokens=t) for t in tokens], 0.01, idle_s)

    steps = [step(128, 1), step(1, 1), step(1, 1, 1), step(64, idle_s=0.2), step(1)]
    assert previous_step_tokens(steps) == [None, 129, 2, None, 64]


def test_burn_in_serves_three_pools_of_blocks_and_leaves_the_engine_idle() -> None:
    """The burn-in takes requests until they need BURN_IN_POOL_TURNS pools of KV blocks (the last
    one crossing the line), serves them all, and records nothing."""
    from calibrate.validation.level_measurement import BURN_IN_POOL_TURNS, burn_in
    from calibrate.validation.settings import ValidationSetup
    from engine import LLMEngine

    model = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    setup = ValidationSetup(model=model, num_blocks=16, max_total_tokens=64, max_num_batched_tokens=64)
    engine = LLMEngine.from_config(model, setup.engine_config(), seed=0)
    fresh_order = engine.scheduler.block_manager.free_order()
    served = burn_in(engine, setup, seed=5)
    blocks = [engine.scheduler.block_manager.blocks_needed(p.prompt_tokens + p.output_tokens)
              for p in setup.lengths(served, 5)]
    need = BURN_IN_POOL_TURNS * setup.num_blocks
    assert sum(blocks) >= need > sum(blocks[:-1])
    assert not engine.has_unfinished_requests()
    # Every block is free again, but no longer handed out in the fresh engine's order.
    assert sorted(engine.scheduler.block_manager.free_order()) == sorted(fresh_order)
    assert engine.scheduler.block_manager.free_order() != fresh_order


def test_measurements_go_round_by_round_over_the_levels() -> None:
    order = measurement_order(["light", "near saturation", "overloaded"], 2)
    assert [(name, repeat) for _, name, repeat in order] == [
        ("light", 0), ("near saturation", 0), ("overloaded", 0), ("light", 1), ("near saturation", 1), ("overloaded", 1)]
    # The level index (which seeds the measurement) stays the level's, whatever the round.
    assert {(index, name) for index, name, _ in order} == {(0, "light"), (1, "near saturation"), (2, "overloaded")}


def test_recorded_steps_carry_their_probe_and_the_engine_never_sees_it() -> None:
    """With a probe, every recorded step has the probe's time before it; the engine's clock (which
    stamps the requests) stopped for exactly those probes, and the steps sit on that clock."""
    from calibrate.validation.speed_probe import ProbedClock, SpeedProbe
    from calibrate.validation.level_measurement import engine_requests
    from calibrate.validation.recorded_steps import record_steps
    from calibrate.validation.settings import ValidationSetup, workload_at
    from engine import LLMEngine
    from engine.replay import replay

    model = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    setup = ValidationSetup(model=model, num_blocks=16, max_total_tokens=64, max_num_batched_tokens=64)
    engine = LLMEngine.from_config(model, setup.engine_config(), seed=0)
    steps = record_steps(engine, SpeedProbe(repeats=1))
    assert isinstance(engine.clock, ProbedClock)
    outputs = replay(engine, engine_requests(workload_at(setup.lengths(4, 3), 50.0, 3, "t"), 64, 3))
    assert steps and all(s.probe_s > 0 for s in steps)
    assert engine.clock.paused_s == pytest.approx(sum(s.probe_s for s in steps), rel=1e-12)
    assert min(o.arrival_time for o in outputs) <= steps[0].start_s
    assert steps[-1].start_s <= max(o.finish_time for o in outputs) <= steps[-1].start_s + steps[-1].seconds
    assert [s.start_s for s in steps] == sorted(s.start_s for s in steps)


def test_calibration_steps_are_read_at_the_usual_speed() -> None:
    """A step taken while the machine ran twice as slow counts as half its time in the fit (less
    the host time the simulator adds on its own, which is not scaled)."""
    from types import SimpleNamespace

    from calibrate.validation.recorded_steps import RecordedStep, step_observations
    from simulator.cost.model import CostModel
    from simulator.fleet.sim_config import SimConfig

    config = SimConfig(model="llama-3.1-8b", hardware="h100-sxm")
    chunk = SimpleNamespace(num_tokens=1, start=99, samples=True)
    steps = [RecordedStep([chunk], 0.02, 0.0), RecordedStep([chunk, chunk], 0.03, 0.0)]
    cost_model = CostModel.load(config.hardware)
    usual = step_observations(steps, config, cost_model)
    slow = step_observations(steps, config, cost_model, [2.0, 1.5])
    assert usual[0].forward_s - slow[0].forward_s == pytest.approx(0.01)
    assert usual[1].forward_s - slow[1].forward_s == pytest.approx(0.01)

