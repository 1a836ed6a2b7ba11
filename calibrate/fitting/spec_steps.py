"""Speculative decoding's steps as the engine really runs them, for fitting the cost models.

Operators timed alone miss what a speculative step adds around them: the target's verification
step (every draft row through the LM head, per-request acceptance) and the draft's proposal loop
(views, draws, one forward per draft position). Recording the target's and the draft's forwards
in calibration runs gives StepObservations on which calibrate.fitting.device.fit_framework fits each model's
framework terms -- the way `servecast validate` calibrates on other requests than it checks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.step_plan import is_short_chunk
from simulator.cost.model import CostModel
from simulator.cost.types import Chunk, StepObservation
from simulator.catalog.models import ModelSpec


@dataclass
class SpecStepLog:
    """Recorded forwards: (chunks, seconds) of the target's steps and of the draft's forwards."""

    target: list[tuple[list[Chunk], float]] = field(default_factory=list)
    draft: list[tuple[list[Chunk], float]] = field(default_factory=list)


def record_spec_steps(engine) -> SpecStepLog:
    """Wrap an engine's runner and draft proposer to record every forward (from now on).

    A target step is timed over ModelRunner.execute (packing, forward, LM head, sampling and
    verification; the scheduler's own time is the cost model's step_overhead). A draft forward is
    timed over its own forward plus an equal share of its proposal round's remaining work."""
    log = SpecStepLog()
    runner, proposer = engine.runner, engine.proposer
    execute = runner.execute

    def timed_execute(out, requests, *args, **kwargs):
        chunks = [Chunk(c.num_tokens, c.start + c.num_tokens, c.samples,
                        verify=c.draft_slots(len(requests[c.request_id].token_ids)) > 0) for c in out.chunks]
        started = time.perf_counter()
        result = execute(out, requests, *args, **kwargs)
        log.target.append((chunks, time.perf_counter() - started))
        return result

    runner.execute = timed_execute
    if proposer is None or not hasattr(proposer, "_forward"):
        return log
    forward, propose = proposer._forward, engine._propose
    round_forwards: list[int] = []  # indices in log.draft of the current proposal round's forwards

    def timed_forward(step, views):
        # The draft attends a short chunk over a cached context as verification does (plan_step's batch_short).
        chunks = [Chunk(c.num_tokens, c.start + c.num_tokens, c.samples, verify=is_short_chunk(c.start, c.num_tokens))
                  for c in step.chunks]
        started = time.perf_counter()
        result = forward(step, views)
        round_forwards.append(len(log.draft))
        log.draft.append((chunks, time.perf_counter() - started))
        return result

    def timed_propose(out, requests):
        round_forwards.clear()
        started = time.perf_counter()
        result = propose(out, requests)
        if round_forwards:
            rest = (time.perf_counter() - started - sum(log.draft[i][1] for i in round_forwards)) / len(round_forwards)
            for i in round_forwards:
                log.draft[i] = (log.draft[i][0], log.draft[i][1] + rest)
        return result

    proposer._forward = timed_forward
    engine._propose = timed_propose
    return log


def target_observations(log: SpecStepLog, model: ModelSpec, dtype: str, block_size: int) -> list[StepObservation]:
    return [StepObservation(chunks, model, dtype, block_size, seconds) for chunks, seconds in log.target]


def draft_observations(log: SpecStepLog, model: ModelSpec, dtype: str, block_size: int,
                       draft_costs: CostModel) -> list[StepObservation]:
    """The draft's forwards, less the scheduler overhead its step timer adds to every draft step
    (the engine runs no scheduler between draft forwards; its proposal loop stands in for one)."""
    return [StepObservation(chunks, model, dtype, block_size,
                            max(seconds - draft_costs.predict("step_overhead", len(chunks)).time_s, 0.0))
            for chunks, seconds in log.draft]
