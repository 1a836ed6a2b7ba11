"""Runs of steady decode steps timed ahead (StepTimer.plan_steady_run): the steps a replica may
take in bulk, each timed as StepTimer.step would time it, booked into the timer's split only for
as many as the replica ends up taking. No torch."""

from __future__ import annotations

import math
from typing import Protocol

from engine.policy.scheduler import ScheduledChunk
from simulator.cost.recipe import StepRecipe
from simulator.cost.step_parts import StepParts, StepTally


class StepTimer(Protocol):
    """What a steady run reads of its timer (simulator/cost/step_timer.py's StepTimer)."""

    split: StepTally
    recipe: StepRecipe
    _operator_scale: float
    _kv_bytes_per_token: float

    def decode_attention(self, batch: int, total_context: int, remember: bool = True) -> float: ...

    def weight_bytes(self, tokens: int) -> float: ...


class SteadyRun:
    """Steady decode steps from a start time: end_times holds those timed so far (at least one),
    at most `steps`; commit(k) books the first k into the timer's split. This base times every
    step up front; subclasses may time them as asked."""

    def __init__(self, timer: StepTimer, steps: int, end_times: list[float]) -> None:
        self.timer, self.steps, self.end_times = timer, steps, end_times

    def plan(self, count: int) -> None:
        """Time the steps up to the count-th (at most `steps`)."""

    def plan_until(self, time_s: float) -> None:
        """Time steps until one ends after time_s (an arrival then ends the run by that step), or
        all of them."""

    def commit(self, k: int) -> None:
        raise NotImplementedError


class UniformSteadyRun(SteadyRun):
    """Unpadded decode attention: the steps differ only in their decode attention, over n more
    keys each step. Steps are timed as asked: a run is often cut short by an arrival."""

    def __init__(self, timer: StepTimer, n: int, context: int, steps: int, start_s: float, base: StepParts,
                 first_extra_s: float = 0.0) -> None:
        super().__init__(timer, steps, [])
        self.n, self.first_context, self.context, self.now, self.base = n, context, context, start_s, base
        self.first_extra_s = first_extra_s
        self.decode_times: list[float] = []
        self._time(1, math.inf)

    def plan(self, count: int) -> None:
        self._time(count, math.inf)

    def plan_until(self, time_s: float) -> None:
        self._time(self.steps, time_s)

    def _time(self, count: int, until_s: float) -> None:
        """Time steps up to the count-th, stopping after the first that ends past until_s."""
        timer, n, scale = self.timer, self.n, self.timer._operator_scale
        compute_s, comm_s, prefill_s, head_s, overhead_s = (self.base.compute_s, self.base.comm_s, self.base.prefill_s,
                                                            self.base.head_s, self.base.overhead_s)
        times, decode_times, now, context = self.end_times, self.decode_times, self.now, self.context
        count = min(count, self.steps)
        while len(times) < count and (not times or times[-1] <= until_s):
            decode_s = timer.decode_attention(n, context, remember=False)
            if scale != 1.0:
                decode_s = decode_s * scale
            step_s = compute_s + comm_s + prefill_s + decode_s + head_s + overhead_s  # StepParts.total_s
            now += step_s + self.first_extra_s if not times else step_s
            times.append(now)
            decode_times.append(decode_s)
            context += n
        self.now, self.context = now, context

    def commit(self, k: int) -> None:
        timer, base, n = self.timer, self.base, self.n
        split = timer.split
        split.decode_s += sum(self.decode_times[:k]) + k * (base.compute_s + base.head_s)
        split.communication_s += k * base.comm_s
        split.overhead_s += k * base.overhead_s
        # Flops and bytes grow linearly with the context, n keys more each step.
        keys = k * self.first_context + n * k * (k - 1) // 2
        recipe = timer.recipe
        split.flops += (k * (recipe.flops_per_token * n + recipe.flops_per_sample * n)
                        + recipe.attention_flops_per_key * keys)
        split.bytes_moved += k * timer.weight_bytes(n) + timer._kv_bytes_per_token * keys
        split.steps += k


class PaddedSteadyRun(SteadyRun):
    """Padded decode batches (profiled engine devices): every step timed up front."""

    def __init__(self, timer: StepTimer, steps: int, end_times: list[float], parts: list[StepParts]) -> None:
        super().__init__(timer, steps, end_times)
        self.parts = parts

    @classmethod
    def timed(cls, timer, running, steps: int, start_s: float, first_extra_s: float) -> "PaddedSteadyRun":
        """Each step's parts from every request's context (the engine's padded groups depend on all)."""
        times: list[float] = []
        parts_of_steps: list[StepParts] = []
        now = start_s
        for k in range(steps):
            parts = timer._parts([ScheduledChunk(s.request_id, s.num_computed_tokens + k, 1, False, True)
                                  for s in running])
            now += parts.total_s + first_extra_s if k == 0 else parts.total_s
            times.append(now)
            parts_of_steps.append(parts)
        return cls(timer, steps, times, parts_of_steps)

    def commit(self, k: int) -> None:
        for parts in self.parts[:k]:
            self.timer.split.record(parts)
