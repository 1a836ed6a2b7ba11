"""Bounds before simulations: how few replicas of a candidate could possibly serve a traffic, and
how much decode throughput a dollar buys on it, from step times alone. No torch.

A replica's time goes to its steps. Its decode throughput is at most B / step(B), B decodes at the
shortest context, where B is as many sequences as its KV cache holds side by side: by Little's
law the average batch is at most the KV tokens over the footprint a request holds on average
while it decodes, E[O (P + O/2)] / E[O] tokens (P prompt, O output), and B / step(B) is concave in
B (a step is a fixed cost plus a cost per sequence), so no mix of batches beats the average.
Prefill costs at least the per-token time of a full chunk (max_num_batched_tokens prompt tokens
in one step). So n replicas serve the traffic only if n >= rate x E[O] x step(B) / B and n >= rate
x E[P] x chunk time / chunk tokens. The floor taken is SLACK x the larger of the two (what the
bound leaves out -- the spread of lengths, prefix hits -- cannot make it overshoot); the planner
checks it never exceeds the replicas it simulates (tests/simulator/plan/test_fast_search.py).

Candidates the bound does not model one replica of (disaggregated pools, pipeline or context
parallelism, speculative decoding: several tokens a step) get the trivial bound of 1 replica;
their throughput per dollar, which orders the search, is still that of their plain replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.policy.scheduler import ScheduledChunk
from simulator.cost.step_timer import StepTimer
from simulator.fleet.costs import cost_model_for
from simulator.fleet.fleet import replica_shape
from simulator.plan.capacity import Candidate, PlanSpec

SLACK = 0.8  # the floor is this fraction of the throughput bound


@dataclass(frozen=True)
class ReplicaBound:
    replicas: int  # no fewer replicas can meet the SLOs at this traffic
    usd_per_replica: float | None  # an hour of one replica (a disaggregated fleet's unit: P + D); None: unpriced
    usd_per_token_s: float  # $/hour per decode token/s of one replica: the search's order, cheapest first

    @property
    def usd_per_hour(self) -> float | None:
        """Of the fewest replicas the bound allows."""
        return None if self.usd_per_replica is None else self.replicas * self.usd_per_replica


def replica_bound(spec: PlanSpec, candidate: Candidate, rate_scale: float = 1.0) -> ReplicaBound:
    """The candidate's bound at rate_scale x the trace's traffic. Raises ValueError (with the
    reason the simulation would give) for a candidate that cannot run at all."""
    fleet = spec.config(candidate, 1)
    price = fleet.usd_per_hour()
    pools = fleet.pool_configs() if candidate.disaggregate else (fleet,)
    config = pools[-1]  # the decode pool's replica
    model, _, plan = config.check()
    for pool in pools[:-1]:
        pool.check()  # a disaggregated fleet's prefill pool must run too
    timer = StepTimer(cost_model_for(config), replica_shape(config, model))
    workload = spec.probe(rate_scale)
    prompts = [r.prompt_tokens for r in workload.requests]
    outputs = [r.output_tokens for r in workload.requests]
    footprint = sum(o * (p + o / 2) for p, o in zip(prompts, outputs)) / max(1, sum(outputs))
    batch = max(1, min(config.max_num_seqs, int(plan.kv_tokens / max(1.0, footprint))))
    decode_s = timer.step([ScheduledChunk(str(i), 1, 1, False, True) for i in range(batch)])
    per_token_s = decode_s / batch
    usd_per_token_s = (price if price is not None else math.inf) * per_token_s
    simple = not (candidate.disaggregate or candidate.pp > 1 or candidate.cp > 1 or candidate.speculative)
    # Closed-loop clients send no faster than they are served: their traffic has no rate to bound.
    if not simple or workload.duration_s <= 0 or workload.clients is not None:
        return ReplicaBound(1, price, usd_per_token_s)
    chunk = config.max_num_batched_tokens
    prefill_s = timer.step([ScheduledChunk("p", 0, chunk, True, True)]) / chunk
    rate = len(workload) / workload.duration_s
    need = max(rate * sum(outputs) / len(outputs) * per_token_s, rate * sum(prompts) / len(prompts) * prefill_s)
    return ReplicaBound(max(1, math.ceil(SLACK * need)), price, usd_per_token_s)
