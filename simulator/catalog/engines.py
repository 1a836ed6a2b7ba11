"""Serving-engine profiles: what a production engine adds on top of kernel time, as versioned data
(catalog/engines/*.json; a user's own with --engine-file). No torch.

A profile names
- its CUDA-graph capture sizes: a step of at most the largest size runs as a graph replay, its
  token count padded up to the next size and no per-kernel launch cost (the curves' t0);
- its all-reduce algorithms: a custom kernel over NVLink for small messages (one-shot below a
  size that depends on the world size, two-shot above, NCCL past max_bytes) and NCCL otherwise;
- its host terms per step (simulator/cost/host.py FRAMEWORK_TERMS), its per-request latency
  outside the engine's steps (API server, tokenization, streaming) and how many steps late a
  sampled token reaches the client;
- its operator families' speed relative to the shipped curves (its fusions, its kernels in situ),
  and per device with runs, that device's own GEMM and attention speed;
- what it was fitted on, its cross-validated errors and residuals (for prediction intervals);
- its version's own behaviour: whether host work overlaps the GPU (async scheduling), its
  scheduler policy (engine/policy/policies.py), its default limits per GPU class
  (engine_defaults.py), the versions it stands for.

A profile may inherit another's ("inherits": its id) and replace some fields: what it takes
unchanged has no runs of its own behind it, so it names the profile it transfers from and its
intervals widen (simulator/fleet/extrapolation.py). A version without a file of its own
(--engine vllm-v0.18) takes the profile whose "versions" span it, transferred the same way.

`servecast` names this project's own engine: no additions (a profiled device's fit carries its
host terms). Catalog GPUs default to DEFAULT_GPU_ENGINE.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from simulator.catalog.engine_defaults import LimitRule

ENGINES_DIR = Path(__file__).with_name("engines")
# The operator families of the cost model (CostModel.modeled's), each with a memory and an arithmetic speed.
SCALED_FAMILIES = ("gemm", "moe", "attention_prefill", "attention_decode", "elementwise", "kv_write", "sample")
DEFAULT_GPU_ENGINE = "vllm-v0.15"
OWN_ENGINE = "servecast"
# The quantiles of the cross-validated residuals an interval spans (an 80 % interval).
INTERVAL = (0.1, 0.9)


def residual_metric(key: str) -> str:
    """The real-run metric whose residuals judge a figure or an SLO key ("ttft_p99", "e2e_mean",
    ...): its own, except that TPOT and ITL read the mean TPOT's (the runs have no TPOT percentiles)."""
    return "tpot" if key.startswith(("tpot", "itl")) else key


def residual_quantile(residuals, q):
    """The q quantile of a few residuals at the Weibull plotting position (rank q (n + 1)): the
    interval between two such quantiles covers a new exchangeable residual with probability
    q_hi - q_lo, where linear interpolation (rank q (n - 1) + 1) covers less at small n (about
    71 % for an 80 % interval of 16 residuals)."""
    return np.quantile(residuals, q, method="weibull")


@dataclass(frozen=True)
class Collective:
    """t = base_s + per_hop_s (w - 1) + bytes over each link / (link_efficiency x one direction's bandwidth)."""

    base_s: float
    link_efficiency: float
    per_hop_s: float = 0.0


@dataclass(frozen=True)
class CustomAllReduce:
    """An engine's own all-reduce over NVLink (vLLM's custom_all_reduce): used below max_bytes when
    every GPU pair has NVLink, or at world size 2; one-shot (each rank reads every peer's buffer)
    below one_shot_below[world] bytes, two-shot (reduce-scatter, all-gather) above."""

    max_bytes: int
    one_shot_below: dict[int, int]
    one_shot: Collective
    two_shot: Collective
    worlds: tuple[int, ...] = (2, 4, 6, 8)


