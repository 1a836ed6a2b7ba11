"""Some replicas of a fleet behind its router, simulated on the requests routed among them: what
every replica of a run shares (FleetSetup) and what simulating them leaves (FleetRecord). No torch."""

from __future__ import annotations

import functools
import gc
import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import simpy

from engine.policy.config import CacheConfig, SchedulerConfig
from engine.policy.policies import scheduler_class
from simulator.catalog.models import ModelSpec
from simulator.cost.memory import GB, MemoryPlan
from simulator.cost.model import CostModel
from simulator.cost.shape import ReplicaShape, weight_dtype_of
from simulator.cost.step_parts import StepTally
from simulator.cost.step_timer import StepTimer
from simulator.fleet.block_pool import ExactKeyBlockPool
from simulator.fleet.clients import ClientGate
from simulator.fleet.tiered_pool import HOST_LINK_EFFICIENCY, TieredBlockPool
from simulator.fleet.metrics import Recorder
from simulator.fleet.replica import ArrivalClock, Replica
from simulator.fleet.router import Router
from simulator.fleet.sim_config import SimConfig
from simulator.fleet.slo_watch import SloWatch
from simulator.fleet.speculation import Speculation, acceptance_profile, request_rates
from simulator.fleet.static_batching import StaticBatchScheduler
from simulator.workload.block_keys import BlockKeys
from simulator.workload.requests import Clients, Request


@dataclass
class FleetSetup:
    """What every replica of a run shares, whichever process simulates it."""

    config: SimConfig
    model: ModelSpec  # config.check()'s, as the replicas need them
    plan: MemoryPlan
    cost_model: CostModel
    draft_cost_model: CostModel | None
    bulk_decodes: bool
    exact_block_keys: bool
    sample_every_s: float  # time-series interval of each replica


@dataclass
class FleetRecord:
    """What simulating some of a fleet's replicas leaves for its summary."""

    recorder: Recorder
    split: StepTally
    busy_s: float  # summed over the replicas
    speculation: list[dict]  # per replica with speculative decoding: its counts (Speculation.counts)
    replicas: list[int]  # the replicas simulated (global indices)
    offload: dict[str, float] | None = None  # with a host KV tier: its counts, summed (host_tier_counts)

    @classmethod
    def merged(cls, records: list["FleetRecord"]) -> "FleetRecord":
        if len(records) == 1:
            return records[0]
        # In replica order: the merged rows and samples do not depend on which process ran what.
        records = sorted(records, key=lambda r: r.replicas)
        recorder, split = Recorder(), StepTally()
        for r in records:
            recorder.merge(r.recorder)
            split.merge(r.split)
        offload = None
        if records[0].offload is not None:
            offload = {k: sum(r.offload[k] for r in records) for k in records[0].offload}
        return cls(recorder, split, sum(r.busy_s for r in records), [s for r in records for s in r.speculation],
                   [i for r in records for i in r.replicas], offload)


