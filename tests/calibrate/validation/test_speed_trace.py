"""A machine whose speed changes over time: step times scaled by a trace of factors."""

from __future__ import annotations

import pytest

from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from calibrate.validation.speed_trace import SpeedTrace, SpeedTracedTimer
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import StepTimer
from simulator.cost.model import CostModel
from tests.simulator.helpers import workload

# servecast: the step times alone, none of a serving engine's request latency or output delay
SMALL = dict(model="llama-3.1-8b", hardware="h100-sxm", engine="servecast")


def test_bad_traces_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="as many factors as times"):
        SpeedTrace((0.0, 1.0), (1.0,))
    with pytest.raises(ValueError, match="sort them"):
        SpeedTrace((1.0, 0.0), (1.0, 1.0))
    with pytest.raises(ValueError, match="positive"):
        SpeedTrace((0.0,), (0.0,))


def test_factors_are_interpolated_and_held_at_the_ends() -> None:
    trace = SpeedTrace((1.0, 3.0), (1.0, 2.0))
    assert trace.at(0.0) == 1.0 and trace.at(2.0) == 1.5 and trace.at(9.0) == 2.0
    assert trace.mean() == pytest.approx(1.5)


def _timers(config: SimConfig, trace: SpeedTrace) -> tuple[StepTimer, SpeedTracedTimer]:
    model = config.model_spec()
    cost_model = CostModel.load(config.hardware)
    shape = ReplicaShape(model, dtype=config.compute_dtype)
    return StepTimer(cost_model, shape), SpeedTracedTimer(cost_model, shape, trace)


def test_steps_take_the_factor_at_their_start() -> None:
    """Request a runs while the machine is at its usual speed, b (arriving later) after it turned
    three times slower: a's timings are the plain simulation's, b's three times as long."""
    config = SimConfig(**SMALL)
    rows = [(0.0, 300, 40), (100.0, 200, 30)]
    plain_timer, traced_timer = _timers(config, SpeedTrace((0.0, 50.0, 51.0), (1.0, 1.0, 3.0)))
    plain = simulate(config, workload(rows), timer=plain_timer, bulk_decodes=False).requests.set_index("request_id")
    traced = simulate(config, workload(rows), timer=traced_timer).requests.set_index("request_id")
    a, b = plain.index
    assert plain.loc[a, "e2e_s"] < 50
    for column in ("ttft_s", "tpot_s", "e2e_s"):
        assert traced.loc[a, column] == pytest.approx(plain.loc[a, column], rel=1e-12)
        assert traced.loc[b, column] == pytest.approx(3 * plain.loc[b, column], rel=1e-9)
