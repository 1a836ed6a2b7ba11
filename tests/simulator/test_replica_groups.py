"""Replicas that never interact, simulated in several processes: the same requests' timings as one
process, the groups' counts added up, errors and dead workers reported."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from simulator import replica_groups
from simulator.run import simulate
from simulator.sim_config import SimConfig
from simulator.synthetic import load_workload

CASES = [
    # uneven groups (5 replicas over 2 processes), prefix caching, a request too long to serve
    ("synthetic:prefixes=3,prefix_len=200,users=60,input=uniform(5,900),output=uniform(5,300),rate=30",
     dict(replicas=5, max_model_len=1024)),
    ("synthetic:num=150,input=uniform(20,600),output=uniform(20,200),rate=40",
     dict(replicas=3, speculative="ngram", num_speculative_tokens=3, acceptance=0.6)),
    ("synthetic:num=120,input=uniform(20,300),output=uniform(50,200),rate=20", dict(replicas=4, pp=2, tp=2)),
]


@pytest.mark.parametrize("spec, knobs", CASES)
def test_groups_of_replicas_in_processes_give_one_process_results(spec, knobs) -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", **knobs)
    one = simulate(config, load_workload(spec, seed=3))
    two = simulate(config, load_workload(spec, seed=3), workers=2)
    pd.testing.assert_frame_equal(one.requests, two.requests, check_exact=True)
    pd.testing.assert_frame_equal(one.timeseries, two.timeseries, check_exact=True)
    for key in ("ttft_s", "tpot_s", "e2e_s", "throughput", "itl_s", "num_rejected", "preemptions",
                "prefix_cache_hit_rate", "time_split_s", "utilization", "cost"):
        assert two.summary[key] == pytest.approx(one.summary[key], rel=1e-9), key
    assert (one.summary["speculation"] is None) == (two.summary["speculation"] is None)
    if one.summary["speculation"]:
        spec_one, spec_two = dict(one.summary["speculation"]), dict(two.summary["speculation"])
        for key in ("cumulative_acceptance", "method"):
            assert spec_two.pop(key) == spec_one.pop(key)
        assert spec_two == pytest.approx(spec_one, rel=1e-9)
        assert spec_one["verifications"] > 0


def test_the_first_case_exercises_rejections_and_prefix_hits() -> None:
    spec, knobs = CASES[0]
    result = simulate(SimConfig(model="llama-3.1-8b", hardware="a100-80gb", **knobs), load_workload(spec, seed=3),
                      workers=2)
    assert result.summary["num_rejected"] > 0 and result.summary["prefix_cache_hit_rate"] > 0
    assert sorted(result.requests["replica"].unique()) == [-1, 0, 1, 2, 3, 4]


def test_only_round_robin_fleets_split_and_never_into_more_groups_than_replicas() -> None:
    assert replica_groups.count(SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=4), 8) == 4
    assert replica_groups.count(SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=4), 2) == 2
    assert replica_groups.count(SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=4,
                                          router="least_outstanding_tokens"), 8) == 1


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
        if members == [1]:
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
    assert four.summary["num_finished"] == 2
