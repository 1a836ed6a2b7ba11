"""The capacity planner: fewest replicas that meet the SLOs, monotone in traffic and SLO tightness,
infeasible candidates reported, finished points resumed from the study file."""

from __future__ import annotations

import os

import pytest

from simulator.plan.executors import run_plan
from simulator.plan.capacity import (Candidate, PlanSpec, fleet_headroom, meets, pareto_front, plan_candidate,
                                     run_summary)
from simulator.plan.study import Study
from simulator.workload.load import load_workload
from simulator.workload.requests import BUNDLED_LENGTHS

TRACE = f"synthetic:num=120,lengths={BUNDLED_LENGTHS},rate=6"
SLO = {"ttft_p99": 2.0, "tpot_p99": 0.1}


def spec(slo=None, trace=TRACE, model="llama-3.1-8b") -> PlanSpec:
    # servecast: kernel time alone, the search's figures independent of the vLLM profile's fit
    return PlanSpec(model, load_workload(trace, seed=0), slo or SLO, max_replicas=64, knobs={"engine": "servecast"},
                    min_requests=300)


def test_the_fleet_found_is_the_fewest_that_meets_the_slos() -> None:
    s = spec()
    result = plan_candidate(s, Candidate("a100-80gb"), rate_scale=2.0, headroom=False)
    assert result.feasible and result.replicas > 1
    workload = s.probe(2.0)
    assert meets(run_summary(s.config(Candidate("a100-80gb"), result.replicas), workload))
    assert not meets(run_summary(s.config(Candidate("a100-80gb"), result.replicas - 1), workload))
    assert result.gpus == result.replicas and result.usd_per_hour > 0


def test_more_traffic_never_needs_fewer_replicas() -> None:
    replicas = [plan_candidate(spec(), Candidate("a100-80gb"), g, headroom=False).replicas for g in (1, 2, 4)]
    assert replicas == sorted(replicas) and replicas[-1] > replicas[0]


def test_tighter_slos_never_cost_less() -> None:
    loose = plan_candidate(spec({"ttft_p99": 4.0, "tpot_p99": 0.2}), Candidate("l40s"), 2.0, headroom=False)
    tight = plan_candidate(spec({"ttft_p99": 1.2, "tpot_p99": 0.04}), Candidate("l40s"), 2.0, headroom=False)
    assert loose.feasible and tight.feasible
    assert tight.usd_per_hour >= loose.usd_per_hour and tight.replicas > loose.replicas


def test_headroom_is_the_largest_rate_the_fleet_still_serves() -> None:
    s = spec()
    result = plan_candidate(s, Candidate("h100-sxm"))
    assert result.feasible and result.headroom >= 1.0
    config = s.config(Candidate("h100-sxm"), result.replicas)
    assert meets(run_summary(config, s.probe(result.headroom)))
    assert not meets(run_summary(config, s.probe(result.headroom * 1.1)))


def test_headroom_never_grows_faster_than_the_fleet() -> None:
    # Each rate is probed over the trace's own span: two replicas absorb at most about twice the
    # traffic one does (the 5 % bisection either side), not the transient a compressed trace shows.
    s = spec()
    one, two = (fleet_headroom(s, Candidate("l40s"), n, rate_scale=0.25) for n in (1, 2))
    assert 1.0 < one < two <= 2 * one * 1.05 ** 2


def test_every_rate_is_probed_on_the_traces_span_with_enough_requests() -> None:
    s = spec()
    for scale in (0.5, 1.0, 9.0):
        probe = s.probe(scale)
        assert probe.duration_s >= max(s.workload.duration_s, s.min_duration_s) and len(probe) >= s.min_requests
        assert probe.rate_per_s == pytest.approx(s.workload.rate_per_s * scale, rel=0.02)


def test_more_of_a_trace_that_arrives_all_at_once_is_more_requests() -> None:
    s = spec(trace="synthetic:num=40,input=256,output=64,rate=inf")
    assert len(s.probe(2.0)) == 80 and s.probe(2.0).duration_s == 0 and len(s.probe(0.5)) == 20


def test_traffic_that_arrives_all_at_once_has_no_headroom() -> None:
    result = plan_candidate(spec(trace="synthetic:num=40,input=256,output=64,rate=inf"), Candidate("h100-sxm"))
    assert result.feasible and result.headroom is None


def test_a_candidate_that_cannot_hold_the_model_is_reported_not_dropped() -> None:
    candidates = [Candidate("l40s"), Candidate("h100-sxm", tp=4)]
    plan = run_plan(spec(model="llama-3.1-70b"), candidates)
    assert [r.candidate for r in plan.results] == candidates
    l40s, h100 = plan.results
    assert not l40s.feasible and "use tp>=" in l40s.reason and l40s.replicas is None
    assert h100.feasible and plan.recommendation() is h100


def test_pareto_front_keeps_only_undominated_fleets() -> None:
    plan = run_plan(spec(), [Candidate("h100-sxm"), Candidate("a100-80gb"), Candidate("l40s"), Candidate("h100-sxm", "fp8")])
    front = pareto_front(plan.results)
    assert front and front[0] is plan.recommendation()
    for r in plan.results:
        if r.feasible and r not in front:
            assert any(f.usd_per_hour <= r.usd_per_hour and f.e2e_p99_s <= r.e2e_p99_s for f in front)


