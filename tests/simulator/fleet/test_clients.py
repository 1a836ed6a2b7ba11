"""Closed-loop clients (simulator/fleet/clients.py): at most C requests in flight, each sent as a
client frees up, never before its arrival; bulk decode runs change nothing under them."""

from __future__ import annotations

import numpy as np
import pytest

import simpy

from simulator.fleet.clients import ClientGate
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload
from simulator.workload.requests import Clients, Request
from tests.simulator.helpers import assert_same_simulation

CONFIG = dict(model="llama-3.1-8b", hardware="a100-80gb")


def in_flight_at_sends(requests) -> np.ndarray:
    """Requests in flight just after each send (a send at the instant of a finish counts after it)."""
    sent, done = requests.arrival_s.to_numpy(), requests.finish_s.to_numpy()
    return np.array([((sent <= t) & (done > t)).sum() for t in sent])


@pytest.mark.parametrize("concurrency", [1, 3, 16])
def test_never_more_than_c_in_flight_and_each_client_busy(concurrency) -> None:
    workload = load_workload(f"synthetic:num=120,input=uniform(20,600),output=uniform(5,200),concurrency={concurrency}")
    requests = simulate(SimConfig(**CONFIG), workload).requests.sort_values("arrival_s")
    assert len(requests) == 120
    in_flight = in_flight_at_sends(requests)
    assert in_flight.max() == concurrency
    # With no think time, every send after the first C follows a finish at the same instant.
    finishes = set(np.round(requests.finish_s.to_numpy(), 12))
    later = np.round(requests.arrival_s.to_numpy()[concurrency:], 12)
    assert all(t in finishes for t in later)
    assert (requests.arrival_s.to_numpy()[:concurrency] == 0).all()


def test_think_time_delays_each_clients_next_request() -> None:
    spec = "synthetic:num=40,input=100,output=20,concurrency=1"
    plain = simulate(SimConfig(**CONFIG), load_workload(spec)).requests.sort_values("arrival_s")
    thinking = simulate(SimConfig(**CONFIG), load_workload(spec + ",think=2.5")).requests.sort_values("arrival_s")
    gaps = thinking.arrival_s.to_numpy()[1:] - thinking.finish_s.to_numpy()[:-1]
    assert np.allclose(gaps, 2.5)
    # The same requests, each served alone: the same latencies, the run 39 thinks longer.
    assert np.allclose((thinking.finish_s - thinking.arrival_s).to_numpy(), (plain.finish_s - plain.arrival_s).to_numpy())
    assert thinking.finish_s.max() == pytest.approx(plain.finish_s.max() + 39 * 2.5)


def test_a_trace_file_keeps_its_arrivals_under_a_concurrency_cap() -> None:
    trace = "../shared/traces/splitwise_conv.csv,limit=300"
    open_loop = simulate(SimConfig(**CONFIG), load_workload(trace)).requests.sort_values("request_id")
    capped = simulate(SimConfig(**CONFIG), load_workload(trace + ",concurrency=4")).requests.sort_values("request_id")
    assert (capped.arrival_s.to_numpy() >= open_loop.arrival_s.to_numpy() - 1e-12).all()  # never before its time
    assert in_flight_at_sends(capped).max() <= 4
    assert (capped.arrival_s.to_numpy() > open_loop.arrival_s.to_numpy() + 1e-9).any()  # the cap held some back
    assert np.all(np.diff(capped.arrival_s.to_numpy()) >= 0)  # sent in trace order
    wide = simulate(SimConfig(**CONFIG), load_workload(trace + ",concurrency=10000")).requests.sort_values("request_id")
    assert np.array_equal(wide.arrival_s.to_numpy(), open_loop.arrival_s.to_numpy())  # a cap never reached


def test_a_finish_told_later_but_due_sooner_sends_the_next_request_first() -> None:
    # Finishes are told at the end of the step they follow, each with its own output delay, so a
    # later report can free a client sooner; the gate must send at that sooner time, in order.
    env = simpy.Environment()
    gate = ClientGate(env, Clients(concurrency=2), [Request(i, 0.0, 10, 10) for i in range(4)], ingress_s=0.0)
    sent: list[tuple[int, float]] = []
    bounds: list[float] = []
    env.process(gate.sends(lambda r: sent.append((r.request_id, r.arrival_s))))

    def replicas():
        yield env.timeout(1.0)
        gate.done(3.0)
        yield env.timeout(0.5)
        bounds.append(gate.next_arrival_s)
        gate.done(2.0)

    env.process(replicas())
    env.run()
    assert sent == [(0, 0.0), (1, 0.0), (2, 2.0), (3, 3.0)]
    assert bounds[0] <= 2.0  # the clock never promised a later arrival than the one that came


@pytest.mark.parametrize("spec, knobs", [
    ("synthetic:num=150,input=uniform(20,900),output=uniform(1,300),concurrency=24", {}),
    ("synthetic:num=120,input=uniform(20,900),output=uniform(1,300),concurrency=40,think=0.05",
     dict(num_gpu_blocks=300, max_model_len=2048)),
    ("synthetic:num=120,input=uniform(20,400),output=uniform(20,200),concurrency=12", dict(replicas=3)),
    ("synthetic:num=100,input=uniform(20,400),output=uniform(20,200),concurrency=10",
     dict(replicas=2, router="least_outstanding_tokens")),
])
def test_bulk_decode_runs_equal_step_by_step_under_closed_loop(spec, knobs) -> None:
    config = SimConfig(**CONFIG, **knobs)
    bulk = simulate(config, load_workload(spec, seed=3))
    stepwise = simulate(config, load_workload(spec, seed=3), bulk_decodes=False)
    assert_same_simulation(bulk, stepwise, ("ttft_s", "tpot_s", "e2e_s", "throughput", "preemptions", "time_split_s"))


def test_more_clients_more_throughput_and_slower_tokens() -> None:
    def run(c):
        return simulate(SimConfig(**CONFIG), load_workload(f"synthetic:num=200,input=512,output=128,concurrency={c}"))
    low, high = run(2), run(32)
    assert high.summary.throughput.output_tokens_per_s > 3 * low.summary.throughput.output_tokens_per_s
    assert high.summary.tpot_s.mean > low.summary.tpot_s.mean


def test_a_disaggregated_fleet_serves_closed_loop_clients() -> None:
    config = SimConfig(**CONFIG, disaggregate="1:1")
    requests = simulate(config, load_workload("synthetic:num=60,input=uniform(50,400),output=uniform(1,80),"
                                              "concurrency=6")).requests.sort_values("arrival_s")
    assert len(requests) == 60 and in_flight_at_sends(requests).max() == 6
    finishes = set(np.round(requests.finish_s.to_numpy(), 12))
    assert all(t in finishes for t in np.round(requests.arrival_s.to_numpy()[6:], 12))
