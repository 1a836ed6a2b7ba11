"""simulate(SimConfig, workload) -> SimResult: a fleet of replicas behind a router. No torch."""

from __future__ import annotations

import gc
import math
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import pandas as pd
import simpy

from engine.config import CacheConfig, SchedulerConfig
from engine.scheduler import Scheduler
from simulator.workload.block_keys import BlockKeys
from simulator.fleet.block_pool import ExactKeyBlockPool
from simulator.catalog.models import ModelSpec
from simulator.cost.model import CostModel
from simulator.cost.memory import MemoryPlan
from simulator.fleet.metrics import Recorder, distribution, slo_attainment
from simulator.fleet.replica import ArrivalClock, Replica
from simulator.fleet.router import Router
from simulator.fleet.sim_config import SimConfig
from simulator.fleet.slo_watch import SloWatch
from simulator.fleet.static_batching import StaticBatchScheduler
from simulator.fleet.speculation import Speculation, acceptance_profile, request_rates
from simulator.cost.step_timer import StepTimer, TimeSplit
from simulator.workload.requests import Workload

# Time-series samples per replica over the workload's span, when no interval is set.
DEFAULT_SAMPLES = 400


@dataclass
class SimResult:
    config: SimConfig
    summary: dict
    requests: pd.DataFrame
    timeseries: pd.DataFrame
    memory: MemoryPlan


def simulate(config: SimConfig, workload: Workload, cost_model: CostModel | None = None,
             progress: Callable[[int, int], None] | None = None, timer: StepTimer | None = None,
             bulk_decodes: bool = True, draft_cost_model: CostModel | None = None,
             stop_when_slo_missed: bool = False, exact_block_keys: bool = True, workers: int = 1) -> SimResult:
    """Run the workload through config's fleet. progress(done, total) is called as requests finish.
    timer replaces the cost model's step times (tests use fixed or replayed step times);
    bulk_decodes=False takes every steady decode step through the scheduler one by one (same results);
    draft_cost_model: the speculative draft's (default: loaded from config.draft_profile, else cost_model).
    stop_when_slo_missed: end the run as soon as missing config.slo is certain (simulator/fleet/slo_watch.py);
    the summary then covers the requests finished so far and says why under "stopped_early".
    exact_block_keys=False: the block pool hashes every block's tokens, as in the engine (same results).
    workers: processes for a fleet whose replicas never interact (simulator/fleet/replica_groups.py: such
    replicas are simulated one by one, over this many processes): every request's timings are the
    same as when the whole fleet is simulated together."""
    if not len(workload):
        raise ValueError("the workload has no requests")
    model, accelerator, plan = config.check()
    if cost_model is None:
        cost_model = CostModel.load(config.hardware, profile=config.profile, hardware_file=config.hardware_file)
    fleet = FleetSetup(config, model, plan, cost_model, draft_cost_model, bulk_decodes, exact_block_keys,
                       config.timeseries_interval_s or max(workload.duration_s, 1e-3) / DEFAULT_SAMPLES)
    from simulator.fleet import replica_groups  # here: it imports this module

    stopped_early, watch = None, None
    # The collector stays paused until the replicas have let go of their block pools: re-enabled
    # while they are alive, its first collection would walk every block entry of the run.
    with cyclic_gc_paused():
        on_done = (lambda done: progress(done, len(workload))) if progress is not None else None
        if stop_when_slo_missed:
            watch = SloWatch(config.slo, len(workload), sum(r.output_tokens >= 2 for r in workload))
        if replica_groups.applies(config) and timer is None:
            if watch is not None:  # one watch hears of every request: one process
                records = replica_groups.simulate_each(fleet, workload, list(range(config.replicas)), on_done, watch)
            else:
                records = replica_groups.simulate_groups(fleet, workload, workers, progress)
        else:
            records = [simulate_replicas(fleet, workload.requests, list(range(config.replicas)), timer, on_done,
                                         watch)]
        stopped_early = watch.decided if watch is not None else None
        if progress is not None:
            progress(len(workload), len(workload))
        record = FleetRecord.merged(records)
        requests = record.recorder.requests_frame()
        timeseries = record.recorder.timeseries_frame()
        summary = summarize(config, accelerator, cost_model, plan, record, requests, timeseries)
    if stopped_early:
        summary["stopped_early"] = stopped_early
        slo = summary["slo"]
        for key, bound in watch.missed.items():
            slo["measured"][key], slo["met"][key] = bound, False
        slo["all_met"] = False
    return SimResult(config, summary, requests, timeseries, plan)


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
    split: TimeSplit
    busy_s: float  # summed over the replicas
    speculation: list[dict]  # per replica with speculative decoding: its counts (Speculation.counts)
    replicas: list[int]  # the replicas simulated (global indices)

    @classmethod
    def merged(cls, records: list["FleetRecord"]) -> "FleetRecord":
        if len(records) == 1:
            return records[0]
        # In replica order: the merged rows and samples do not depend on which process ran what.
        records = sorted(records, key=lambda r: r.replicas)
        recorder, split = Recorder(), TimeSplit()
        for r in records:
            recorder.merge(r.recorder)
            split.merge(r.split)
        return cls(recorder, split, sum(r.busy_s for r in records), [s for r in records for s in r.speculation],
                   [i for r in records for i in r.replicas])