@dataclass(frozen=True)
class EngineProfile:
    id: str
    description: str
    graph_sizes: tuple[int, ...] = ()
    nccl: Collective | None = None
    custom_all_reduce: CustomAllReduce | None = None
    framework: dict[str, float] = field(default_factory=dict)
    request_s: float = 0.0
    # A sampled token reaches the client this many step times after its step ends (vLLM V1's
    # asynchronous scheduling and output processing): on TTFT and E2E, not on TPOT.
    output_delay_steps: float = 0.0
    # Operator family -> speed relative to the shipped curves and cited collective figures under this
    # engine (its fusions, its kernels in situ), on every device: elementwise, all_reduce, moe.
    scales: dict[str, float] = field(default_factory=dict)
    # Device id -> operator family -> the device's own speed (gemm, attention_decode), fitted on that
    # device's runs; a device without runs keeps its curves, unless it is listed in transfers.
    device_scales: dict[str, dict[str, float]] = field(default_factory=dict)
    # Device id -> the fitted device whose speeds it takes: a GPU of the same kernels (Hopper's
    # H200 runs H100's), whose curves already carry its own peaks and bandwidth. Its answers stay
    # unvalidated (simulator/fleet/costs.py cost_basis).
    transfers: dict[str, str] = field(default_factory=dict)
    # Device id -> {"from": a fitted device, "bandwidth": b, "compute": c}: a GPU of other kernels
    # (ROCm's on an MI300X) that takes the fitted device's speeds times the ratio of the two devices'
    # published achieved fractions of peak, b on every memory side and c on every arithmetic side
    # (a memory-side "speed" divides the bandwidth the curve sees: sources.Modeled).
    scaled_devices: dict[str, dict] = field(default_factory=dict)
    # What its runs span ("fitted": devices, models, tp, moe) and how much each dimension a
    # configuration crosses beyond them widens its intervals ("widen"): simulator/fleet/extrapolation.py.
    extrapolation: dict = field(default_factory=dict)
    # Host work (scheduling, input preparation, output processing) that does not overlap the GPU's
    # step: framework terms added to every step (FRAMEWORK_TERMS' names) where the engine schedules
    # synchronously (vLLM before 0.14); the fitted terms of an asynchronous engine hold none of it.
    async_scheduling: bool = True
    host_not_overlapped: dict[str, float] = field(default_factory=dict)
    scheduler_policy: str = "vllm"  # engine/policy/policies.py's registry
    limits: tuple[LimitRule, ...] = ()  # its launcher's defaults per GPU class, first match
    versions: tuple[str, str] = ("", "")  # the releases it stands for, first and last ("" open)
    transferred_from: str = ""  # the profile whose fitted terms it takes without runs of its own
    fitted_on: str = ""
    errors: dict = field(default_factory=dict)
    residuals: dict[str, list[float]] = field(default_factory=dict)  # metric -> log(measured / predicted)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def adds_nothing(self) -> bool:
        return not (self.graph_sizes or self.nccl or self.custom_all_reduce or self.framework or self.request_s
                    or self.scales or self.device_scales or self.output_delay_steps or self.host_not_overlapped)

    def graph_sizes_for(self, max_num_seqs: int, max_num_batched_tokens: int,
                        graph_max: int | None = None) -> tuple[int, ...]:
        """The capture sizes a server of these limits captures: up to min(2 x max_num_seqs, the
        profile's largest), never past max_num_batched_tokens (vLLM's default rule); up to
        graph_max where the engine's rule for the GPU gives one (SGLang's cuda_graph_max_bs)."""
        if not self.graph_sizes:
            return ()
        top = min(2 * max_num_seqs if graph_max is None else graph_max, self.graph_sizes[-1], max_num_batched_tokens)
        return tuple(s for s in self.graph_sizes if s <= top)

    def covers(self, version: str) -> bool:
        """Whether a release ("0.18", "0.18.1") lies in the versions this profile stands for."""
        first, last = (_release(v) for v in self.versions)
        release = _release(version)
        return bool(release) and (not first or release >= first) and (not last or release[:len(last)] <= last)

    def speeds_on(self, device: str) -> dict[str, float]:
        """Operator family -> speed on this device: the engine's own, then the device's fitted ones
        or those it takes from the device it transfers from."""
        own = self.device_scales.get(device)
        scaled = self.scaled_devices.get(device)
        if scaled is not None:
            base = {**self.scales, **self.device_scales.get(scaled["from"], {})}
            # The fabric's speed, and the kernels' floors (no runs to scale them by), as the source device's.
            speeds = {k: v for k, v in base.items() if k in ("all_reduce", "gemm_floor")}
            for family in SCALED_FAMILIES:
                speeds[family] = base.get(family, 1.0) / scaled["bandwidth"]  # divides the bandwidth (sources.Modeled)
                speeds[f"{family}_compute"] = base.get(f"{family}_compute", 1.0) * scaled["compute"]
            # Speeds fitted on runs of its own (calibrate/fitting/device_speeds.py) replace the scaled ones.
            return {**speeds, **(own or {})}
        if own is None:
            own = self.device_scales.get(self.transfers.get(device, ""), {})
        return {**self.scales, **own}

    def interval(self, metric: str, value: float, widen: float = 1.0) -> tuple[float, float] | None:
        """The 80 % interval around a predicted value from the cross-validated residuals of that
        metric (None without residuals), its spread about the median residual times widen."""
        residuals = self.residuals.get(metric, [])
        if len(residuals) < 3 or not math.isfinite(value):
            return None
        lo, hi = (self._widened(residuals, q, widen) for q in INTERVAL)
        return value * math.exp(lo), value * math.exp(hi)

    @staticmethod
    def _widened(residuals, q: float, widen: float) -> float:
        quantile = float(residual_quantile(residuals, q))
        if widen == 1.0:
            return quantile
        middle = float(np.median(residuals))
        return middle + widen * (quantile - middle)

    def bias(self, metric: str) -> float:
        """The factor that takes a simulated value of this metric to what real serving measures,
        on the median held-out run: exp(median residual); 1 without residuals. A predicted figure
        is its simulated value times this, the centre of its interval's residuals: the SLO
        verdicts, replica counts and headroom read it (simulator/fleet/summary.py)."""
        residuals = self.residuals.get(metric, [])
        return math.exp(float(np.median(residuals))) if len(residuals) >= 3 else 1.0

    def top(self, metric: str, widen: float = 1.0) -> float:
        """The factor from a simulated value to its 80 % interval's top (interval's widen too); 1
        without residuals. The plan's slow end meets the SLOs at it."""
        residuals = self.residuals.get(metric, [])
        return math.exp(self._widened(residuals, INTERVAL[1], widen)) if len(residuals) >= 3 else 1.0

    def has_residuals(self) -> bool:
        return any(len(r) >= 3 for r in self.residuals.values())

    # -- reading and writing ------------------------------------------------------------------
    def to_dict(self) -> dict:
        def collective(c: Collective | None):
            return None if c is None else {"base_s": c.base_s, "per_hop_s": c.per_hop_s,
                                           "link_efficiency": c.link_efficiency}
        custom = self.custom_all_reduce
        return {"id": self.id, "description": self.description, "graph_sizes": list(self.graph_sizes),
                "nccl": collective(self.nccl),
                "custom_all_reduce": None if custom is None else {
                    "max_bytes": custom.max_bytes, "worlds": list(custom.worlds),
                    "one_shot_below": {str(k): v for k, v in custom.one_shot_below.items()},
                    "one_shot": collective(custom.one_shot), "two_shot": collective(custom.two_shot)},
                "framework": self.framework, "request_s": self.request_s,
                "output_delay_steps": self.output_delay_steps, "scales": self.scales,
                "device_scales": self.device_scales, "transfers": self.transfers,
                "scaled_devices": self.scaled_devices,
                "extrapolation": self.extrapolation, "async_scheduling": self.async_scheduling,
                "host_not_overlapped": self.host_not_overlapped, "scheduler_policy": self.scheduler_policy,
                "limits": [rule.to_dict() for rule in self.limits], "versions": list(self.versions),
                "transferred_from": self.transferred_from, "fitted_on": self.fitted_on,
                "errors": self.errors, "residuals": self.residuals, "sources": self.sources}

    @classmethod
    def from_dict(cls, raw: dict, where: str) -> "EngineProfile":
        try:
            def collective(c):
                return None if c is None else Collective(float(c["base_s"]), float(c["link_efficiency"]),
                                                         float(c.get("per_hop_s", 0.0)))
            custom = raw.get("custom_all_reduce")
            return cls(
                id=str(raw["id"]), description=str(raw.get("description", "")),
                graph_sizes=tuple(sorted(int(s) for s in raw.get("graph_sizes", []))),
                nccl=collective(raw.get("nccl")),
                custom_all_reduce=None if custom is None else CustomAllReduce(
                    int(custom["max_bytes"]), {int(k): int(v) for k, v in custom["one_shot_below"].items()},
                    collective(custom["one_shot"]), collective(custom["two_shot"]),
                    tuple(int(w) for w in custom.get("worlds", (2, 4, 6, 8)))),
                framework={k: float(v) for k, v in raw.get("framework", {}).items()},
                request_s=float(raw.get("request_s", 0.0)),
                output_delay_steps=float(raw.get("output_delay_steps", 0.0)),
                scales={k: float(v) for k, v in raw.get("scales", {}).items()},
                device_scales={d: {k: float(v) for k, v in f.items()} for d, f in raw.get("device_scales", {}).items()},
                transfers={str(d): str(s) for d, s in raw.get("transfers", {}).items()},
                scaled_devices={str(d): {"from": str(v["from"]), "bandwidth": float(v["bandwidth"]),
                                         "compute": float(v["compute"])}
                                for d, v in raw.get("scaled_devices", {}).items()},
                extrapolation=dict(raw.get("extrapolation", {})),
                async_scheduling=bool(raw.get("async_scheduling", True)),
                host_not_overlapped={k: float(v) for k, v in raw.get("host_not_overlapped", {}).items()},
                scheduler_policy=str(raw.get("scheduler_policy", "vllm")),
                limits=tuple(LimitRule.from_dict(r) for r in raw.get("limits", [])),
                versions=tuple(str(v) for v in raw.get("versions", ("", ""))),
                transferred_from=str(raw.get("transferred_from", "")),
                fitted_on=str(raw.get("fitted_on", "")),
                errors=dict(raw.get("errors", {})),
                residuals={k: [float(x) for x in v] for k, v in raw.get("residuals", {}).items()},
                sources=dict(raw.get("sources", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where} is not an engine profile ({exc!r}): see "
                             f"{ENGINES_DIR / (DEFAULT_GPU_ENGINE + '.json')} for the shape") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def _release(version: str) -> tuple[int, ...]:
    """'0.15.1' -> (0, 15, 1); () for anything else."""
    parts = version.strip().removeprefix("v").split(".")
    return tuple(int(p) for p in parts) if version.strip() and all(p.isdigit() for p in parts) else ()


_VERSIONED = re.compile(r"^([a-z]+)-v?(\d+(?:\.\d+){1,2})$")


def engine_ids() -> list[str]:
    return sorted([OWN_ENGINE, *(p.stem for p in ENGINES_DIR.glob("*.json"))])


@functools.lru_cache(maxsize=None)
def _catalog_raw(name: str) -> dict:
    """A catalog profile's fields, its parent's ("inherits") under its own: the sources and the
    extrapolation's parts merged, the rest replaced. What it takes unchanged transfers from the
    parent. Read once per process (the catalog does not change while it runs)."""
    file = ENGINES_DIR / f"{name}.json"
    raw = json.loads(file.read_text())
    parent = raw.pop("inherits", None)
    if parent is None:
        return raw
    if not (ENGINES_DIR / f"{parent}.json").is_file():
        raise ValueError(f"{file} inherits {parent!r}, which is not a catalog engine: use one of {', '.join(engine_ids())}")
    base = {k: v for k, v in _catalog_raw(parent).items() if k not in ("versions", "description")}
    merged = {**base, **raw, "sources": {**base.get("sources", {}), **raw.get("sources", {})}}
    extrapolation = {**base.get("extrapolation", {})}
    for part, value in raw.get("extrapolation", {}).items():
        extrapolation[part] = {**extrapolation.get(part, {}), **value} if isinstance(value, dict) else value
    merged["extrapolation"] = extrapolation
    merged["transferred_from"] = merged.get("transferred_from") or base.get("transferred_from") or parent
    return merged


def _versioned(name: str) -> EngineProfile | None:
    """An engine release without a file of its own ("vllm-v0.18"): the catalog profile of that
    engine whose versions span it, under the release's name, transferred from that profile."""
    match = _VERSIONED.match(name)
    if match is None:
        return None
    family, version = match.groups()
    for other in engine_ids():
        if other.startswith(family + "-") and other != name:
            profile = EngineProfile.from_dict(_catalog_raw(other), other)
            if profile.covers(version):
                own = _VERSIONED.match(other)
                same = own is not None and _release(own.group(2))[:2] == _release(version)[:2]  # 0.15.1 is v0.15
                return replace(profile, id=name,
                               transferred_from=profile.transferred_from or ("" if same else profile.id),
                               description=f"{name}: {profile.id}'s profile, which spans it"
                                           + ("" if same else " (no runs of its own)") + ". " + profile.description)
    return None


def load_engine(name: str | None = None, path: str | Path | None = None, profiled: bool = False) -> EngineProfile:
    """A profile file (servecast calibrate --runs writes one), else a catalog engine profile by id
    (or an engine release a catalog profile spans), else the default: servecast's own on a
    profiled device, DEFAULT_GPU_ENGINE on a catalog GPU."""
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"engine profile {path} does not exist: write one with `servecast calibrate --runs`")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"engine profile {path} is not valid JSON ({exc})") from None
        return EngineProfile.from_dict(raw, str(path))
    name = name or (OWN_ENGINE if profiled else DEFAULT_GPU_ENGINE)
    if name == OWN_ENGINE:
        return EngineProfile(OWN_ENGINE, "servecast's own engine: kernel time and the device profile's fitted terms")
    file = ENGINES_DIR / f"{name}.json"
    if file.is_file():
        return EngineProfile.from_dict(_catalog_raw(name), str(file))
    profile = _versioned(name)
    if profile is None:
        spans = "; ".join(f"{e} {'-'.join(v or '...' for v in load_engine(e).versions)}" for e in engine_ids()
                          if e != OWN_ENGINE)
        raise ValueError(f"unknown engine {name!r}: use one of {', '.join(engine_ids())}, a release they span "
                         f"({spans}), or --engine-file")
    return profile
