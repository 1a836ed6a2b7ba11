"""Capacity planning: for each candidate deployment, the fewest replicas that meet every SLO. No torch.

A candidate is one way to serve the model (accelerator x weight precision x TP x PP x CP x speculation).
For each, the planner simulates the trace on a growing fleet -- 1, 2, 4, ... replicas until the SLOs
hold, then bisects between the last fleet that failed and the first that held -- so a candidate costs
O(log replicas) simulations, not a grid. The search relies on one property of serving: more replicas
behind the same router never make latency worse (each sees less load). A configuration that cannot
hold the model, or meets the SLOs with no fleet up to max_replicas, is reported with the reason.

Headroom is the largest factor on the point's traffic (x its rate) the chosen fleet still meets the
SLOs at, found by bisection to 5% (64 at most); none for a trace that arrives all at once. Under
closed-loop clients (concurrency=C) the traffic is the clients: x2 is 2C of them, and the SLOs
are met at a given concurrency.

Every rate is probed on the same stretch of time (PlanSpec.probe): the trace compressed to the rate,
then played again back to back until it spans the trace's own duration or min_duration_s, whichever
is longer, and holds min_requests. A trace merely compressed lasts seconds at a high rate and
measures its start-up transient, which a larger fleet leaves later than a smaller one (headroom
grew faster than the fleet); a stretch of many request lifetimes measures the steady state, where
twice the replicas absorb about twice the traffic. A p99 rests on min_requests / 100 requests at
least.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from simulator.catalog.engines import EngineProfile, residual_metric
from simulator.cost.model import CostModel
from simulator.fleet.costs import VALIDATED, cost_basis, cost_model_for
from simulator.fleet.extrapolation import Extrapolation, extrapolation
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig, parse_pools
from simulator.fleet.summary import RunSummary
from simulator.workload.requests import Workload


@dataclass(frozen=True)
class Candidate:
    hardware: str
    quant: str = "bf16"
    tp: int = 1
    pp: int = 1
    speculative: str | None = None
    num_speculative_tokens: int = 0
    acceptance: float | None = None
    draft_model: str | None = None
    expert_parallel: bool = False  # MoE models: whole experts per TP rank
    kv_offload_gb: float = 0.0  # a host-memory tier for the prefix cache, GB per replica
    # Prefill/decode disaggregation "P:D": a fleet of n is n x P prefill and n x D decode replicas.
    disaggregate: str | None = None
    cp: int = 1  # context-parallel ranks per replica (both pools' under disaggregation)

    @property
    def label(self) -> str:
        draft = f":{self.draft_model}" if self.draft_model else ""
        accept = f"@{self.acceptance:g}" if self.acceptance is not None else ""
        spec = f" spec={self.speculative}{draft}x{self.num_speculative_tokens}{accept}" if self.speculative else ""
        pp = f" pp={self.pp}" if self.pp > 1 else ""
        cp = f" cp={self.cp}" if self.cp > 1 else ""
        ep = " ep" if self.expert_parallel else ""
        offload = f" cpu-kv={self.kv_offload_gb:g}GB" if self.kv_offload_gb else ""
        split = f" pd={self.disaggregate}" if self.disaggregate else ""
        return f"{self.hardware} {self.quant} tp={self.tp}{ep}{pp}{cp}{spec}{split}{offload}"


@dataclass(frozen=True)
class PlanSpec:
    """What every candidate is planned for: the model, the traffic and the SLOs."""

    model: str
    workload: Workload
    slo: dict[str, float]
    max_replicas: int = 256
    seed: int = 0
    # Further SimConfig fields shared by every candidate (block_size, max_num_seqs, router, ...).
    knobs: dict = field(default_factory=dict)
    min_requests: int = 1000  # simulated at every rate probed: ten requests past a p99
    min_duration_s: float = 120.0  # of simulated traffic at every rate probed: many request lifetimes

    def __post_init__(self) -> None:
        if self.max_replicas < 1:
            raise ValueError(f"max_replicas must be at least 1, got {self.max_replicas}")

    def probe(self, rate_scale: float) -> Workload:
        """The traffic simulated at rate_scale x the trace's rate (see the module's docstring). A
        trace that arrives all at once has no rate: x2 is twice its requests, all at once. Under
        closed-loop clients, x2 is twice the clients (and a timed trace's rate), their requests
        cycled to hold min_requests."""
        clients = self.workload.clients
        if clients is not None:
            base = self.workload.scaled(rate_scale) if self.workload.duration_s > 0 else self.workload
            if len(base) < self.min_requests:
                base = base.multiplied(math.ceil(self.min_requests / len(base)))
            return base.closed_loop(clients.scaled(rate_scale))
        if self.workload.duration_s <= 0:
            return self.workload.multiplied(rate_scale)
        # A burst of a moment is not stretched past MAX_COPIES of itself.
        span = min(max(self.workload.duration_s, self.min_duration_s), MAX_COPIES * self.workload.duration_s)
        return self.workload.scaled(rate_scale).repeated(span, self.min_requests)

    def config(self, candidate: Candidate, replicas: int) -> SimConfig:
        """The fleet of `replicas` of the candidate (disaggregated: replicas x its P:D pools)."""
        fields = {k: v for k, v in asdict(candidate).items() if v is not None}
        if candidate.disaggregate:
            prefill, decode = parse_pools(candidate.disaggregate)
            fields["disaggregate"], replicas = f"{replicas * prefill}:{replicas * decode}", 1
        return SimConfig(model=self.model, replicas=replicas, slo=self.slo, seed=self.seed, **fields, **self.knobs)


@dataclass
class CandidateResult:
    candidate: Candidate
    rate_scale: float  # the traffic planned for, x the trace's rate
    feasible: bool
    reason: str | None = None
    replicas: int | None = None
    gpus: int | None = None
    usd_per_hour: float | None = None
    usd_per_million_output_tokens: float | None = None
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    e2e_p99_s: float | None = None
    headroom: float | None = None  # x this point's traffic (rate_scale x the trace's) the fleet still serves
    requests: int | None = None  # simulated in the run the answer rests on (its p99s: a hundredth past them)
    slo_measured: dict | None = None  # SLO metric -> its value in the run the answer rests on (s)
    # SLO metric and p99 (ttft_p99, tpot_p99, e2e_p99, ...) -> the engine profile's 80 % interval
    # [lo, hi] s (residual_metric: which residuals it comes from).
    intervals: dict | None = None
    extrapolated_across: str | None = None  # beyond the engine profile's fitted runs, "; "-joined (widening intervals)
    slo_miss: float | None = None  # infeasible on SLOs: the worst SLO's measured / limit at the most replicas
    # Replicas needed if serving runs at the slow end of the engine profile's 80 % interval.
    replicas_slow_end: int | None = None
    # Not searched to the end: it needs at least this many replicas (a fleet dearer than the cheapest
    # found: simulator/plan/search.py), reason says why.
    replicas_at_least: int | None = None
    # How far its step costs rest on its own accelerator's measurements (simulator/fleet/costs.py
    # cost_basis: validated, kernels fitted, extrapolated); None where the candidate cannot run.
    cost_basis: str | None = None
    simulations: int = 0

    def row(self) -> dict:
        """Flat, JSON-ready: the candidate's fields, its label, then the result's."""
        out = {"candidate": self.candidate.label, **asdict(self.candidate)}
        out.update({k: v for k, v in asdict(self).items() if k != "candidate"})
        return out

    @classmethod
    def from_row(cls, row: dict) -> "CandidateResult":
        names = {f for f in Candidate.__dataclass_fields__}
        candidate = Candidate(**{k: v for k, v in row.items() if k in names})
        rest = {k: v for k, v in row.items() if k in cls.__dataclass_fields__ and k != "candidate"}
        return cls(candidate=candidate, **rest)


Simulate = Callable[[SimConfig, Workload, CostModel], RunSummary]
MAX_COPIES = 100


def run_summary(config: SimConfig, workload: Workload, cost_model: CostModel | None = None) -> RunSummary:
    # Only the verdict of a failing run is used: it may stop as soon as the verdict is certain.
    return simulate(config, workload, cost_model, stop_when_slo_missed=True).summary


def meets(summary: RunSummary) -> bool:
    """Every SLO met (on its predicted value: simulated x the engine profile's bias) and every
    request served (a rejected request meets nothing)."""
    return bool(summary.slo.all_met) and summary.num_rejected == 0


def meets_at_top(summary: RunSummary, engine: EngineProfile, extrapolated: Extrapolation = Extrapolation()) -> bool:
    """Every SLO met at the top of its 80 % interval (simulated x EngineProfile.top): the slow end."""
    if summary.num_rejected or summary.stopped_early is not None:  # stopped: it missed even the centre
        return False
    return within_at_top(summary.slo.simulated or summary.slo.measured, summary.slo.targets, engine, extrapolated)


def within_at_top(simulated: dict[str, float], limits: dict[str, float], engine: EngineProfile,
                  extrapolated: Extrapolation = Extrapolation()) -> bool:
    """Each SLO's simulated value at the top of its 80 % interval (widened as extrapolated) within its limit."""
    return all(simulated[k] * engine.top(residual_metric(k), extrapolated.factor(residual_metric(k))) <= limit
               for k, limit in limits.items())


def extrapolated_for(spec: "PlanSpec", candidate: "Candidate", engine: EngineProfile | None) -> Extrapolation:
    """What a candidate's answers extrapolate across beyond its engine profile's fitted runs."""
    config = spec.config(candidate, 1)
    return extrapolation(engine, spec.model, candidate.hardware, candidate.tp, config.model_spec().is_moe)


def plan_candidate(spec: PlanSpec, candidate: Candidate, rate_scale: float = 1.0,
                   run: Simulate = run_summary, headroom: bool = True, slow_end: bool = True,
                   most: int | None = None) -> CandidateResult:
    """The fewest replicas of this candidate that meet the SLOs at rate_scale x the trace's rate,
    with its headroom and slow end (plan_extras) where asked. most: search no further than this
    many replicas (the planner's cap from a cheaper fleet already found): a candidate that needs
    more is left with replicas_at_least = most + 1 and no answer."""
    most = spec.max_replicas if most is None else min(most, spec.max_replicas)
    workload = spec.probe(rate_scale)
    result = CandidateResult(candidate, rate_scale, feasible=False)
    try:
        config = spec.config(candidate, 1)
        config.check()
    except ValueError as exc:
        result.reason = str(exc)
        return result
    # One cost model for every simulation of this candidate (the replica count changes nothing in it).
    cost_model = cost_model_for(config)
    result.cost_basis = cost_basis(config)
    summaries: dict[int, RunSummary] = {}

    def holds(replicas: int) -> bool:
        if replicas not in summaries:
            summaries[replicas] = run(spec.config(candidate, replicas), workload, cost_model)
            result.simulations += 1
        return meets(summaries[replicas])

    replicas = fewest_replicas(holds, 1, most)
    if replicas is None and most < spec.max_replicas:
        result.replicas_at_least = most + 1
        result.reason = f"needs more than {most} replica{'s' if most != 1 else ''}"
        return result
    if replicas is None:
        slo = summaries[spec.max_replicas].slo
        at_least = "at least " if summaries[spec.max_replicas].stopped_early is not None else ""
        missed = ", ".join(f"{k} {at_least}{slo.measured.get(k, math.nan):.3g} s > {v:.3g} s"
                           for k, v in slo.targets.items() if not slo.met.get(k, False))
        rejected = summaries[spec.max_replicas].num_rejected
        ratios = [m / v for k, v in slo.targets.items()
                  if v > 0 and isinstance(m := slo.measured.get(k), (int, float)) and math.isfinite(m)]
        result.slo_miss = max(ratios) if ratios and not rejected else None
        result.reason = (f"misses the SLOs even with {spec.max_replicas} replicas ("
                         + (missed or f"{rejected} requests rejected") + ")")
        return result
    summary = summaries[replicas]
    cost = summary.cost
    result.feasible, result.replicas = True, replicas
    result.gpus = spec.config(candidate, replicas).num_gpus
    result.usd_per_hour = cost.usd_per_hour
    result.usd_per_million_output_tokens = cost.usd_per_million_output_tokens
    engine = cost_model.engine
    simulated = {"ttft_p99": summary.ttft_s.p99, "tpot_p99": summary.tpot_s.p99, "e2e_p99": summary.e2e_s.p99,
                 **{k: v for k, v in (summary.slo.simulated or summary.slo.measured).items() if k in spec.slo}}
    # Predicted: simulated x the residuals' median, inside its interval, as the verdicts read it.
    bias = (lambda k: engine.bias(residual_metric(k))) if engine is not None else (lambda k: 1.0)
    result.ttft_p99_s, result.tpot_p99_s, result.e2e_p99_s = (simulated[k] * bias(k) for k in
                                                              ("ttft_p99", "tpot_p99", "e2e_p99"))
    result.requests = summary.num_requests
    result.slo_measured = {k: v for k, v in summary.slo.measured.items() if k in spec.slo}
    if engine is not None:
        extrapolated = extrapolated_for(spec, candidate, engine)
        result.intervals = {k: list(interval) for k, v in simulated.items()
                            if (interval := engine.interval(residual_metric(k), v,
                                                            extrapolated.factor(residual_metric(k)))) is not None}
        result.extrapolated_across = "; ".join(extrapolated.across) or None if result.intervals else None
    return plan_extras(spec, result, run, cost_model, headroom, slow_end)


def plan_extras(spec: PlanSpec, result: CandidateResult, run: Simulate = run_summary,
                cost_model: CostModel | None = None, headroom: bool = True, slow_end: bool = True
                ) -> CandidateResult:
    """A feasible result with its slow end (the fewest replicas, from its own up, whose SLO
    figures meet their limits at the top of their 80 % intervals: meets_at_top) and its headroom
    filled in; changes `result`."""
    candidate, replicas, workload = result.candidate, result.replicas, spec.probe(result.rate_scale)
    config = spec.config(candidate, 1)
    cost_model = cost_model or cost_model_for(config)
    engine = cost_model.engine
    if slow_end and engine is not None and engine.has_residuals():
        slow_runs: dict[int, bool] = {}
        extrapolated = extrapolated_for(spec, candidate, engine)

        def holds_slow(n: int) -> bool:
            if n == replicas and result.slo_measured:  # the run the answer rests on says it: no new run
                simulated = {k: v / engine.bias(residual_metric(k)) for k, v in result.slo_measured.items()}
                return within_at_top(simulated, spec.slo, engine, extrapolated)
            if n not in slow_runs:
                slow_runs[n] = meets_at_top(run(spec.config(candidate, n), workload, cost_model), engine, extrapolated)
                result.simulations += 1
            return slow_runs[n]
        result.replicas_slow_end = fewest_replicas(holds_slow, replicas, spec.max_replicas)
    # All-at-once traffic has no rate to scale; closed-loop clients scale in number.
    if headroom and (workload.duration_s > 0 or workload.clients is not None):
        result.headroom = fleet_headroom(spec, candidate, replicas, result.rate_scale, run, result, cost_model)
    return result


def fewest_replicas(holds: Callable[[int], bool], start: int, most: int) -> int | None:
    """The fewest replicas from `start` up to `most` for which holds() (more never hurt): doubling
    from start until it holds, then bisecting; None if it fails even at `most`."""
    failing, replicas = start - 1, start
    while not holds(replicas):
        if replicas >= most:
            return None
        failing, replicas = replicas, min(2 * replicas, most)
    while replicas - failing > 1:  # holds at `replicas`, fails at `failing`
        middle = (failing + replicas) // 2
        if holds(middle):
            replicas = middle
        else:
            failing = middle
    return replicas


def fleet_headroom(spec: PlanSpec, candidate: Candidate, replicas: int, rate_scale: float = 1.0,
                   run: Simulate = run_summary, result: CandidateResult | None = None,
                   cost_model: CostModel | None = None, precision: float = 0.05, limit: float = 64.0) -> float:
    """Largest x (to `precision`) at which `replicas` of the candidate meet the SLOs at x times
    rate_scale's traffic (result, if given, counts the simulations)."""
    def holds(scale: float) -> bool:
        if result is not None:
            result.simulations += 1
        return meets(run(spec.config(candidate, replicas), spec.probe(rate_scale * scale), cost_model))

    # Brackets of (1 + precision)^8: three halvings (in log scale) reach the precision inside one,
    # where a bracket of 2 needs four; over the spread of headrooms plans see (1x to 6x) that is
    # fewer simulations than doubling.
    step = (1 + precision) ** 8
    low, high = 1.0, step
    while holds(high):
        low, high = high, high * step
        if high > limit:
            return low
    while high / low > 1 + precision:
        middle = math.sqrt(low * high)
        if holds(middle):
            low = middle
        else:
            high = middle
    return low


def pareto_front(results: Sequence[CandidateResult]) -> list[CandidateResult]:
    """Feasible results no other beats on both $/hour and E2E p99 latency, cheapest first."""
    feasible = [r for r in results if r.feasible and r.usd_per_hour is not None]
    front = [r for r in feasible
             if not any((o.usd_per_hour <= r.usd_per_hour and o.e2e_p99_s <= r.e2e_p99_s)
                        and (o.usd_per_hour < r.usd_per_hour or o.e2e_p99_s < r.e2e_p99_s) for o in feasible)]
    return sorted(front, key=lambda r: (r.usd_per_hour, r.e2e_p99_s))


def recommend_validated(results: Sequence[CandidateResult]) -> CandidateResult | None:
    """recommend() among the candidates whose costs were validated on real runs on their accelerator."""
    return recommend([r for r in results if r.cost_basis == VALIDATED])


def recommend(results: Sequence[CandidateResult]) -> CandidateResult | None:
    """The cheapest feasible fleet per hour (then the smaller host KV tier and the smaller CP -- a
    tier or context parallelism that saves nothing is not recommended -- then the lower E2E p99)."""
    priced = [r for r in results if r.feasible and r.usd_per_hour is not None]
    return min(priced, key=lambda r: (r.usd_per_hour, r.candidate.kv_offload_gb, r.candidate.cp, r.e2e_p99_s)) \
        if priced else None
