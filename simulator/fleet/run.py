"""simulate(SimConfig, workload) -> SimResult: a fleet of replicas behind a router. No torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from simulator.cost.memory import MemoryPlan
from simulator.cost.model import CostModel
from simulator.cost.step_timer import StepTimer
from simulator.fleet.costs import cost_model_for
from simulator.fleet import replica_groups
from simulator.fleet.disaggregated import pool_figures, simulate_disaggregated
from simulator.fleet.fleet import FleetRecord, FleetSetup, cyclic_gc_paused, simulate_replicas
from simulator.fleet.sim_config import SimConfig
from simulator.fleet.slo_watch import SloWatch
from simulator.fleet.summary import RunSummary, slo_factors, summarize
from simulator.workload.requests import Workload

# Time-series samples per replica over the workload's span, when no interval is set.
DEFAULT_SAMPLES = 400
# The interval under closed-loop clients, whose span is known only once simulated.
CLOSED_LOOP_SAMPLE_S = 0.5


def sample_interval_s(config: SimConfig, workload: Workload) -> float:
    if config.timeseries_interval_s:
        return config.timeseries_interval_s
    if workload.clients is not None:
        return CLOSED_LOOP_SAMPLE_S
    return max(workload.duration_s, 1e-3) / DEFAULT_SAMPLES


@dataclass
class SimResult:
    config: SimConfig
    summary: RunSummary
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
    if config.disaggregate is not None:
        if timer is not None:
            raise ValueError("a fixed step timer times one pool: not a disaggregated fleet's two")
        return simulate_pools(config, workload, cost_model, progress, bulk_decodes, exact_block_keys)
    model, accelerator, plan = config.check()
    cost_model = cost_model_for(config, cost_model)  # one handed in with its engine keeps it
    fleet = FleetSetup(config, model, plan, cost_model, draft_cost_model, bulk_decodes, exact_block_keys,
                       sample_interval_s(config, workload))

    stopped_early, watch = None, None
    # The collector stays paused until the replicas have let go of their block pools: re-enabled
    # while they are alive, its first collection would walk every block entry of the run.
    with cyclic_gc_paused():
        on_done = (lambda done: progress(done, len(workload))) if progress is not None else None
        if stop_when_slo_missed:
            # Watched in simulated values: each limit over its factor to the predicted value.
            factors = slo_factors(cost_model, config.slo)
            watch = SloWatch({k: v / factors.get(k, 1.0) for k, v in config.slo.items()}, len(workload),
                             sum(r.output_tokens >= 2 for r in workload))
        # Closed-loop clients tie every replica to the others (a finish anywhere sends the next request).
        if replica_groups.applies(config) and timer is None and workload.clients is None:
            if watch is not None:  # one watch hears of every request: one process
                records = replica_groups.simulate_each(fleet, workload, list(range(config.replicas)), on_done, watch)
            else:
                records = replica_groups.simulate_groups(fleet, workload, workers, progress)
        else:
            records = [simulate_replicas(fleet, workload.requests, list(range(config.replicas)), timer, on_done,
                                         watch, workload.clients)]
        stopped_early = watch.decided if watch is not None else None
        if progress is not None:
            progress(len(workload), len(workload))
        record = FleetRecord.merged(records)
        requests = record.recorder.requests_frame()
        timeseries = record.recorder.timeseries_frame()
        summary = summarize(config, accelerator, cost_model, plan, record, requests, timeseries, stopped_early,
                            watch.missed if watch is not None else None)
    return SimResult(config, summary, requests, timeseries, plan)


def simulate_pools(config: SimConfig, workload: Workload, cost_model: CostModel | None = None,
                   progress: Callable[[int, int], None] | None = None, bulk_decodes: bool = True,
                   exact_block_keys: bool = True) -> SimResult:
    """simulate() of a disaggregated fleet (simulator/fleet/disaggregated.py); cost_model: the
    decode pool's (the prefill pool shares it on the same accelerator). The summary's figures are
    the fleet's; its accelerator, memory and utilization the decode pool's; "disaggregation" has
    each pool's."""
    sample_every_s = sample_interval_s(config, workload)
    prefill_config, decode_config = config.pool_configs()

    def setup(pool: SimConfig, costs: CostModel | None) -> FleetSetup:
        model, _, plan = pool.check()
        costs = cost_model_for(pool, costs)
        return FleetSetup(pool, model, plan, costs, None, bulk_decodes, exact_block_keys, sample_every_s)

    decode = setup(decode_config, cost_model)
    prefill = setup(prefill_config, decode.cost_model if prefill_config.hardware == decode_config.hardware else None)
    with cyclic_gc_paused():
        on_done = (lambda done: progress(done, len(workload))) if progress is not None else None
        record, figures = simulate_disaggregated(prefill, decode, workload.requests, on_done, workload.clients)
        if progress is not None:
            progress(len(workload), len(workload))
        requests = record.recorder.requests_frame()
        timeseries = record.recorder.timeseries_frame()
        summary = summarize(config, decode.cost_model.accelerator, decode.cost_model, decode.plan, record, requests,
                            timeseries, disaggregation=lambda seconds: pool_figures(prefill, decode, figures, seconds))
    return SimResult(config, summary, requests, timeseries, decode.plan)

