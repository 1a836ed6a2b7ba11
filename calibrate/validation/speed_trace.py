"""A machine whose speed changes over time: step times scaled by a measured factor at each moment.

A shared machine runs the same work several percent faster or slower from one second to the next
(other tenants, caches, clocks). A fleet simulation for planning has no use for that, but replaying
a measured run does: `servecast validate` measures the machine's speed alongside the engine
(calibrate/validation/speed_probe.py) and gives the simulator the same slowdowns at the same times, so what is
left between prediction and measurement is the model's error, not the machine's moods.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from engine.policy.scheduler import ScheduledChunk
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import StepTimer
from simulator.cost.types import CostReader


@dataclass(frozen=True)
class SpeedTrace:
    """Time-multiplying factors (1: the cost model's speed; 1.1: every step 10 % longer) at points
    of the simulated timeline; in between linearly interpolated, before the first and after the last
    point held."""

    times_s: tuple[float, ...]
    factors: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.times_s) != len(self.factors) or not self.times_s:
            raise ValueError(f"a speed trace needs as many factors as times, at least one: got "
                             f"{len(self.times_s)} times and {len(self.factors)} factors")
        if any(b < a for a, b in zip(self.times_s, self.times_s[1:])):
            raise ValueError("a speed trace's times must not decrease: sort them")
        if not all(f > 0 for f in self.factors):
            raise ValueError("speed factors must be positive (they multiply step times)")

    def at(self, t: float) -> float:
        return float(np.interp(t, self.times_s, self.factors))

    def mean(self) -> float:
        """The factor averaged over the trace's span (its only factor for a one-point trace)."""
        if len(self.times_s) == 1 or self.times_s[-1] == self.times_s[0]:
            return float(np.mean(self.factors))
        return float(np.trapezoid(self.factors, self.times_s) / (self.times_s[-1] - self.times_s[0]))


class SpeedTracedTimer(StepTimer):
    """StepTimer whose every step (with its wakeup after idle and its shape change) takes the
    trace's factor at the step's start. The replica tells it the time (follows_time); steady decode
    runs are timed step by step, since the factor may change within one."""

    follows_time: ClassVar[bool] = True
    times_steady_runs: ClassVar[bool] = False

    def __init__(self, cost_model: CostReader, shape: ReplicaShape, trace: SpeedTrace) -> None:
        super().__init__(cost_model, shape)
        self.trace, self.now = trace, 0.0

    def step(self, chunks: Sequence[ScheduledChunk]) -> float:
        return super().step(chunks) * self.trace.at(self.now)

    def wakeup(self, idle_s: float) -> float:
        return super().wakeup(idle_s) * self.trace.at(self.now)

    def shape_change(self, previous_tokens: int | None, tokens: int) -> float:
        return super().shape_change(previous_tokens, tokens) * self.trace.at(self.now)