def test_an_interrupted_plan_resumes_without_recomputing_finished_points(tmp_path, monkeypatch) -> None:
    s = spec()
    candidates = [Candidate("h100-sxm"), Candidate("a100-80gb")]
    study = Study(tmp_path / "study.sqlite")
    first = run_plan(s, candidates[:1], study=study, exhaustive=True)  # "interrupted" after one point
    assert first.reused == 0 and len(study) == 1
    calls = []
    import simulator.plan.executors as planner

    real = planner.plan_candidate
    monkeypatch.setattr(planner, "plan_candidate", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    resumed = run_plan(s, candidates, study=study, exhaustive=True)
    assert resumed.reused == 1 and calls == [candidates[1]]
    assert resumed.results[0].row() == first.results[0].row()
    again = run_plan(s, candidates, study=study, exhaustive=True)
    assert again.reused == 2 and calls == [candidates[1]]
    (tmp_path / "bad.sqlite").write_text("not a database")
    with pytest.raises(ValueError, match="not a servecast study"):
        Study(tmp_path / "bad.sqlite")


def test_local_processes_give_the_same_plan_as_one_process() -> None:
    candidates = [Candidate("h100-sxm"), Candidate("l40s", "fp8")]
    one = run_plan(spec(), candidates, growth=(1.0, 2.0))
    pool = run_plan(spec(), candidates, growth=(1.0, 2.0), workers=2)
    assert [r.row() for r in pool.results] == [r.row() for r in one.results]


def _dies_on_l40s(spec: PlanSpec, candidate: Candidate, rate_scale: float = 1.0) -> object:
    """plan_candidate, except that the worker process dies outright on an l40s candidate."""
    if candidate.hardware == "l40s":
        os._exit(1)
    return plan_candidate(spec, candidate, rate_scale)


def test_a_worker_process_that_dies_loses_only_its_own_point(monkeypatch, tmp_path) -> None:
    import simulator.plan.executors as planner

    candidates = [Candidate("h100-sxm"), Candidate("l40s"), Candidate("a100-80gb"), Candidate("h100-sxm", "fp8"),
                  Candidate("h200")]
    expected = {c: plan_candidate(spec(), c).row() for c in candidates if c.hardware != "l40s"}
    monkeypatch.setattr(planner, "plan_candidate", _dies_on_l40s)
    study = Study(tmp_path / "study.sqlite")
    plan = run_plan(spec(), candidates, workers=2, study=study, exhaustive=True)
    for result in plan.results:
        if result.candidate.hardware == "l40s":
            assert not result.feasible and result.reason.startswith(planner.WORKER_FAILED)
        else:
            assert result.row() == expected[result.candidate]
    # The survivors were kept; the crashed point was not, so a rerun computes only it.
    monkeypatch.setattr(planner, "plan_candidate", plan_candidate)
    assert run_plan(spec(), candidates, study=study, exhaustive=True).reused == len(candidates) - 1


def test_the_ray_executor_gives_the_same_plan_as_local_processes(tmp_path) -> None:
    pytest.importorskip("ray")
    candidates = [Candidate("h100-sxm"), Candidate("l40s", "fp8"), Candidate("l40s", tp=3)]  # tp=3: infeasible
    local = run_plan(spec(), candidates, exhaustive=True)
    study = Study(tmp_path / "ray.sqlite")
    on_ray = run_plan(spec(), candidates, workers=2, study=study, executor="ray", exhaustive=True)
    assert [r.row() for r in on_ray.results] == [r.row() for r in local.results]
    assert len(study) == 3  # kept as they finished
    fast = run_plan(spec(), candidates, workers=2, executor="ray")  # the bounded search's rounds on Ray
    assert [r.row() for r in fast.results] == [r.row() for r in run_plan(spec(), candidates).results]
    with pytest.raises(ValueError, match="use local or ray"):
        run_plan(spec(), candidates, executor="dask")


def test_the_slow_end_of_the_interval_needs_at_least_as_many_replicas(tmp_path) -> None:
    from dataclasses import replace

    from simulator.catalog.engines import DEFAULT_GPU_ENGINE, load_engine

    # Centred on the simulation (median residual 0), with a long slow tail: the same fleet at the
    # centre, more at the interval's top.
    # (No widening for what the candidate crosses beyond the profile's runs: the interval as given.)
    slow = replace(load_engine(DEFAULT_GPU_ENGINE), residuals={"tpot": [-0.1, 0.0, 0.0, 0.0, 0.5, 0.6, 0.7],
                                                                "ttft_mean": [0.0] * 5}, extrapolation={})
    slow.save(tmp_path / "slow.json")
    s = spec()
    s = PlanSpec(s.model, s.workload, s.slo, max_replicas=64, knobs={"engine_file": str(tmp_path / "slow.json")})
    result = plan_candidate(s, Candidate("a100-80gb"), rate_scale=2.0, headroom=False)
    assert result.feasible and result.replicas_slow_end > result.replicas
    none = PlanSpec(s.model, s.workload, s.slo, max_replicas=64, knobs={"engine": "servecast"})
    assert plan_candidate(none, Candidate("a100-80gb"), rate_scale=2.0, headroom=False).replicas_slow_end is None
