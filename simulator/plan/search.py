"""The planner's search: the cheapest fleet with as few simulations as the answer needs. No torch.

The plan's questions are the cheapest fleet at each traffic level, every candidate's fewest
replicas that could still compete for it, and the headroom and slow end of the fleets the report
dwells on. So, per traffic level:

1. Every candidate gets its analytic bound (simulator/plan/bounds.py): a floor on its replicas and
   its decode throughput per dollar. Candidates are searched best throughput per dollar first, so
   a cheap fleet is found early.
2. They are searched in rounds of ROUND, each capped by the cheapest fleet found before the round:
   a candidate whose floor already costs more is bounded out without a simulation; the others
   are searched up to the most replicas that cost no more (an equal price may still win on
   latency), and one that needs more is bounded out with that count. A search that finds its
   fleet finds the same fewest replicas as an uncapped one (more replicas never hurt, so a fleet
   that holds at the cap holds wherever the uncapped search would look).
3. The recommended fleet, the cheapest on validated costs (candidates on an accelerator the
   engine profile was fitted on real runs of are capped by the cheapest of their own kind, so one
   is found) and the Pareto front (of the candidates searched to the end) then get their headroom
   and slow end (capacity.plan_extras).

The rounds are a fixed size, not the number of workers, so the answer, every bound included,
is the same on one process or many. exhaustive=True in run_plan skips all this and searches
every candidate to the end, with its headroom and slow end, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from simulator.fleet.costs import VALIDATED, cost_basis
from simulator.plan.bounds import ReplicaBound, replica_bound
from simulator.plan.capacity import (Candidate, CandidateResult, PlanSpec, pareto_front, recommend,
                                     recommend_validated)

BOUNDED_OUT = "bounded out: dearer than the cheapest fleet found, whatever its replicas"
ROUND = 4  # candidates per traffic level started together between two updates of the cheapest fleet

# run(tasks) -> results in task order; a task is ("search", candidate, rate_scale, most) or
# ("extras", result); a result is a CandidateResult.
RunTasks = Callable[[list[tuple]], list[CandidateResult]]


def bounded_out(candidate: Candidate, rate_scale: float, needs: int, bound: ReplicaBound, cheapest: float,
                simulations: int = 0) -> CandidateResult:
    cost = needs * bound.usd_per_replica
    return CandidateResult(candidate, rate_scale, feasible=False, replicas_at_least=needs, simulations=simulations,
                           reason=f"{BOUNDED_OUT} (at least {needs} replica{'s' if needs != 1 else ''}, "
                                  f"${cost:,.2f}/hour against ${cheapest:,.2f}/hour)")


def search(spec: PlanSpec, points: Sequence[tuple[Candidate, float]], run: RunTasks,
           done: dict[int, CandidateResult] | None = None,
           progress: Callable[[int], None] | None = None) -> dict[int, CandidateResult]:
    """Results of every point (index into points -> result). done: points already answered in
    full (a study's): each stands in for its search in the round it comes up in, so the rounds,
    and every bound, are those of a plan run from scratch. progress(number of points decided) as
    rounds finish."""
    results: dict[int, CandidateResult] = {}
    done = done or {}
    bounds: dict[int, ReplicaBound] = {}
    for i, (candidate, growth) in enumerate(points):
        try:
            bounds[i] = replica_bound(spec, candidate, growth)
        except ValueError as exc:  # what its simulation would report: it cannot run
            results[i] = done.get(i) or CandidateResult(candidate, growth, feasible=False, reason=str(exc))
    # A candidate on validated costs competes with the cheapest validated fleet, so that the plan
    # names one beside a recommendation that rests on extrapolated costs.
    validated = {i: cost_basis(spec.config(points[i][0], 1)) == VALIDATED for i in bounds}
    levels = sorted({g for _, g in points})
    cheapest = {(g, v): math.inf for g in levels for v in (False, True)}
    queues = {g: sorted((i for i in bounds if points[i][1] == g), key=lambda i: (bounds[i].usd_per_token_s, i))
              for g in levels}
    if progress is not None:
        progress(len(results))
    while any(queues.values()):
        tasks, started = [], []
        for g in levels:
            taken = 0
            while queues[g] and taken < ROUND:
                i = queues[g].pop(0)
                bound = bounds[i]
                best = cheapest[g, True] if validated[i] else min(cheapest[g, False], cheapest[g, True])
                if bound.usd_per_replica is None or math.isinf(best):
                    most = None  # nothing to beat yet (or no price to compare): searched to the end
                elif bound.usd_per_hour > best * (1 + 1e-9):
                    results[i] = bounded_out(points[i][0], g, bound.replicas, bound, best)
                    continue
                else:
                    most = max(bound.replicas, math.floor(best / bound.usd_per_replica * (1 + 1e-9)))
                if i not in done:  # a point answered in full before takes its place in the round as it did then
                    tasks.append(("search", points[i][0], g, most))
                started.append((i, best))
                taken += 1
        ran = iter(run(tasks))
        for i, best in started:
            result = done[i] if i in done else next(ran)
            if result.replicas_at_least is not None:
                result = bounded_out(result.candidate, result.rate_scale, result.replicas_at_least, bounds[i], best,
                                     result.simulations)
            results[i] = result
        for i, result in results.items():
            if result.feasible and result.usd_per_hour is not None and i in validated:
                key = (result.rate_scale, validated[i])
                cheapest[key] = min(cheapest[key], result.usd_per_hour)
        if progress is not None:
            progress(len(results))
    return results


def shown(results: Sequence[CandidateResult]) -> list[int]:
    """Indices of the results the report dwells on at each traffic level: the recommended fleet
    and the Pareto front, where their headroom and slow end are still to be found."""
    picked = []
    for g in sorted({r.rate_scale for r in results}):
        level = [r for r in results if r.rate_scale == g]
        best = [r for r in (recommend(level), recommend_validated(level)) if r is not None]
        front = {id(r) for r in pareto_front(level)} | {id(r) for r in best}
        picked += [i for i, r in enumerate(results) if id(r) in front]
    return [i for i in picked if results[i].headroom is None and results[i].replicas_slow_end is None]
