"""What a simulation run comes to: RunSummary, typed, whose to_dict() is the summary JSON of
DESIGN.md key for key (times in seconds with _s, rates _per_s). No torch.

A RunSummary also reads as that mapping (summary["ttft_s"]["p99"]), so code that only reads the
JSON's keys does not care which it holds; it cannot be changed after it is made."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields

import pandas as pd

from simulator.cost.memory import MemoryPlan
from simulator.cost.model import CostModel
from simulator.fleet.fleet import FleetRecord
from simulator.fleet.metrics import distribution, slo_attainment
from simulator.fleet.sim_config import SimConfig


class _Part:
    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Distribution(_Part):
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float


@dataclass(frozen=True)
class Throughput(_Part):
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float


@dataclass(frozen=True)
class Goodput(_Part):
    """What finished within every per-request SLO."""

    requests_per_s: float
    output_tokens_per_s: float


@dataclass(frozen=True)
class KvUtilization(_Part):
    mean: float
    max: float


@dataclass(frozen=True)
class Utilization(_Part):
    mfu: float
    mbu: float
    busy_fraction: float


@dataclass(frozen=True)
class TimeSplit(_Part):
    """Where the replicas' step time went, in seconds (steps: how many)."""

    prefill: float
    decode: float
    communication: float
    overhead: float
    steps: int
    step_time_total: float


@dataclass(frozen=True)
class Cost(_Part):
    usd_per_hour: float | None
    gpu_hours: float
    usd: float | None
    usd_per_million_output_tokens: float | None
    usd_per_million_tokens: float | None


@dataclass(frozen=True, eq=True)
class RunSummary(Mapping):
    model: str
    hardware: str
    tp: int
    pp: int
    cp: int
    replicas: int
    quant: str
    compute_dtype: str
    kv_dtype: str
    scheduler: str
    router: str
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
    queue_s: Distribution
    slo: dict  # targets, measured, met, all_met (fleet/metrics.py slo_attainment)
    kv_utilization: KvUtilization
    preemptions: int
    prefix_cache_hit_rate: float
    utilization: Utilization
    time_split_s: TimeSplit
    cost: Cost
    memory: dict  # MemoryPlan.to_dict()
    cost_model: dict  # where the step times came from
    # 80 % prediction intervals of latency figures ("ttft_s.mean": [low, high], seconds) from the
    # engine profile's cross-validated residuals on real runs; empty without them.
    intervals: dict[str, list[float]]
    speculation: dict | None
    # The host KV tier (kv_offload_gb): blocks offloaded and loaded, the share of prompt tokens it
    # served (within prefix_cache_hit_rate) and its load time; None without one.
    kv_offload: dict | None
    # A disaggregated fleet's pools and KV transfers (simulator/fleet/disaggregated.py pool_figures);
    # None for a co-located one.
    disaggregation: dict | None
    # Why the run ended before its last request (SloWatch: missing the SLOs was certain); None: it ran out.
    stopped_early: str | None = None
    _json: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_json", self.to_dict())

    def to_dict(self) -> dict:
        """The summary JSON: every field in order, parts as their dicts; stopped_early only when set."""
        out = {}
        for f in fields(self):
            if f.name == "_json" or (f.name == "stopped_early" and self.stopped_early is None):
                continue
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, _Part) else value
        return out

    # Read as the JSON mapping.
    def __getitem__(self, key: str):
        return self._json[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._json)

    def __len__(self) -> int:
        return len(self._json)


