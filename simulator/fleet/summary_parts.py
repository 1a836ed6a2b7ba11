"""The typed sections of a run summary (simulator/fleet/summary.py RunSummary; docs/summary.md):
small frozen dataclasses whose to_dict() is their part of the summary JSON, field for field in
order, and whose from_dict() reads that part of a summary.json back (a key it lacks reads as None).
No torch, no pandas.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass, field, fields


class Part:
    """A summary section: its fields in order are its JSON keys (sections within it nested)."""

    def to_dict(self) -> dict:
        return {f.name: _json(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict):
        hints = _hints(cls)
        return cls(**{f.name: _read(hints[f.name], data.get(f.name)) for f in fields(cls) if f.init})


def _json(value):
    if isinstance(value, Part):
        return value.to_dict()
    if isinstance(value, dict):
        return dict(value)
    return value


@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _read(hint, value):
    """A JSON value as the field's type: a section's dict as that section; anything else as is."""
    if value is None:
        return None
    candidates = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, Part) and isinstance(value, dict):
            return candidate.from_dict(value)
    return value


@dataclass(frozen=True)
class Distribution(Part):
    """Of a per-request (or per-gap) figure; every stat NaN where there were no values."""

    mean: float
    p50: float
    p90: float
    p95: float
    p99: float


@dataclass(frozen=True)
class Throughput(Part):
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float


@dataclass(frozen=True)
class Goodput(Part):
    """What finished within every per-request SLO."""

    requests_per_s: float
    output_tokens_per_s: float


@dataclass(frozen=True)
class Slo(Part):
    """The SLO targets (key "ttft_p99" etc. -> seconds), each one's measured value and whether it
    is met, whether all are, and the share of finished requests within every per-request limit."""

    targets: dict[str, float]
    measured: dict[str, float]  # predicted: simulated x the engine profile's bias (calibrated)
    met: dict[str, bool]
    all_met: bool
    requests_within_slo: float
    simulated: dict[str, float] = field(default_factory=dict)  # as simulated, before calibrated(); {}: the same

    def missed_at(self, bounds: dict[str, float]) -> "Slo":
        """These SLOs with the given ones read as missed at those bounds (a run stopped early)."""
        return Slo(self.targets, {**self.measured, **bounds}, {**self.met, **dict.fromkeys(bounds, False)}, False,
                   self.requests_within_slo, self.simulated)

    def calibrated(self, factors: dict[str, float]) -> "Slo":
        """Each measured value times its factor (EngineProfile.bias: simulated -> predicted), its
        verdict taken again against its target; the values as simulated kept in `simulated`."""
        measured = {k: v * factors.get(k, 1.0) for k, v in self.measured.items()}
        met = {k: bool(measured[k] <= self.targets[k]) for k in measured}
        return Slo(self.targets, measured, met, all(met.values()), self.requests_within_slo, dict(self.measured))


@dataclass(frozen=True)
class KvUtilization(Part):
    mean: float
    max: float


@dataclass(frozen=True)
class Utilization(Part):
    mfu: float
    mbu: float
    busy_fraction: float


@dataclass(frozen=True)
class TimeSplit(Part):
    """Where the replicas' step time went, in seconds (steps: how many)."""

    prefill: float
    decode: float
    communication: float
    overhead: float
    steps: int
    step_time_total: float


@dataclass(frozen=True)
class Cost(Part):
    usd_per_hour: float | None
    gpu_hours: float
    usd: float | None
    usd_per_million_output_tokens: float | None
    usd_per_million_tokens: float | None


@dataclass(frozen=True)
class Memory(Part):
    """One GPU's memory plan (simulator/cost/memory.py MemoryPlan.to_dict): GB, except as named."""

    memory_gb: float
    usable_gb: float
    weights_gb: float
    activations_gb: float
    reserve_gb: float
    kv_cache_gb: float
    kv_bytes_per_token: float
    num_blocks: int
    kv_tokens: int


@dataclass(frozen=True)
class CostModelInfo(Part):
    """Where the step times came from."""

    source: str  # "profile" or "roofline x fitted efficiency"
    profile: str | None
    engine: str | None  # the engine profile's id


@dataclass(frozen=True)
class Speculation(Part):
    method: str
    num_speculative_tokens: int
    cumulative_acceptance: list[float] | None
    verifications: int
    acceptance_rate: float
    mean_accepted_per_verification: float
    draft_time_s: float


@dataclass(frozen=True)
class KvOffload(Part):
    """The host KV tier: its size per replica, blocks offloaded and loaded, the share of prompt
    tokens it served (within prefix_cache_hit_rate) and its load time."""

    capacity_gb: float
    offloaded_blocks: int
    loaded_blocks: int
    loaded_gb: float
    hit_rate: float
    load_s: float


@dataclass(frozen=True)
class Pool(Part):
    """One pool of a disaggregated fleet."""

    replicas: int
    hardware: str
    tp: int
    cp: int
    quant: str
    gpus: int
    kv_blocks_per_replica: int
    busy_fraction: float


@dataclass(frozen=True)
class Transfer(Part):
    """The KV transfers from the prefill pool to the decode pool (times None without any)."""

    link_gbps: float
    latency_s: float
    count: int
    mean_s: float | None
    p99_s: float | None
    wait_mean_s: float | None
    wait_p99_s: float | None


@dataclass(frozen=True)
class Disaggregation(Part):
    prefill: Pool
    decode: Pool
    transfer: Transfer
