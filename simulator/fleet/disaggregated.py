"""Prefill/decode disaggregation (DistServe, Splitwise, vLLM's P/D serving): a pool of prefill
replicas and a pool of decode replicas, each behind its own router, simulated together. No torch.

A request's life:
- it arrives at the prefill pool, whose router picks a replica; that replica computes the prompt
  and samples the first token (it runs the request as one of a single output token);
- the prompt's KV goes to the decode replica the decode pool's router picks, over the prefill
  replica's link: kv_transfer_latency_s plus the KV's bytes on one GPU / kv_transfer_gbps, one
  transfer at a time per prefill replica (later ones queue);
- the prefill replica is done with the request when its engine has put out the first token (the
  engine profile's output delay included); the transfer starts then, and the client gets the first
  token when it ends (the handoff carries it): TTFT includes the transfer and its wait;
- the decode replica takes the request with the prompt's full blocks computed (tiered_pool.py:
  arrived blocks); its first step computes the last partial block and the first token, and it
  generates the rest. Its KV blocks limit its admissions, as for any request.
A request of one output token ends at its prefill replica.

Simplifications, stated: a prefill replica frees the prompt's blocks when its prefill ends (vLLM's
keeps them until the decode instance has pulled them); a transfer does not slow the steps it
overlaps. Handoffs reach the decode pool at any moment, not at the trace's known arrival times, so
its replicas take one SimPy event a step (slower to simulate, the same decisions).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import simpy

from simulator.fleet.clients import ClientGate
from simulator.fleet.fleet import FleetRecord, FleetSetup, fleet_record, ingress_s, make_replicas, reject_stuck
from simulator.fleet.metrics import Recorder
from simulator.fleet.replica import ArrivalClock, ArrivalsAnyTime
from simulator.fleet.router import Router
from simulator.fleet.summary_parts import Disaggregation, Pool, Transfer
from simulator.workload.requests import Clients


@dataclass
class _Handoff:
    """What a request's prefill leaves for its record."""

    arrival_s: float
    prompt_tokens: int
    first_scheduled_s: float
    first_token_s: float  # when its transfer ended
    preemptions: int
    cached_prompt_tokens: int


@dataclass
class _Finished:
    """A disaggregated request as Recorder.finish reads a Sequence: prefill's part and decode's."""

    request_id: int
    arrival_time: float
    num_prompt_tokens: int
    num_output_tokens: int
    first_scheduled_time: float
    first_token_time: float
    finish_time: float
    num_preemptions: int
    num_cached_prompt_tokens: int
    token_times: list[float]


