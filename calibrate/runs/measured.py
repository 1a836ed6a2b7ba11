"""Replaying measured runs through the simulator: each run's workload and server as a SimConfig,
and the simulated figures beside the measured ones. No torch.

A measured run (MeasuredRun) is a summary of real serving: a row of a runs table
(calibrate/runs/tables.py RealRun) or a replay folder (calibrate/runs/sources.py TraceRun). The fit
(calibrate/fitting/engine_profile.py) reads runs through this interface alone."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from calibrate.runs.tables import SATURATED_TTFT_MS
from simulator.cost.model import CostModel
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.requests import Workload


class MeasuredRun(Protocol):
    id: str
    hardware: str  # == sim_config().hardware
    tp: int
    measured: dict[str, float]  # real_runs.METRICS the run has, ms

    @property
    def family(self) -> str:  # the model's name, for leave-one-model-out
        ...

    @property
    def saturated(self) -> bool:  # the server could not keep up (queues of minutes)
        ...

    @property
    def duration_s(self) -> float:  # the workload's span at time scale 1
        ...

    def sim_config(self) -> SimConfig:  # the server as the simulator sees it
        ...

    def workload(self, time_scale: float = 1.0) -> Workload:  # what was sent (shortened, where a run can be)
        ...

    def figures(self, summary) -> dict[str, float]:  # the METRICS of a simulation's summary, as measured
        ...


@dataclass(frozen=True)
class Replayed:
    run: MeasuredRun
    predicted: dict[str, float]  # METRICS, ms

    @property
    def saturated(self) -> bool:
        return self.predicted["ttft_mean"] > SATURATED_TTFT_MS

    def error(self, metric: str) -> float | None:
        """Signed relative error (predicted / measured - 1), None where the run has no measurement."""
        measured = self.run.measured.get(metric)
        return None if measured is None else self.predicted[metric] / measured - 1.0


def replay(run: MeasuredRun, cost_model: CostModel, time_scale: float = 1.0,
           config: SimConfig | None = None) -> Replayed:
    """Simulate the run (shortened by time_scale where it can be) on cost_model; figures in ms."""
    config = config or run.sim_config()
    summary = simulate(config, run.workload(time_scale), cost_model=cost_model).summary
    predicted = run.figures(summary)
    if summary.num_finished < summary.num_requests:  # requests that could never run: it did not keep up
        predicted = {k: (math.inf if k.startswith("ttft") else v) for k, v in predicted.items()}
    return Replayed(run, predicted)
