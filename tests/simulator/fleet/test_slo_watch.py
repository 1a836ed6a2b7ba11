"""Stopping a run once its SLOs are certainly missed: the verdict is never early, and a run that
stops gives the same verdict as the full run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simulator.fleet.run import simulate
from simulator.plan.capacity import meets
from simulator.fleet.sim_config import SimConfig
from simulator.fleet.slo_watch import SloWatch
from simulator.workload.load import load_workload
from simulator.workload.requests import BUNDLED_LENGTHS


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=250),
       limit=st.floats(0.0, 10.0), q=st.sampled_from([50, 90, 95, 99, 99.9]), mean=st.booleans())
def test_a_decided_miss_is_a_miss_of_the_full_percentile(values, limit, q, mean) -> None:
    key = "ttft_mean" if mean else f"ttft_p{q:g}"
    watch = SloWatch({key: limit}, len(values))
    for v in values:
        watch.finished(0.0, v, v + 1.0)
        if watch.decided:
            break
    full = float(np.mean(values)) if mean else float(np.percentile(values, q))
    if watch.decided:
        assert full > limit
        assert watch.missed[key] <= full * (1 + 1e-12)  # the bound it reports is a lower bound
    if not mean and sum(v > limit for v in values) >= len(values) - np.floor(q / 100 * (len(values) - 1)) + 1:
        assert watch.decided  # and it does decide once enough values are over


def test_exact_percentile_positions_are_not_decided_by_rounding() -> None:
    # p99 of 101 values sits exactly at index 99: two values over would decide by the plain rule,
    # the watch waits for a third (0.99 * 100 may round either side of 99).
    watch = SloWatch({"e2e_p99": 1.0}, 101)
    for _ in range(2):
        watch.finished(0.0, 0.1, 5.0)
    assert watch.decided is None
    watch.finished(0.0, 0.1, 5.0)
    assert watch.decided and "e2e_p99" in watch.decided


def test_a_rejection_decides_at_once() -> None:
    watch = SloWatch({"itl_p99": 0.1}, 10)
    assert not watch.limits  # inter-token latency is left to the full run
    watch.rejected("too long")
    assert "rejected" in watch.decided


@settings(max_examples=200, deadline=None)
@given(requests=st.lists(st.tuples(st.floats(0.0, 5.0), st.integers(1, 6)), min_size=1, max_size=120),
       limit=st.floats(0.01, 2.0), q=st.sampled_from([50, 90, 99]))
def test_tpot_is_decided_over_the_multi_token_requests_only(requests, limit, q) -> None:
    # (decode seconds, output tokens) per request; TPOT = decode seconds / (tokens - 1), as metrics.py has it.
    multi = [(d, n) for d, n in requests if n >= 2]
    watch = SloWatch({f"tpot_p{q}": limit}, len(requests), len(multi))
    for d, n in requests:
        watch.finished(0.0, 1.0, 1.0 + d, n)
    values = [((1.0 + d) - 1.0) / (n - 1) for d, n in multi]  # computed as the recorder computes it
    if watch.decided:
        assert values and float(np.percentile(values, q)) > limit


TRACE = f"synthetic:num=150,lengths={BUNDLED_LENGTHS},rate=12"


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_stopped_run_gives_the_full_runs_verdict(replicas) -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=replicas,
                       slo={"ttft_p99": 1.5, "e2e_p90": 30.0, "tpot_p99": 0.1})
    full = simulate(config, load_workload(TRACE, seed=1))
    watched = simulate(config, load_workload(TRACE, seed=1), stop_when_slo_missed=True)
    assert meets(watched.summary) == meets(full.summary)
    if watched.summary.stopped_early is not None:
        assert watched.summary.num_finished < full.summary.num_finished
        for key, bound in watched.summary.slo.measured.items():
            if not watched.summary.slo.met[key] and key in watch_keys(watched):
                assert full.summary.slo.measured[key] >= bound > config.slo[key]
    else:  # never stopped: the very same run
        assert watched.summary.ttft_s == full.summary.ttft_s
        assert watched.summary.num_finished == full.summary.num_finished


def watch_keys(result) -> set:
    """The SLOs whose bound the stop reported (the others were measured over the finished requests)."""
    return {k for k in ("ttft_p99", "e2e_p90", "tpot_p99") if k in result.summary.stopped_early}


def test_a_tpot_limit_alone_stops_a_run_early_with_the_full_runs_verdict() -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="l4", replicas=1, slo={"tpot_p90": 0.02})
    full = simulate(config, load_workload(TRACE, seed=1))
    watched = simulate(config, load_workload(TRACE, seed=1), stop_when_slo_missed=True)
    assert not meets(full.summary) and not meets(watched.summary)
    assert "tpot_p90" in watched.summary.stopped_early
    assert full.summary.slo.measured["tpot_p90"] >= watched.summary.slo.measured["tpot_p90"] > 0.02


def test_the_one_replica_case_does_stop_early() -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=1, slo={"ttft_p99": 1.5})
    watched = simulate(config, load_workload(TRACE, seed=1), stop_when_slo_missed=True)
    assert watched.summary.stopped_early is not None and not meets(watched.summary)


def test_ttft_is_decided_at_first_tokens_and_counted_once() -> None:
    watch = SloWatch({"ttft_p50": 1.0}, 4)  # p50 of 4 values: decided by 3 over the limit
    watch.first_token(0.0, 2.0)
    watch.first_token(0.0, 3.0)
    watch.finished(0.0, 2.0, 9.0, 5, ttft_counted=True)  # told already: not counted again
    assert watch.decided is None
    watch.first_token(0.0, 4.0)  # no further request has finished, yet the verdict is certain
    assert watch.decided and watch.missed["ttft_p50"] == 2.0
    untold = SloWatch({"ttft_p50": 1.0}, 4)
    for first in (2.0, 3.0):  # first tokens never told are counted at the finish
        untold.finished(0.0, first, 9.0, 5)
    assert untold.decided is None
    untold.finished(0.0, 4.0, 9.0, 5)
    assert untold.decided and untold.missed["ttft_p50"] == 2.0


def test_a_stopped_run_told_first_tokens_decides_before_any_finish_could() -> None:
    """Overloaded, a TTFT limit is settled by first tokens: the run stops with fewer requests
    finished than it takes to decide from finishes alone, and the verdict is the full run's."""
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=1, slo={"ttft_p90": 1.0})
    workload = load_workload(TRACE, seed=1)
    full = simulate(config, workload)
    watched = simulate(config, workload, stop_when_slo_missed=True)
    assert not meets(full.summary) and not meets(watched.summary)
    needed = len(workload) - int(0.9 * (len(workload) - 1))  # values over the limit that decide p90
    assert watched.summary.num_finished < needed
    assert full.summary.slo.measured["ttft_p90"] >= watched.summary.slo.measured["ttft_p90"] > 1.0
