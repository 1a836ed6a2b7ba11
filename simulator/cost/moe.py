"""How a step's tokens spread over a mixture-of-experts layer's experts, in expectation. No torch.

Each token picks its top-k experts. The simulator does not route real tokens, so it takes the
expected outcome for a step of T tokens under a routing distribution: expert e is picked by one
token with probability q_e = min(1, k s_e), where s_e is e's share of all picks (sum s_e = 1). Then

    expected rows of expert e      T q_e
    P(e gets no token)             (1 - q_e)^T
    expected experts touched       sum_e 1 - (1 - q_e)^T

With few tokens most experts see none or one, and a step reads the weights of only those it
touches; with many, every expert is touched and runs a GEMM over many rows (compute-bound).

routing_skew sets the shares: 0 is uniform (what a load-balanced router aims for); s > 0 gives
Zipf shares s_e proportional to 1/(e+1)^s, the measured imbalance of real MoE routers over a
batch (a few hot experts) expressed as one number. Under expert parallelism experts sit on the
ranks in a fixed shuffled order (hot experts are not all on one rank, nor spread on purpose),
and a step waits for the most loaded rank.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class ExpertLoad:
    """The expected expert work of one step on the most loaded rank (all of it without EP)."""

    active_experts: float  # experts that get at least one row
    rows: float  # (token, expert) rows they compute

    @property
    def rows_per_expert(self) -> float:
        return self.rows / self.active_experts if self.active_experts > 0 else 0.0


def expert_shares(num_experts: int, routing_skew: float = 0.0) -> list[float]:
    """Each expert's share of all picks (sums to one): uniform, or Zipf with exponent routing_skew."""
    if num_experts < 1:
        raise ValueError(f"num_experts must be at least 1, got {num_experts}")
    if routing_skew < 0:
        raise ValueError(f"routing_skew must be >= 0 (0: uniform), got {routing_skew}")
    weights = [1.0 / (e + 1) ** routing_skew for e in range(num_experts)]
    total = sum(weights)
    return [w / total for w in weights]


def placement(num_experts: int, ranks: int) -> list[list[int]]:
    """Experts (indices into expert_shares, hottest first) held by each of `ranks` ranks: a fixed
    shuffle cut into equal contiguous parts."""
    if num_experts % ranks:
        raise ValueError(f"{ranks} expert-parallel ranks cannot split {num_experts} experts evenly")
    order = list(range(num_experts))
    random.Random(0).shuffle(order)
    per_rank = num_experts // ranks
    return [order[r * per_rank:(r + 1) * per_rank] for r in range(ranks)]


def step_load(tokens: int, num_experts: int, top_k: int, routing_skew: float = 0.0,
              ranks: int = 1) -> ExpertLoad:
    """Expected expert work of a step of `tokens` tokens on its most loaded rank (ranks > 1: expert
    parallel, each rank holding num_experts / ranks experts and routing all tokens' picks to them)."""
    if tokens <= 0:
        return ExpertLoad(0.0, 0.0)
    shares = expert_shares(num_experts, routing_skew)
    pick = [min(1.0, top_k * s) for s in shares]
    worst = ExpertLoad(0.0, 0.0)
    for experts in placement(num_experts, ranks):
        active = sum(1.0 - (1.0 - pick[e]) ** tokens for e in experts)
        rows = tokens * sum(pick[e] for e in experts)
        if rows > worst.rows:
            worst = ExpertLoad(active, rows)
    return worst


def fit_routing_skew(expert_rows: list[int]) -> float:
    """The routing_skew whose shares best match measured rows per expert (e.g. LLMEngine.expert_load
    summed over layers): least squares between the measured shares, hottest first, and the Zipf
    shares of each exponent in [0, 4]."""
    from scipy.optimize import minimize_scalar

    total = sum(expert_rows)
    if total <= 0:
        raise ValueError("no routed rows to fit: serve some requests first")
    measured = sorted((r / total for r in expert_rows), reverse=True)

    def error(skew: float) -> float:
        return sum((m - s) ** 2 for m, s in zip(measured, expert_shares(len(measured), skew)))
    return float(minimize_scalar(error, bounds=(0.0, 4.0), method="bounded").x)