def summarize(config: SimConfig, accelerator, cost_model: CostModel, plan: MemoryPlan, record: FleetRecord,
              requests: pd.DataFrame, timeseries: pd.DataFrame, stopped_early: str | None = None,
              missed: Mapping[str, float] | None = None,
              disaggregation: Callable[[float], dict] | None = None) -> RunSummary:
    """The run's summary; stopped_early (with the SLO bounds it missed by) marks a run ended as soon
    as missing the SLOs was certain: its SLOs read as missed at those bounds. disaggregation: the
    pools' section of a disaggregated fleet, given the run's duration (accelerator, cost_model and
    plan are then its decode pool's)."""
    finished = requests[requests["status"] == "finished"]
    rejected = requests[requests["status"] == "rejected"]
    start = float(requests["arrival_s"].min())
    end = float(finished["finish_s"].max()) if len(finished) else start
    duration = max(end - start, 1e-12)
    output_tokens = int(finished["output_tokens"].sum())
    prompt_tokens = int(finished["prompt_tokens"].sum())
    slo = slo_attainment(requests, config.slo, record.recorder)
    within = slo.pop("within_slo_mask")
    if stopped_early:
        for key, bound in (missed or {}).items():
            slo["measured"][key], slo["met"][key] = bound, False
        slo["all_met"] = False
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
    recorder = record.recorder
    ttft, tpot, e2e = (Distribution(**distribution(finished[c])) for c in ("ttft_s", "tpot_s", "e2e_s"))
    return RunSummary(
        model=config.model, hardware=config.hardware, tp=config.tp, pp=config.pp, cp=config.cp,
        replicas=config.num_replicas,
        quant=config.quant, compute_dtype=config.compute_dtype, kv_dtype=config.cache_dtype,
        scheduler=config.scheduler, router=config.router,
        num_requests=int(len(requests)), num_finished=int(len(finished)), num_rejected=int(len(rejected)),
        rejections=dict(Counter(rejected["reason"])) if len(rejected) else {},
        duration_s=duration,
        throughput=Throughput(len(finished) / duration, output_tokens / duration,
                              (output_tokens + prompt_tokens) / duration),
        goodput=Goodput(float(within.sum()) / duration,
                        float(finished.loc[within[within].index, "output_tokens"].sum()) / duration
                        if len(finished) else 0.0),
        ttft_s=ttft, tpot_s=tpot,
        itl_s=Distribution(recorder.itl_mean(), *(recorder.itl_percentile(p) for p in (50, 90, 95, 99))),
        e2e_s=e2e, queue_s=Distribution(**distribution(finished["queue_s"])),
        slo=slo,
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
        memory=plan.to_dict(),
        cost_model={"source": "profile" if cost_model.profile is not None else "roofline x fitted efficiency",
                    "profile": config.profile, "engine": cost_model.engine.id if cost_model.engine else None},
        intervals=prediction_intervals(cost_model, {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e}),
        speculation=speculation_summary(config, record.speculation),
        kv_offload=offload_summary(config, plan, record.offload, prompt_tokens),
        disaggregation=disaggregation(duration) if disaggregation is not None else None,
        stopped_early=stopped_early or None)


# Summary figure -> the real-run metric whose residuals give its interval (calibrate/runs/tables.py METRICS).
INTERVAL_METRICS = {("ttft_s", "mean"): "ttft_mean", ("ttft_s", "p90"): "ttft_p90", ("ttft_s", "p99"): "ttft_p99",
                    ("tpot_s", "mean"): "tpot", ("e2e_s", "mean"): "e2e_mean", ("e2e_s", "p90"): "e2e_p90",
                    ("e2e_s", "p99"): "e2e_p99"}


def prediction_intervals(cost_model: CostModel, distributions: dict) -> dict[str, list[float]]:
    engine = cost_model.engine
    if engine is None or not engine.residuals:
        return {}
    out = {}
    for (name, stat), metric in INTERVAL_METRICS.items():
        interval = engine.interval(metric, getattr(distributions[name], stat))
        if interval is not None:
            out[f"{name}.{stat}"] = [interval[0], interval[1]]
    return out


def speculation_summary(config: SimConfig, counts: list[dict]) -> dict | None:
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


def offload_summary(config: SimConfig, plan: MemoryPlan, counts: dict | None, prompt_tokens: int) -> dict | None:
    if counts is None:
        return None
    per_block = config.kv_block_bytes(plan)[1]  # one replica's
    loaded_tokens = counts["loaded_blocks"] * plan.scheduled_block_size
    return {"capacity_gb": config.kv_offload_gb, "offloaded_blocks": int(counts["offloaded_blocks"]),
            "loaded_blocks": int(counts["loaded_blocks"]), "loaded_gb": counts["loaded_blocks"] * per_block / 1e9,
            "hit_rate": loaded_tokens / prompt_tokens if prompt_tokens else 0.0, "load_s": counts["load_s"]}

