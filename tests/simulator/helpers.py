"""Shared pieces of the simulator tests."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import pytest

from simulator.cost.model import CostModel
from simulator.fleet.sim_config import SimConfig
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import StepTimer
from simulator.workload.requests import Workload, make_workload


class FixedStepTimer(StepTimer):
    """Every step takes the same time (queueing-theory checks)."""

    times_steady_runs = False  # plan_steady_run would time steps from the cost model

    def __init__(self, config: SimConfig, seconds: float) -> None:
        super().__init__(CostModel.load(config.hardware), ReplicaShape(config.model_spec()))
        self.seconds = seconds

    def step(self, chunks: Sequence) -> float:
        self.last_sampled = sum(1 for c in chunks if c.samples)
        self.split.steps += 1
        return self.seconds


def workload(rows: list[tuple[float, int, int]], name: str = "test") -> Workload:
    return make_workload(name, [(a, p, o, ()) for a, p, o in rows])


def assert_same_simulation(a, b, summary_keys: Sequence[str]) -> None:
    """Two SimResults of one workload agree: every request's row, and these summary entries."""
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=False, rtol=1e-12)
    ours, theirs = a.summary.to_dict(), b.summary.to_dict()
    for key in summary_keys:
        assert ours[key] == pytest.approx(theirs[key], rel=1e-9), key
