"""The engine's steps as a validation records them (record_steps), read as observations the
framework terms are fitted on (step_observations), and the cost model's step times against them
(step_errors), all timed with the validation's one StepTimer (validation_timer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from calibrate.validation.speed_probe import ProbedClock, SpeedProbe
from simulator.cost.model import CostModel
from simulator.fleet.sim_config import SimConfig

if TYPE_CHECKING:
    from calibrate.validation.speed_trace import SpeedTrace
    from simulator.cost.step_timer import StepTimer


class RecordedStep(NamedTuple):
    """One engine step as record_steps saw it; times on the engine's clock."""

    chunks: list
    seconds: float
    idle_s: float  # how long the engine had been idle before it (0 when the step before left work)
    probe_s: float = 0.0  # the speed probe's time just before it (0: no probe)
    start_s: float = 0.0


def record_steps(engine, probe: SpeedProbe | None = None) -> list[RecordedStep]:
    """Wrap engine.step to record each step's scheduled chunks, wall time, and how long the engine
    had been idle before it. With a probe, time it before every step on a clock that stops meanwhile
    (given to the engine, so replays and requests never see the probe's time)."""
    steps: list[RecordedStep] = []
    scheduler, step = engine.scheduler, engine.step
    schedule = scheduler.schedule
    last: list = [None]
    previous: dict = {"end": None, "left_work": True}
    clock = engine.clock = ProbedClock() if probe is not None else engine.clock

    def recording_schedule(now: float = 0.0):
        last[0] = schedule(now)
        return last[0]

    def timed_step():
        probe_s = clock.probe(probe) if probe is not None else 0.0
        started = clock()
        idle_s = 0.0 if previous["left_work"] or previous["end"] is None else started - previous["end"]
        outputs = step()
        ended = clock()
        if last[0] is not None and not last[0].is_empty:
            steps.append(RecordedStep(list(last[0].chunks), ended - started, idle_s, probe_s, started))
            previous["end"], previous["left_work"] = ended, engine.has_unfinished_requests()
        return outputs

    scheduler.schedule = recording_schedule
    engine.step = timed_step
    return steps


def step_observations(steps: Sequence[RecordedStep], config: SimConfig, cost_model: CostModel,
                      slowdown: Sequence[float] | None = None) -> list:
    """Recorded engine steps as StepObservations. Forward time: the step (divided by the machine's
    slowdown at it, if given) less the scheduler's time and, after idle, less the wakeup the
    simulator adds on its own (CostModel.predict_idle_wakeup): left in, the fit would charge every
    step of the shapes that follow idle with it."""
    from simulator.cost.types import Chunk, StepObservation

    model = config.model_spec()
    slowdown = np.ones(len(steps)) if slowdown is None else slowdown
    out = []
    for step, previous_tokens, factor in zip(steps, previous_step_tokens(steps), slowdown):
        cs = [Chunk(c.num_tokens, c.start + c.num_tokens, c.samples) for c in step.chunks]
        host = cost_model.predict("step_overhead", len(cs)).time_s
        if step.idle_s > 0:
            host += cost_model.predict("idle_wakeup", step.idle_s).time_s
        out.append(StepObservation(cs, model, config.compute_dtype, config.block_size, step.seconds / factor - host,
                                   previous_tokens))
    return out


def previous_step_tokens(steps: Sequence[RecordedStep]) -> list[int | None]:
    """For each recorded step, the tokens of the step just before it, None where it came first or
    after idle (the simulator's StepTimer.shape_change convention)."""
    out, previous = [], None
    for step in steps:
        out.append(None if step.idle_s > 0 else previous)
        previous = sum(c.num_tokens for c in step.chunks)
    return out


def validation_timer(config: SimConfig, cost_model: CostModel, trace: SpeedTrace | None = None) -> StepTimer:
    """The StepTimer the validation times engine steps with (one replica, tp 1, unquantized
    weights); with a SpeedTrace, one that scales each step by the trace at the step's start. The
    level's simulation and its step-time errors use the same one, so they agree on every step."""
    from simulator.cost.shape import ReplicaShape
    from simulator.cost.step_timer import StepTimer
    from calibrate.validation.speed_trace import SpeedTracedTimer

    model, _, _ = config.check()
    shape = ReplicaShape(model, dtype=config.compute_dtype, kv_dtype=config.cache_dtype, block_size=config.block_size)
    return StepTimer(cost_model, shape) if trace is None else SpeedTracedTimer(cost_model, shape, trace)


def step_errors(config: SimConfig, steps: Sequence[RecordedStep], cost_model: CostModel,
                slowdown: Sequence[float] | None = None) -> dict:
    """The cost model's step time (with the wakeup after idle and the shape change, as the
    simulator adds them, and times the machine's slowdown at the step if given) against every step
    the engine took: how much of the request-level error is step time (rather than scheduling
    dynamics)."""
    timer = validation_timer(config, cost_model)
    measured = np.array([s.seconds for s in steps])
    factors = np.ones(len(steps)) if slowdown is None else np.asarray(slowdown, dtype=float)
    predicted = factors * np.array([timer.step(s.chunks) + timer.wakeup(s.idle_s)
                                    + timer.shape_change(previous, sum(c.num_tokens for c in s.chunks))
                                    for s, previous in zip(steps, previous_step_tokens(steps))])
    decode = np.array([all(c.num_tokens == 1 for c in s.chunks) for s in steps])
    after_idle = np.array([s.idle_s > 0 for s in steps])
    out = {"steps": int(len(steps)), "total_ratio": float(predicted.sum() / measured.sum()),
           "median_ratio": float(np.median(predicted / measured))}
    if decode.any():
        out["decode_median_ratio"] = float(np.median(predicted[decode] / measured[decode]))
    if (~decode).any():
        out["prefill_median_ratio"] = float(np.median(predicted[~decode] / measured[~decode]))
    if after_idle.any():
        out["after_idle_median_ratio"] = float(np.median(predicted[after_idle] / measured[after_idle]))
        out["after_idle_steps"] = int(after_idle.sum())
    return out
