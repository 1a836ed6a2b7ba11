"""What a simulation run comes to: RunSummary, typed (its sections in summary_parts.py), whose
to_dict() is the summary JSON key for key (docs/summary.md; times in seconds with _s, rates _per_s).
A measured replay's summary is one too (calibrate/runs/replay_summary.py), with what a client cannot
observe None. It cannot be changed after it is made. No torch."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd

from simulator.catalog.engines import residual_metric
from simulator.cost.memory import MemoryPlan
from simulator.cost.model import CostModel
from simulator.fleet.extrapolation import Extrapolation, extrapolation
from simulator.fleet.fleet import FleetRecord
from simulator.fleet.metrics import served
from simulator.fleet.sim_config import SimConfig
from simulator.fleet.summary_parts import (Cost, CostModelInfo, Disaggregation, Distribution, Goodput, KvOffload,
                                           KvUtilization, Memory, Part, Slo, Speculation, Throughput, TimeSplit,
                                           Utilization)

__all__ = ["Cost", "CostModelInfo", "Disaggregation", "Distribution", "Goodput", "KvOffload", "KvUtilization",
           "Memory", "RunSummary", "Slo", "Speculation", "Throughput", "TimeSplit", "Utilization", "summarize"]


@dataclass(frozen=True)
class RunSummary(Part):
    """A run's summary; docs/summary.md says what each field means. The fields typed "| None" that
    a simulation always sets are None in a measured replay (calibrate/runs/replay_summary.py UNOBSERVED)."""

    model: str
    hardware: str | None
    tp: int | None
    pp: int | None
    cp: int | None
    replicas: int | None
    quant: str | None
    compute_dtype: str | None
    kv_dtype: str | None
    scheduler: str | None
    router: str | None
    num_requests: int
    num_finished: int
    num_rejected: int
    rejections: dict[str, int]
    duration_s: float
    throughput: Throughput
    goodput: Goodput
    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    queue_s: Distribution | None
    slo: Slo
    kv_utilization: KvUtilization | None
    preemptions: int | None
    prefix_cache_hit_rate: float | None
    utilization: Utilization | None
    time_split_s: TimeSplit | None
    cost: Cost | None
    memory: Memory | None
    cost_model: CostModelInfo | None
    # 80 % prediction intervals of latency figures ("ttft_s.mean": [low, high], seconds) from the
    # engine profile's cross-validated residuals on real runs; empty without them.
    intervals: dict[str, list[float]]
    # The same figures predicted: simulated x the residuals' median (EngineProfile.bias), inside
    # their intervals; the distributions above are as simulated. Empty without residuals.
    predicted: dict[str, float]
    # Where the configuration lies beyond the engine profile's fitted runs (simulator/fleet/extrapolation.py),
    # in words: each widens the intervals. Empty inside them or without an engine profile.
    extrapolated_across: list[str]
    speculation: Speculation | None  # None without speculative decoding
    # The host KV tier (kv_offload_gb); None without one.
    kv_offload: KvOffload | None
    # A disaggregated fleet's pools and KV transfers; None for a co-located one.
    disaggregation: Disaggregation | None
    # Why the run ended before its last request (SloWatch: missing the SLOs was certain); None: it ran out.
    stopped_early: str | None = None

    def to_dict(self) -> dict:
        """The summary JSON: every field in order, sections as their dicts; stopped_early only when set."""
        out = super().to_dict()
        if self.stopped_early is None:
            del out["stopped_early"]
        return out


def summarize(config: SimConfig, accelerator, cost_model: CostModel, plan: MemoryPlan, record: FleetRecord,
              requests: pd.DataFrame, timeseries: pd.DataFrame, stopped_early: str | None = None,
              missed: Mapping[str, float] | None = None,
              disaggregation: Callable[[float], Disaggregation] | None = None) -> RunSummary:
    """The run's summary; stopped_early (with the SLO bounds it missed by) marks a run ended as soon
    as missing the SLOs was certain: its SLOs read as missed at those bounds. disaggregation: the
    pools' section of a disaggregated fleet, given the run's duration (accelerator, cost_model and
    plan are then its decode pool's)."""
    figures = served(requests, config.slo, record.recorder)
    finished, duration = figures.finished, figures.duration_s
    output_tokens, prompt_tokens = figures.output_tokens, figures.prompt_tokens
    slo = figures.slo.missed_at(dict(missed or {})) if stopped_early else figures.slo
    slo = slo.calibrated(slo_factors(cost_model, config.slo))  # verdicts on the predicted values
    gpus = config.num_gpus
    split = record.split
    # Each of a replica's pp virtual engines is busy for its micro-batches' whole pipeline trips.
    busy = record.busy_s / config.num_engines
    peak = cost_model.peak_flops(config.compute_dtype)
    usd_per_hour = config.usd_per_hour()  # every pool's accelerators, priced each
    usd = usd_per_hour * duration / 3600.0 if usd_per_hour is not None else None
    per_million = usd is not None and output_tokens > 0
    kv = timeseries["kv_utilization"] if len(timeseries) else pd.Series(dtype=float)
    step_time_total = split.prefill_s + split.decode_s + split.communication_s + split.overhead_s
    return RunSummary(
        model=config.model, hardware=config.hardware, tp=config.tp, pp=config.pp, cp=config.cp,
        replicas=config.num_replicas,
        quant=config.quant, compute_dtype=config.compute_dtype, kv_dtype=config.cache_dtype,
        scheduler=config.scheduler, router=config.router,
        **{**figures.summary_fields(), "slo": slo},
        kv_utilization=KvUtilization(float(kv.mean()) if len(kv) else 0.0, float(kv.max()) if len(kv) else 0.0),
        preemptions=int(finished["preemptions"].sum()),
        prefix_cache_hit_rate=float(finished["cached_prompt_tokens"].sum() / prompt_tokens) if prompt_tokens else 0.0,
        utilization=Utilization(split.flops * config.tp / (gpus * peak * duration),
                                split.bytes_moved * config.tp / (gpus * cost_model.bandwidth * duration),
                                busy / duration),
        time_split_s=TimeSplit(split.prefill_s, split.decode_s, split.communication_s, split.overhead_s, split.steps,
                               step_time_total),
        cost=Cost(usd_per_hour, gpus * duration / 3600.0, usd,
                  usd / output_tokens * 1e6 if per_million else None,
                  usd / (output_tokens + prompt_tokens) * 1e6 if per_million else None),
        memory=Memory(**plan.to_dict()),
        cost_model=CostModelInfo("profile" if cost_model.profile is not None else "roofline x fitted efficiency",
                                 config.profile, cost_model.engine.id if cost_model.engine else None),
        **prediction_fields(cost_model, figures, extrapolation(
            cost_model.engine, config.model, config.hardware, config.tp, config.model_spec().is_moe)),
        speculation=speculation_summary(config, record.speculation),
        kv_offload=offload_summary(config, plan, record.offload, prompt_tokens),
        disaggregation=disaggregation(duration) if disaggregation is not None else None,
        stopped_early=stopped_early or None)


# Summary figure -> the real-run metric whose residuals give its interval (calibrate/runs/tables.py METRICS).
INTERVAL_METRICS = {("ttft_s", "mean"): "ttft_mean", ("ttft_s", "p90"): "ttft_p90", ("ttft_s", "p99"): "ttft_p99",
                    ("tpot_s", "mean"): "tpot", ("e2e_s", "mean"): "e2e_mean", ("e2e_s", "p90"): "e2e_p90",
                    ("e2e_s", "p99"): "e2e_p99"}


def prediction_fields(cost_model: CostModel, figures, extrapolated: Extrapolation = Extrapolation()) -> dict:
    """The summary's `intervals`, `predicted` and `extrapolated_across` (figures: anything with the
    summary's distributions as attributes: ttft_s, tpot_s, e2e_s): each figure with residuals, its
    80 % interval (widened for what the configuration crosses beyond the fitted runs) and its
    prediction (simulated x EngineProfile.bias, inside the interval)."""
    engine = cost_model.engine
    intervals, predicted = {}, {}
    for (name, stat), metric in INTERVAL_METRICS.items() if engine is not None else ():
        value = getattr(getattr(figures, name), stat)
        interval = engine.interval(metric, value, extrapolated.factor(metric))
        if interval is not None:
            intervals[f"{name}.{stat}"] = [interval[0], interval[1]]
            predicted[f"{name}.{stat}"] = value * engine.bias(metric)
    return {"intervals": intervals, "predicted": predicted,
            "extrapolated_across": list(extrapolated.across) if intervals else []}


def slo_factors(cost_model: CostModel | None, slos: Mapping[str, float]) -> dict[str, float]:
    """SLO key -> the factor from its simulated value to its predicted one (EngineProfile.bias of
    its residual metric); {} without an engine profile's residuals."""
    engine = cost_model.engine if cost_model is not None else None
    if engine is None or not engine.has_residuals():
        return {}
    return {k: engine.bias(residual_metric(k)) for k in slos}


def speculation_summary(config: SimConfig, counts: list[dict]) -> Speculation | None:
    if not counts:
        return None
    verifications = sum(c["verifications"] for c in counts)
    proposed = sum(c["proposed"] for c in counts)
    accepted = sum(c["accepted_tokens"] for c in counts)
    return Speculation(method=config.speculative, num_speculative_tokens=config.num_speculative_tokens,
                       cumulative_acceptance=counts[0]["cumulative"], verifications=verifications,
                       acceptance_rate=accepted / proposed if proposed else 0.0,
                       mean_accepted_per_verification=accepted / verifications if verifications else 0.0,
                       draft_time_s=sum(c["draft_s"] for c in counts))


def offload_summary(config: SimConfig, plan: MemoryPlan, counts: dict | None, prompt_tokens: int) -> KvOffload | None:
    if counts is None:
        return None
    per_block = config.kv_block_bytes(plan)[1]  # one replica's
    loaded_tokens = counts["loaded_blocks"] * plan.scheduled_block_size
    return KvOffload(capacity_gb=config.kv_offload_gb, offloaded_blocks=int(counts["offloaded_blocks"]),
                     loaded_blocks=int(counts["loaded_blocks"]), loaded_gb=counts["loaded_blocks"] * per_block / 1e9,
                     hit_rate=loaded_tokens / prompt_tokens if prompt_tokens else 0.0, load_s=counts["load_s"])