def make_replicas(fleet: FleetSetup, env: simpy.Environment, recorder: Recorder, clock: ArrivalClock,
                  indices: list[int], timer: StepTimer | None = None, arrivals_elsewhere: bool = False
                  ) -> tuple[list[Replica], StepTimer]:
    """The fleet's replicas of these global indices in env (and the step timer they share).
    arrivals_elsewhere: their requests may bring prompts another replica computed (a disaggregated
    fleet's decode pool): their pools take them (tiered_pool.py)."""
    config, cost_model, model, plan = fleet.config, fleet.cost_model, fleet.model, fleet.plan
    max_len = config.resolved_max_model_len(model, plan)
    pp = config.pp
    blocks_per_engine = plan.num_blocks // pp
    if blocks_per_engine < 1:
        raise ValueError(f"{plan.num_blocks} KV blocks cannot be shared by pp={pp} virtual engines: use a smaller pp")
    scheduler_config = SchedulerConfig(max_num_seqs=max(1, config.max_num_seqs // pp),
                                       max_num_batched_tokens=config.max_num_batched_tokens,
                                       max_model_len=max_len, enable_chunked_prefill=config.enable_chunked_prefill,
                                       num_lookahead_tokens=config.num_speculative_tokens if config.speculative else 0)
    # The engine's scheduler and pool; with prefix caching, the pool's subclass that takes exact block
    # keys (simulator/workload/block_keys.py, simulator/fleet/block_pool.py) instead of hashing each
    # block's tokens: the same decisions, a fraction of the work. Blocks are the plan's as the
    # block manager counts them (virtual blocks under context parallelism).
    exact_keys = fleet.exact_block_keys and config.enable_prefix_caching and config.scheduler != "static"
    cache_config = CacheConfig(plan.scheduled_block_size, blocks_per_engine, config.enable_prefix_caching)
    block_keys = BlockKeys(plan.scheduled_block_size) if exact_keys else None
    pool_class = ExactKeyBlockPool if exact_keys else None
    if config.kv_offload_gb or arrivals_elsewhere:
        if config.kv_offload_gb and not exact_keys:
            raise ValueError("kv_offload_gb needs the simulator's exact block keys (exact_block_keys=True)")
        pool_class = tiered_pool_class(config, plan, fleet.cost_model)

    policy = scheduler_class(cost_model.engine.scheduler_policy if cost_model.engine is not None else "vllm")

    def make_scheduler():
        if config.scheduler == "static":
            return StaticBatchScheduler(scheduler_config, cache_config)
        if pool_class is not None:
            return policy(scheduler_config, cache_config, block_manager_class=pool_class)
        return policy(scheduler_config, cache_config)

    if timer is None:
        timer = StepTimer(cost_model, replica_shape(config, model))
    speculation = make_speculation(config, model, cost_model, fleet.draft_cost_model)
    delay = cost_model.engine.output_delay_steps if cost_model.engine is not None else 0.0
    replicas = [Replica(env, i, make_scheduler, timer, recorder, clock, pp, fleet.sample_every_s, fleet.bulk_decodes,
                        speculation(i) if speculation else None, block_keys, delay, keyed=pool_class is not None)
                for i in indices]
    return replicas, timer


def ingress_s(cost_model: CostModel) -> float:
    """The engine sees a request this long after the client sent it (API server, tokenization; its
    streamed answer's way back is counted here too): the client's TTFT and E2E include it."""
    return cost_model.engine.request_s if cost_model.engine is not None else 0.0


def simulate_replicas(fleet: FleetSetup, requests: list, replica_indices: list[int], timer: StepTimer | None = None,
                      on_done: Callable[[int], None] | None = None, watch: SloWatch | None = None,
                      clients: Clients | None = None) -> FleetRecord:
    """Simulate these replicas of the fleet (their global indices) behind the config's router, on
    the requests routed among them, in arrival order (clients: sent by these closed-loop clients,
    simulator/fleet/clients.py). on_done(number done) as requests finish."""
    config = fleet.config
    env = simpy.Environment()
    ingress = ingress_s(fleet.cost_model)
    gate = ClientGate(env, clients, requests, ingress) if clients is not None else None
    clock = gate or ArrivalClock(requests[0].arrival_s + ingress)
    recorder = Recorder()
    recorder.watch = watch
    replicas, timer = make_replicas(fleet, env, recorder, clock, replica_indices, timer)
    router = Router(config.router, replicas)
    if on_done is not None:
        recorder.on_progress(on_done, every=max(1, len(requests) // 200))
    if gate is not None:
        recorder.on_request_done = gate.done

    def arrivals():
        for i, request in enumerate(requests):
            if request.arrival_s + ingress > env.now:
                yield env.timeout(request.arrival_s + ingress - env.now)
            clock.next_arrival_s = requests[i + 1].arrival_s + ingress if i + 1 < len(requests) else math.inf
            router.route(request).submit(request, at_s=request.arrival_s + ingress)

    def send(request: Request) -> None:  # the gate's: sent at arrival_s, here ingress later
        router.route(request).submit(request, at_s=request.arrival_s + ingress)

    env.process(arrivals() if gate is None else gate.sends(send))
    if watch is None:
        env.run()
    else:
        while watch.decided is None and env.peek() != math.inf:
            env.step()
    recorder.watch = recorder.on_request_done = None
    recorder.on_progress(None)
    if watch is None or watch.decided is None:
        reject_stuck(replicas, recorder)
    return fleet_record(config, recorder, timer, replicas, replica_indices)


def reject_stuck(replicas: list[Replica], recorder: Recorder) -> None:
    """Requests still in the replicas when the run ended could never be scheduled (not merely cut
    off by a stop): rejected with that reason."""
    for replica in replicas:
        for engine in replica.engines:
            for seq in engine.sequences.values():
                recorder.reject(seq.request_id, seq.arrival_time, seq.num_prompt_tokens, seq.sampling.max_tokens,
                                "never scheduled: the replica could not fit it alongside its other requests")


def fleet_record(config: SimConfig, recorder: Recorder, timer: StepTimer, replicas: list[Replica],
                 indices: list[int]) -> FleetRecord:
    """What the run leaves (the replicas then let go of their pools)."""
    recorder.flush_gaps()  # binned here, where they were simulated: the record sent back stays small
    record = FleetRecord(recorder, timer.split, sum(r.busy_s for r in replicas),
                         [r.speculation.counts() for r in replicas if r.speculation is not None], indices,
                         host_tier_counts(replicas) if config.kv_offload_gb else None)
    for replica in replicas:
        replica.release()
    return record


def tiered_pool_class(config: SimConfig, plan: MemoryPlan, cost_model: CostModel):
    """The tiered pool class of a replica's virtual engines (tiered_pool.py): the config's host tier,
    its kv_offload_gb shared by the pp engines, each block's bytes on one GPU over its host link."""
    if not config.kv_offload_gb:
        return TieredBlockPool
    per_block_gpu, per_block_replica = config.kv_block_bytes(plan)
    host_blocks = int(config.kv_offload_gb * GB // per_block_replica) // config.pp
    if host_blocks < 1:
        raise ValueError(f"kv_offload_gb={config.kv_offload_gb:g} holds no {per_block_replica / 1e6:.1f} MB KV block "
                         "of this model: give more host memory, or none")
    link = cost_model.accelerator.host_link_gbps * 1e9 * HOST_LINK_EFFICIENCY
    return functools.partial(TieredBlockPool, host_blocks=host_blocks, load_s_per_block=per_block_gpu / link)


def host_tier_counts(replicas: list[Replica]) -> dict[str, float]:
    """Blocks offloaded to and loaded from the host tiers of these replicas, and the load time."""
    pools = [e.scheduler.block_manager for r in replicas for e in r.engines]
    return {"offloaded_blocks": sum(p.offloaded_blocks for p in pools),
            "loaded_blocks": sum(p.loaded_blocks for p in pools),
            "load_s": sum(p.loaded_blocks * p.load_s_per_block for p in pools)}


@contextmanager
def cyclic_gc_paused():
    """Python's cyclic garbage collector paused for the block: a simulation holds millions of
    long-lived tuples (block identities, scheduled chunks) that each collection would walk again,
    a third of the run's time, while it makes almost no cyclic garbage. Restored on exit."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def replica_shape(config: SimConfig, model: ModelSpec) -> ReplicaShape:
    """What one of config's replicas runs (the step assembler's input)."""
    return ReplicaShape(model, config.tp, config.pp, config.cp, config.compute_dtype,
                        weight_dtype_of(config.quant, config.compute_dtype), config.cache_dtype, config.block_size,
                        config.expert_parallel, config.routing_skew)


def make_speculation(config: SimConfig, model, cost_model: CostModel,
                     draft_costs: CostModel | None = None) -> Callable[[int], Speculation] | None:
    """replica index -> that replica's speculative-decoding model (None when off). The acceptance
    profile and the draft's timer are built once and shared; acceptance draws are seeded per replica."""
    if config.speculative is None:
        return None
    cumulative = acceptance_profile(config.acceptance, config.acceptance_file, config.num_speculative_tokens,
                                    config.acceptance_preset)
    rates = request_rates(config.acceptance_file)
    draft = config.draft_spec(model)
    draft_timer = None
    if draft is not None:
        # A profile of the draft itself, where given: small models are bound by per-operator
        # overheads that the target's curves extrapolate poorly.
        if draft_costs is None:
            draft_costs = cost_model if config.draft_profile is None else CostModel.load(
                config.hardware, profile=config.draft_profile, hardware_file=config.hardware_file)
        draft_timer = StepTimer(draft_costs, ReplicaShape(draft, config.tp, 1, 1, config.compute_dtype,
                                                          weight_dtype_of(config.quant, config.compute_dtype),
                                                          config.cache_dtype, config.block_size))
    return lambda replica: Speculation(cumulative, seed=config.seed * 100_003 + replica, draft_timer=draft_timer,
                                       request_rates=rates)