def simulate_disaggregated(prefill: FleetSetup, decode: FleetSetup, requests: list,
                           on_done: Callable[[int], None] | None = None,
                           clients: Clients | None = None) -> tuple[FleetRecord, dict]:
    """Simulate the two pools (SimConfig.pool_configs: the link is the prefill pool's
    kv_transfer_gbps and kv_transfer_latency_s) on the requests in arrival order (or sent by
    closed-loop clients: simulator/fleet/clients.py): the fleet's record (every request's row from
    its decode replica, or its prefill replica for one-token requests) and the pools' own figures
    (pool_figures' input)."""
    env, recorder = simpy.Environment(), Recorder()
    ingress = ingress_s(decode.cost_model)
    gate = ClientGate(env, clients, requests, ingress) if clients is not None else None
    clock = gate or ArrivalClock(requests[0].arrival_s + ingress)
    num_prefill, num_decode = prefill.config.replicas, decode.config.replicas
    prefill_replicas, prefill_timer = make_replicas(prefill, env, recorder, clock, list(range(num_prefill)))
    decode_replicas, decode_timer = make_replicas(decode, env, recorder, ArrivalsAnyTime(env),
                                                  list(range(num_prefill, num_prefill + num_decode)),
                                                  arrivals_elsewhere=True)
    prefill_router = Router(prefill.config.router, prefill_replicas)
    decode_router = Router(decode.config.router, decode_replicas)
    links = [simpy.Resource(env, capacity=1) for _ in prefill_replicas]
    # One GPU's share of each prompt token: each rank sends its own at once (under the prefill
    # pool's context parallelism, its 1/cp of the prompt).
    per_token_bytes = prefill.plan.kv_bytes_per_sequence_token
    latency_s, bytes_per_s = prefill.config.kv_transfer_latency_s, prefill.config.kv_transfer_gbps * 1e9
    block_size = decode.plan.scheduled_block_size
    originals: dict[int, object] = {}
    handoffs: dict[int, _Handoff] = {}
    transfers: list[tuple[float, float]] = []  # (wait for the link, transfer) seconds
    if on_done is not None:
        recorder.on_progress(on_done, every=max(1, len(requests) // 200))

    def prefilled(seq, index: int) -> None:
        request = originals.pop(seq.request_id)
        if request.output_tokens <= 1:
            recorder.finish(seq, index)
        else:
            env.process(transfer(seq, request, index))

    def transfer(seq, request, index: int):
        # The replica's steps run ahead of SimPy's clock between arrivals: start when the prefill ended.
        if seq.finish_time > env.now:
            yield env.timeout(seq.finish_time - env.now)
        asked = env.now
        with links[index].request() as slot:
            yield slot
            wait = env.now - asked
            duration = latency_s + request.prompt_tokens * per_token_bytes / bytes_per_s
            yield env.timeout(duration)
        transfers.append((wait, duration))
        handoffs[seq.request_id] = _Handoff(request.arrival_s, request.prompt_tokens, seq.first_scheduled_time,
                                            env.now, seq.num_preemptions, seq.num_cached_prompt_tokens)
        onward = replace(request, arrival_s=env.now, prompt_tokens=request.prompt_tokens + 1,
                         output_tokens=request.output_tokens - 1)
        decode_router.route(onward).submit(onward, arrived_blocks=request.prompt_tokens // block_size)

    def decoded(seq, index: int) -> None:
        h = handoffs.pop(seq.request_id)
        recorder.finish(_Finished(seq.request_id, h.arrival_s, h.prompt_tokens, seq.num_output_tokens + 1,
                                  h.first_scheduled_s, h.first_token_s, seq.finish_time,
                                  h.preemptions + seq.num_preemptions, h.cached_prompt_tokens,
                                  [h.first_token_s, *seq.token_times]), index)

    for replica in prefill_replicas:
        replica.on_finish = prefilled
    for replica in decode_replicas:
        replica.on_finish = decoded

    def arrivals():
        for i, request in enumerate(requests):
            if request.arrival_s + ingress > env.now:
                yield env.timeout(request.arrival_s + ingress - env.now)
            clock.next_arrival_s = requests[i + 1].arrival_s + ingress if i + 1 < len(requests) else math.inf
            originals[request.request_id] = request
            prefill_router.route(request).submit(replace(request, output_tokens=1))

    def send(request) -> None:  # a closed-loop client's request, when the gate lets it go
        originals[request.request_id] = request
        prefill_router.route(request).submit(replace(request, output_tokens=1))

    if gate is None:
        env.process(arrivals())
    else:
        recorder.on_request_done = gate.done
        env.process(gate.sends(send))
    env.run()
    recorder.on_request_done = None
    recorder.on_progress(None)
    reject_stuck(prefill_replicas + decode_replicas, recorder)
    busy = {"prefill": sum(r.busy_s for r in prefill_replicas), "decode": sum(r.busy_s for r in decode_replicas)}
    prefill_record = fleet_record(prefill.config, recorder, prefill_timer, prefill_replicas, [])
    record = fleet_record(decode.config, recorder, decode_timer, decode_replicas,
                          list(range(num_prefill + num_decode)))
    record.split.merge(prefill_record.split)
    record.busy_s += prefill_record.busy_s
    if record.offload is not None and prefill_record.offload is not None:
        record.offload = {k: v + prefill_record.offload[k] for k, v in record.offload.items()}
    return record, {"busy_s": busy, "transfers": transfers}


def pool_figures(prefill: FleetSetup, decode: FleetSetup, figures: dict, duration_s: float) -> Disaggregation:
    """The summary's "disaggregation" section: each pool's make-up and how busy it was, and the KV
    transfers (how many, how much, how long, how long they waited for their link)."""
    def pool(setup: FleetSetup, name: str) -> Pool:
        c = setup.config
        return Pool(replicas=c.replicas, hardware=c.hardware, tp=c.tp, cp=c.cp, quant=c.quant, gpus=c.num_gpus,
                    kv_blocks_per_replica=setup.plan.num_blocks,
                    busy_fraction=figures["busy_s"][name] / (c.replicas * c.pp * max(duration_s, 1e-12)))

    transfers = np.array(figures["transfers"]) if figures["transfers"] else np.zeros((0, 2))
    waits, times = transfers[:, 0], transfers[:, 1]

    def stat(values: np.ndarray, q: float | None = None) -> float | None:
        if not len(values):
            return None
        return float(values.mean() if q is None else np.percentile(values, q))
    return Disaggregation(pool(prefill, "prefill"), pool(decode, "decode"),
                          Transfer(link_gbps=prefill.config.kv_transfer_gbps,
                                   latency_s=prefill.config.kv_transfer_latency_s,
                                   count=int(len(times)), mean_s=stat(times), p99_s=stat(times, 99),
                                   wait_mean_s=stat(waits), wait_p99_s=stat(waits, 99)))
