"""Replicas that never interact, simulated one by one and in several processes: the same requests'
timings as the whole fleet simulated together, the same summary whatever the number of processes,
errors and dead workers reported."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from simulator.fleet import replica_groups
from simulator.fleet.costs import cost_model_for
from simulator.fleet.fleet import FleetRecord, FleetSetup, simulate_replicas
from simulator.fleet.run import DEFAULT_SAMPLES, simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload

CASES = [
    # uneven groups (5 replicas over 2 processes), prefix caching, a request too long to serve
    ("synthetic:prefixes=3,prefix_len=200,users=60,input=uniform(5,900),output=uniform(5,300),rate=30",
     dict(replicas=5, max_model_len=1024)),
    ("synthetic:num=150,input=uniform(20,600),output=uniform(20,200),rate=40",
     dict(replicas=3, speculative="ngram", num_speculative_tokens=3, acceptance=0.6)),
    ("synthetic:num=120,input=uniform(20,300),output=uniform(50,200),rate=20", dict(replicas=4, pp=2, tp=2)),
]


def together(config: SimConfig, workload) -> FleetRecord:
    """The whole fleet in one SimPy environment, behind its router (how other routers run)."""
    model, _, plan = config.check()
    cost_model = cost_model_for(config)
    fleet = FleetSetup(config, model, plan, cost_model, None, True, True,
                       max(workload.duration_s, 1e-3) / DEFAULT_SAMPLES)
    return simulate_replicas(fleet, workload.requests, list(range(config.replicas)))


@pytest.mark.parametrize("spec, knobs", CASES)
def test_replicas_one_by_one_and_in_processes_give_the_fleet_simulated_together(spec, knobs) -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", **knobs)
    joint = together(config, load_workload(spec, seed=3))
    one = simulate(config, load_workload(spec, seed=3))
    two = simulate(config, load_workload(spec, seed=3), workers=2)
    pd.testing.assert_frame_equal(one.requests, joint.recorder.requests_frame(), check_exact=True)
    pd.testing.assert_frame_equal(one.timeseries, joint.recorder.timeseries_frame(), check_exact=True)
    assert one.summary.time_split_s.to_dict() == pytest.approx(
        {k: getattr(joint.split, k if k == "steps" else f"{k}_s") for k in ("prefill", "decode", "communication",
                                                                          "overhead", "steps")}
        | {"step_time_total": one.summary.time_split_s.step_time_total}, rel=1e-9)
    # One process or two: the same records merged in the same order, the same summary to the bit.
    pd.testing.assert_frame_equal(one.requests, two.requests, check_exact=True)
    pd.testing.assert_frame_equal(one.timeseries, two.timeseries, check_exact=True)
    assert one.summary == two.summary
    if "speculative" in knobs:
        assert one.summary.speculation.verifications > 0


def test_the_first_case_exercises_rejections_and_prefix_hits() -> None:
    spec, knobs = CASES[0]
    result = simulate(SimConfig(model="llama-3.1-8b", hardware="a100-80gb", **knobs), load_workload(spec, seed=3),
                      workers=2)
    assert result.summary.num_rejected > 0 and result.summary.prefix_cache_hit_rate > 0
    assert sorted(result.requests["replica"].unique()) == [-1, 0, 1, 2, 3, 4]


def test_only_round_robin_fleets_of_several_replicas_are_simulated_apart() -> None:
    assert replica_groups.applies(SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=4))
    assert not replica_groups.applies(SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=1))
    assert not replica_groups.applies(SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=4,
                                                router="least_outstanding_tokens"))


def test_progress_is_told_and_reaches_the_total() -> None:
    seen = []
    workload = load_workload("synthetic:num=400,input=uniform(20,300),output=uniform(20,200),rate=50", seed=1)
    simulate(SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=4), workload,
             progress=lambda done, total: seen.append((done, total)), workers=2)
    assert seen[-1] == (400, 400) and all(t == 400 for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_a_failing_group_raises_its_error_and_a_dead_one_is_named(monkeypatch) -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=2)
    workload = load_workload("synthetic:num=40,input=64,output=16,rate=10", seed=1)
    real = replica_groups.simulate_replicas

    def failing(fleet, requests, members, **kwargs):
        if members == [1]:  # replica 1, in the second process
            raise ValueError("group one cannot go on")
        return real(fleet, requests, members, **kwargs)
    monkeypatch.setattr(replica_groups, "simulate_replicas", failing)  # the forked workers inherit it
    with pytest.raises(ValueError, match="group one cannot go on"):
        simulate(config, workload, workers=2)

    def dying(fleet, requests, members, **kwargs):
        if members == [1]:
            os._exit(3)
        return real(fleet, requests, members, **kwargs)
    monkeypatch.setattr(replica_groups, "simulate_replicas", dying)
    with pytest.raises(RuntimeError, match="replica group 1 died"):
        simulate(config, workload, workers=2)


def test_fewer_requests_than_replicas_leaves_groups_idle() -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=4)
    workload = load_workload("synthetic:num=2,input=64,output=16,rate=10", seed=1)
    one, four = simulate(config, workload), simulate(config, workload, workers=4)
    pd.testing.assert_frame_equal(one.requests, four.requests, check_exact=True)
    assert four.summary.num_finished == 2
