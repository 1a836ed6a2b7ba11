"""simulate(SimConfig, workload) -> SimResult: a fleet of replicas behind a router. No torch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from simulator.cost.memory import MemoryPlan
from simulator.cost.model import CostModel
from simulator.cost.step_timer import StepTimer
from simulator.fleet import replica_groups
from simulator.fleet.fleet import FleetRecord, FleetSetup, cyclic_gc_paused, simulate_replicas
from simulator.fleet.metrics import distribution, slo_attainment
from simulator.fleet.sim_config import SimConfig
from simulator.fleet.slo_watch import SloWatch
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