def simulate_replicas(fleet: FleetSetup, requests: list, replica_indices: list[int], timer: StepTimer | None = None,
                      on_done: Callable[[int], None] | None = None, watch: SloWatch | None = None) -> FleetRecord:
    """Simulate these replicas of the fleet (their global indices) behind the config's router, on
    the requests routed among them, in arrival order. on_done(number done) as requests finish."""
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
    # block's tokens: the same decisions, a fraction of the work.
    exact_keys = fleet.exact_block_keys and config.enable_prefix_caching and config.scheduler != "static"
    cache_config = CacheConfig(config.block_size, blocks_per_engine, config.enable_prefix_caching)
    block_keys = BlockKeys(config.block_size) if exact_keys else None

    def make_scheduler():
        if config.scheduler == "static":
            return StaticBatchScheduler(scheduler_config, cache_config)
        if exact_keys:
            return Scheduler(scheduler_config, cache_config, block_manager_class=ExactKeyBlockPool)
        return Scheduler(scheduler_config, cache_config)

    weight_dtype = None if config.quant in ("bf16", "fp16", "fp32", config.compute_dtype) else config.quant
    if timer is None:
        timer = StepTimer(cost_model, model, config.tp, pp, config.compute_dtype, weight_dtype, config.cache_dtype,
                          config.block_size, expert_parallel=config.expert_parallel,
                          routing_skew=config.routing_skew)
    env = simpy.Environment()
    clock = ArrivalClock(requests[0].arrival_s)
    recorder = Recorder()
    recorder.watch = watch
    speculation = make_speculation(config, model, cost_model, weight_dtype, fleet.draft_cost_model)
    replicas = [Replica(env, i, make_scheduler, timer, recorder, clock, pp, fleet.sample_every_s, fleet.bulk_decodes,
                        speculation(i) if speculation else None, block_keys) for i in replica_indices]
    router = Router(config.router, replicas)
    if on_done is not None:
        recorder.on_progress(on_done, every=max(1, len(requests) // 200))

    def arrivals():
        for i, request in enumerate(requests):
            if request.arrival_s > env.now:
                yield env.timeout(request.arrival_s - env.now)
            clock.next_arrival_s = requests[i + 1].arrival_s if i + 1 < len(requests) else math.inf
            router.route(request).submit(request)

    env.process(arrivals())
    if watch is None:
        env.run()
    else:
        while watch.decided is None and env.peek() != math.inf:
            env.step()
    recorder.watch = None
    recorder.on_progress(None)
    if watch is None or watch.decided is None:
        for replica in replicas:  # anything left could never be scheduled (not merely cut off by a stop)
            for engine in replica.engines:
                for seq in engine.sequences.values():
                    recorder.reject(seq.request_id, seq.arrival_time, seq.num_prompt_tokens,
                                    seq.sampling.max_tokens,
                                    "never scheduled: the replica could not fit it alongside its other requests")
    recorder.flush_gaps()  # binned here, where they were simulated: the record sent back stays small
    record = FleetRecord(recorder, timer.split, sum(r.busy_s for r in replicas),
                         [r.speculation.counts() for r in replicas if r.speculation is not None], replica_indices)
    for replica in replicas:
        replica.release()
    return record


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


def make_speculation(config: SimConfig, model, cost_model: CostModel, weight_dtype: str | None,
                     draft_costs: CostModel | None = None) -> Callable[[int], Speculation] | None:
    """replica index -> that replica's speculative-decoding model (None when off). The acceptance
    profile and the draft's timer are built once and shared; acceptance draws are seeded per replica."""
    if config.speculative is None:
        return None
    cumulative = acceptance_profile(config.acceptance, config.acceptance_file, config.num_speculative_tokens)
    rates = request_rates(config.acceptance_file)
    draft = config.draft_spec(model)
    draft_timer = None
    if draft is not None:
        # A profile of the draft itself, where given: small models are bound by per-operator
        # overheads that the target's curves extrapolate poorly.
        if draft_costs is None:
            draft_costs = cost_model if config.draft_profile is None else CostModel.load(
                config.hardware, profile=config.draft_profile, hardware_file=config.hardware_file)
        draft_timer = StepTimer(draft_costs, draft, config.tp, 1, config.compute_dtype, weight_dtype,
                                config.cache_dtype, config.block_size)
    return lambda replica: Speculation(cumulative, seed=config.seed * 100_003 + replica, draft_timer=draft_timer,
                                       request_rates=rates)


def summarize(config: SimConfig, accelerator, cost_model: CostModel, plan: MemoryPlan, record: FleetRecord,
              requests: pd.DataFrame, timeseries: pd.DataFrame) -> dict:
    finished = requests[requests["status"] == "finished"]
    rejected = requests[requests["status"] == "rejected"]
    start = float(requests["arrival_s"].min())
    end = float(finished["finish_s"].max()) if len(finished) else start
    duration = max(end - start, 1e-12)
    output_tokens = int(finished["output_tokens"].sum())
    prompt_tokens = int(finished["prompt_tokens"].sum())
    slo = slo_attainment(requests, config.slo, record.recorder)
    within = slo.pop("within_slo_mask")
    gpus = config.num_gpus
    split = record.split
    # Each of a replica's pp virtual engines is busy for its micro-batches' whole pipeline trips.
    busy = record.busy_s / (config.replicas * config.pp)
    peak = cost_model.peak_flops(config.compute_dtype)
    usd_per_hour = accelerator.price_per_hour_usd * gpus if accelerator.price_per_hour_usd is not None else None
    usd = usd_per_hour * duration / 3600.0 if usd_per_hour is not None else None
    per_million = usd is not None and output_tokens > 0
    cost = {"usd_per_hour": usd_per_hour, "gpu_hours": gpus * duration / 3600.0, "usd": usd,
            "usd_per_million_output_tokens": usd / output_tokens * 1e6 if per_million else None,
            "usd_per_million_tokens": usd / (output_tokens + prompt_tokens) * 1e6 if per_million else None}
    kv = timeseries["kv_utilization"] if len(timeseries) else pd.Series(dtype=float)
    step_time_total = split.prefill_s + split.decode_s + split.communication_s + split.overhead_s
    return {
        "model": config.model, "hardware": config.hardware, "tp": config.tp, "pp": config.pp,
        "replicas": config.replicas, "quant": config.quant, "compute_dtype": config.compute_dtype, "kv_dtype": config.cache_dtype,
        "scheduler": config.scheduler, "router": config.router,
        "num_requests": int(len(requests)), "num_finished": int(len(finished)), "num_rejected": int(len(rejected)),
        "rejections": dict(Counter(rejected["reason"])) if len(rejected) else {},
        "duration_s": duration,
        "throughput": {"requests_per_s": len(finished) / duration, "output_tokens_per_s": output_tokens / duration,
                       "total_tokens_per_s": (output_tokens + prompt_tokens) / duration},
        "goodput": {"requests_per_s": float(within.sum()) / duration,
                    "output_tokens_per_s": float(finished.loc[within[within].index, "output_tokens"].sum()) / duration
                    if len(finished) else 0.0},
        "ttft_s": distribution(finished["ttft_s"]), "tpot_s": distribution(finished["tpot_s"]),
        "itl_s": {"mean": record.recorder.itl_mean(),
                  **{f"p{p}": record.recorder.itl_percentile(p) for p in (50, 90, 95, 99)}},
        "e2e_s": distribution(finished["e2e_s"]), "queue_s": distribution(finished["queue_s"]),
        "slo": slo,
        "kv_utilization": {"mean": float(kv.mean()) if len(kv) else 0.0, "max": float(kv.max()) if len(kv) else 0.0},
        "preemptions": int(finished["preemptions"].sum()),
        "prefix_cache_hit_rate": float(finished["cached_prompt_tokens"].sum() / prompt_tokens) if prompt_tokens else 0.0,
        "utilization": {"mfu": split.flops * config.tp / (gpus * peak * duration),
                        "mbu": split.bytes_moved * config.tp / (gpus * cost_model.bandwidth * duration),
                        "busy_fraction": busy / duration},
        "time_split_s": {"prefill": split.prefill_s, "decode": split.decode_s,
                         "communication": split.communication_s, "overhead": split.overhead_s,
                         "steps": split.steps, "step_time_total": step_time_total},
        "cost": cost,
        "memory": plan.to_dict(),
        "cost_model": {"source": "profile" if cost_model.profile is not None else "roofline x fitted efficiency",
                       "profile": config.profile},
        "speculation": _speculation_summary(config, record.speculation),
    }


def _speculation_summary(config: SimConfig, counts: list[dict]) -> dict | None:
    if not counts:
        return None
    verifications = sum(c["verifications"] for c in counts)
    proposed = sum(c["proposed"] for c in counts)
    accepted = sum(c["accepted_tokens"] for c in counts)
    return {"method": config.speculative, "num_speculative_tokens": config.num_speculative_tokens,
            "cumulative_acceptance": counts[0]["cumulative"], "verifications": verifications,
            "acceptance_rate": accepted / proposed if proposed else 0.0,
            "mean_accepted_per_verification": accepted / verifications if verifications else 0.0,
            "draft_time_s": sum(c["draft_s"] for c in counts)}
