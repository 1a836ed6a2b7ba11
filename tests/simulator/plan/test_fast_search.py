"""The bounded search (simulator/plan/search.py) against the exhaustive one: the same fleet, the
same replicas wherever it still searches, bounds that never overshoot, resumable."""

from __future__ import annotations

import pytest

from simulator.plan.bounds import replica_bound
from simulator.plan.capacity import Candidate, PlanSpec
from simulator.plan.executors import run_plan
from simulator.plan.grid import candidate_grid
from simulator.plan.study import Study
from simulator.workload.load import load_workload
from simulator.workload.requests import BUNDLED_LENGTHS



def spec(slo: dict, rate: float = 6) -> PlanSpec:
    trace = f"synthetic:num=120,lengths={BUNDLED_LENGTHS},rate={rate:g}"
    return PlanSpec("llama-3.1-8b", load_workload(trace, seed=0), slo, max_replicas=64, min_requests=300)


GRIDS = {
    "fast GPUs, two growth points": (spec({"ttft_p99": 2.0, "tpot_p99": 0.1}),
                                     candidate_grid(["h100-sxm", "a100-80gb", "l40s"], ["bf16", "fp8"], [1]),
                                     (1.0, 3.0)),
    "cheap GPUs, tight TPOT": (spec({"ttft_p99": 3.0, "tpot_p99": 0.05}, rate=12),
                               candidate_grid(["l4", "a10g", "h200", "mi300x"], ["bf16"], [1, 2]), (1.0,)),
    "closed-loop clients": (PlanSpec("llama-3.1-8b", load_workload(
        f"synthetic:num=120,lengths={BUNDLED_LENGTHS},concurrency=48", seed=0), {"ttft_p99": 1.0, "tpot_p99": 0.03},
        max_replicas=64, min_requests=300), candidate_grid(["h100-sxm", "a100-80gb"], ["bf16", "fp8"], [1, 2]),
        (1.0, 2.0)),
}


@pytest.fixture(scope="module", params=list(GRIDS))
def both(request):
    s, candidates, growth = GRIDS[request.param]
    return s, run_plan(s, candidates, growth, exhaustive=True), run_plan(s, candidates, growth)


def test_the_bounded_search_picks_the_exhaustive_fleet_and_replicas(both) -> None:
    s, exhaustive, fast = both
    for g in {r.rate_scale for r in exhaustive.results}:
        best, quick = exhaustive.recommendation(g), fast.recommendation(g)
        assert best is not None and quick.candidate == best.candidate and quick.replicas == best.replicas
        assert quick.row() == best.row()  # its headroom and slow end too
    searched = 0
    for full, r in zip(exhaustive.results, fast.results):
        if r.replicas_at_least is not None:  # bounded out: it really needs that many, at a price above the best
            assert not r.feasible and (not full.feasible or full.replicas >= r.replicas_at_least)
            assert full.usd_per_hour is None or full.usd_per_hour > fast.recommendation(r.rate_scale).usd_per_hour
        else:
            searched += 1
            assert (r.feasible, r.replicas, r.reason) == (full.feasible, full.replicas, full.reason)
    assert searched < len(fast.results)  # the bounds saved some searches
    assert sum(r.simulations for r in fast.results) < sum(r.simulations for r in exhaustive.results)


def test_the_analytic_bound_never_exceeds_the_replicas_simulated(both) -> None:
    s, exhaustive, _ = both
    for r in exhaustive.results:
        if r.feasible:
            assert replica_bound(s, r.candidate, r.rate_scale).replicas <= r.replicas


def test_closed_loop_traffic_grows_in_clients_and_keeps_its_headroom(both) -> None:
    s, exhaustive, _ = both
    if s.workload.clients is None:
        pytest.skip("open-loop grid")
    assert s.probe(2.0).clients.concurrency == 96 and len(s.probe(2.0)) >= 300
    for g in (1.0, 2.0):
        best = exhaustive.recommendation(g)
        assert best.headroom is not None and best.headroom >= 1.0
    # Twice the clients never need fewer replicas of the same candidate.
    by = {(r.candidate, r.rate_scale): r.replicas for r in exhaustive.results if r.feasible}
    assert all(by[(c, 2.0)] >= n for (c, g), n in by.items() if g == 1.0 and (c, 2.0) in by)
    assert max(by.values()) > 1  # the SLOs made some candidate need several replicas


def test_the_bound_grows_with_the_traffic_and_orders_by_throughput_per_dollar() -> None:
    s = GRIDS["fast GPUs, two growth points"][0]
    low, high = replica_bound(s, Candidate("l40s"), 1.0), replica_bound(s, Candidate("l40s"), 16.0)
    assert high.replicas > low.replicas and high.usd_per_replica == low.usd_per_replica
    assert replica_bound(s, Candidate("h100-sxm", "fp8"), 1.0).usd_per_token_s < \
        replica_bound(s, Candidate("h100-sxm", "bf16"), 1.0).usd_per_token_s  # half the weight bytes a step
    with pytest.raises(ValueError, match="fp8 tensor cores"):
        replica_bound(s, Candidate("a100-80gb", "fp8"))


def test_a_bounded_plan_resumes_from_its_study(tmp_path, monkeypatch) -> None:
    import simulator.plan.executors as planner

    s, candidates, growth = GRIDS["fast GPUs, two growth points"]
    study = Study(tmp_path / "study.sqlite")
    first = run_plan(s, candidates, growth, study=study)
    calls = []
    real = planner.plan_candidate
    monkeypatch.setattr(planner, "plan_candidate", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    again = run_plan(s, candidates, growth, study=study)
    assert [r.row() for r in again.results] == [r.row() for r in first.results]
    assert again.reused > 0 and calls == []  # every search read back, capped ones by their cap
