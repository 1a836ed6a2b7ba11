"""SimConfig's knobs, grouped by idea and each declared once: its type, default, description and
check. No torch.

A group is a pydantic model of a few fields; SimConfig (simulator/fleet/sim_config.py) inherits
every group, so it stays one flat model (`SimConfig(tp=4)`, `config.tp`), while the command line
(app/knob_options.py) and the dashboard make their options from the same declarations: the
option is the field's name in kebab case (or its `flag`), its help the description (a Literal's
choices added), its default the field's. How to add a knob: a `knob(...)` field on its group.

What `knob()` records beside pydantic's Field:
  flag      the option's name where it is not the field's in kebab case (--chunked-prefill)
  path      the value names a file: the command line takes it as a path (handed on as a string)
  replayed  False where `servecast simulate --replay` leaves the knob to the command line: the
            replay records it not (the SLOs, the engine profile), or it may be set anew (the device)
A group whose fields describe no deployment (the workload's, what calibration fits) says
`deployment = False`: a replay's recorded deployment (calibrate/deployment.py) holds none of them.
"""

from __future__ import annotations

import math
import re
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticUndefined

from simulator.fleet.router import ROUTERS

WeightPrecision = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4", "w8a8", "mxfp4", "nvfp4"]
KVDtype = Literal["auto", "fp32", "bf16", "fp16", "fp8", "int8"]
ActivationDtype = Literal["auto", "fp32", "bf16", "fp16", "fp8"]
Router = Literal[ROUTERS]  # the names in simulator/fleet/router.py's registry
SchedulerKind = Literal["continuous", "static"]

_SLO_KEY = re.compile(r"^(ttft|tpot|itl|e2e)_(p50|p90|p95|p99|mean)$")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(ms|s|us)?\s*$")


def parse_duration(text: str) -> float:
    """'2s', '100ms', '250us', '0.5' (seconds) -> seconds."""
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a duration: write e.g. 2s, 100ms or 0.5")
    value = float(match.group(1))
    return value * {"ms": 1e-3, "us": 1e-6}.get(match.group(2) or "s", 1.0)


def parse_slos(text: str) -> dict[str, float]:
    """'ttft_p99=2s,tpot_p99=100ms' -> {'ttft_p99': 2.0, 'tpot_p99': 0.1}."""
    slos = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"SLO {item!r} is not metric=limit, e.g. ttft_p99=2s")
        slos[key.strip()] = parse_duration(value)
    return slos


def check_slos(value: dict[str, float]) -> dict[str, float]:
    """The SLOs if every key is a known metric and every limit a positive time; ValueError naming the bad one."""
    for key, limit in value.items():
        if not _SLO_KEY.match(key):
            raise ValueError(f"unknown SLO {key!r}: use (ttft|tpot|itl|e2e)_(p50|p90|p95|p99|mean), e.g. ttft_p99")
        if not (limit > 0 and math.isfinite(limit)):
            raise ValueError(f"SLO {key} must be a positive time in seconds, got {limit}")
    return value


def knob(default=PydanticUndefined, description: str = "", *, flag: str | None = None, path: bool = False,
         replayed: bool = True, **checks):
    """A field of a group: pydantic's Field (default, description, checks such as ge / le) and
    how the command line shows it (the module's docstring)."""
    cli = {"flag": flag, "path": path or None, "replayed": None if replayed else False}
    extra = {k: v for k, v in cli.items() if v is not None}
    return Field(default, description=description, json_schema_extra=extra or None, **checks)


def knob_extra(info) -> dict:
    """What knob() recorded of a field (flag, path, replayed), from its FieldInfo."""
    return dict(info.json_schema_extra or {})


class Group(BaseModel):
    # defer_build: a group's validator is made when first used, not on import (the CLI's start).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    deployment: ClassVar[bool] = True  # its fields describe the server (see the module's docstring)


class Served(Group):
    """What is served, on what."""

    model: str = knob(description="catalog model id (llama-3.1-8b, ...) or an HF config.json path")
    hardware: str = knob(description="catalog hardware id (a100-80gb, h100-sxm, ...) or cpu-local with --profile",
                         replayed=False)
    hardware_file: str | None = knob(None, "YAML with extra accelerators", path=True, replayed=False)
    profile: str | None = knob(None, "a servecast profile of the hardware (for *-local devices)", path=True,
                               replayed=False)


class Parallelism(Group):
    """How one replica spreads the model over its GPUs."""

    tp: int = knob(1, "tensor-parallel GPUs per pipeline stage", ge=1, le=64)
    pp: int = knob(1, "pipeline-parallel stages per replica", ge=1, le=64)
    # Context parallelism (simulator/cost/context_parallel.py): the weights on every rank.
    cp: int = knob(1, "context-parallel ranks per replica, each a TP group: a replica uses tp x pp x cp GPUs, each "
                      "sequence's KV split over the ranks (cp x the KV tokens), prefills by ring attention",
                   ge=1, le=64)
    # Mixture-of-experts models (simulator/cost/moe.py).
    expert_parallel: bool = knob(False, "MoE models: whole experts per TP rank with all-to-all, instead of a slice "
                                        "of every expert")
    routing_skew: float = knob(0.0, "MoE router imbalance: 0 uniform, s > 0 Zipf shares 1/(e+1)^s (a few hot "
                                    "experts)", ge=0.0, le=4.0)


class Fleet(Group):
    """The replicas and how requests reach them."""

    replicas: int = knob(1, "replicas behind the router", ge=1, le=4096)
    router: Router = knob("round_robin", "which replica gets each request")


class Precision(Group):
    """What the weights are stored in and what GEMMs compute in."""

    quant: WeightPrecision = knob("bf16", "weight precision")
    activation_dtype: ActivationDtype = knob("auto", "what GEMMs compute in (auto: bf16 under int8/int4 weights, "
                                                     "fp8 with fp8 ones, else the weights'; fp32: servecast's CPU "
                                                     "engine, whose quantized layers take fp32 activations)")


class KVCache(Group):
    """The paged KV cache: its blocks, their precision, how many, and prefix reuse."""

    block_size: int = knob(16, "tokens per KV-cache block", ge=1, le=1024)
    kv_dtype: KVDtype = knob("auto", "KV-cache precision (auto: bf16, fp32 where GEMMs compute in fp32)")
    # None: the serving engine's default (simulator/catalog/engine_defaults.py), resolved by SimConfig.
    gpu_memory_utilization: float | None = knob(None, "share of each GPU's memory for weights, activations and the "
                                                     "KV cache (default: the engine's, vLLM's 0.9)", gt=0.0, le=1.0)
    num_gpu_blocks: int | None = knob(None, "KV blocks per replica instead of planning memory", ge=1)
    enable_prefix_caching: bool = knob(True, "reuse the KV blocks of prompt prefixes already cached",
                                       flag="prefix-caching")


class SchedulerLimits(Group):
    """What one step may hold, and how requests are batched."""

    # None: the serving engine's default for the GPU (simulator/catalog/engine_defaults.py), resolved
    # by SimConfig, so a configuration always holds numbers.
    max_num_seqs: int | None = knob(None, "requests running at once per replica, at most (default: the engine's for "
                                          "the GPU: vLLM 1024 on 70+ GiB GPUs, 256 on A100 and smaller; 256 on "
                                          "profiled devices)", ge=1)
    max_num_batched_tokens: int | None = knob(None, "tokens per step, at most (the token budget; default: the "
                                                    "engine's for the GPU: vLLM 8192 on 70+ GiB GPUs, 2048 on A100 "
                                                    "and smaller; 8192 on profiled devices)", ge=1)
    max_model_len: int | None = knob(None, "prompt + output tokens per request, at most (default: the model's "
                                           "context, capped at what the KV cache holds)", ge=2)
    enable_chunked_prefill: bool = knob(True, "split long prompts over steps to fit the token budget",
                                        flag="chunked-prefill")
    scheduler: SchedulerKind = knob("continuous", "how requests are batched (continuous: at every step)")


class RunSettings(Group):
    """The run's own settings: the targets it is judged on, its randomness, its sampling."""

    deployment: ClassVar[bool] = False
    slo: dict[str, float] = knob(description="the SLOs the run is judged on, e.g. ttft_p99=2s,tpot_p99=100ms (a dict "
                                             "{'ttft_p99': 2.0, ...} in Python)", default_factory=dict,
                                 replayed=False)
    seed: int = knob(0, "seed of the trace's random draws and the simulation's")
    timeseries_interval_s: float | None = knob(None, "seconds between time-series samples (default: 400 samples "
                                                     "over the run)", gt=0, replayed=False)

    @field_validator("slo", mode="before")
    @classmethod
    def _parse_slo(cls, value):
        return parse_slos(value) if isinstance(value, str) else value

    @field_validator("slo")
    @classmethod
    def _check_slo(cls, value: dict[str, float]) -> dict[str, float]:
        return check_slos(value)


class Speculation(Group):
    """Speculative decoding (simulator/fleet/speculation.py): the proposer, draft tokens per
    verification, and acceptance: a per-token rate or the engine's measured per-position profile."""

    speculative: Literal["ngram", "draft"] | None = knob(None, "speculative decoding's proposer")
    num_speculative_tokens: int = knob(0, "draft tokens per verification (1..8)", ge=0, le=8)
    acceptance: float | None = knob(None, "probability a draft is accepted given the ones before were",
                                    ge=0.0, le=1.0)
    acceptance_file: str | None = knob(None, "measured acceptance per position, instead: the acceptance.json of "
                                             "servecast train-pair or acceptance", path=True)
    acceptance_preset: str | None = knob(None, "published acceptance measured in a serving engine, instead: a "
                                               "preset id of simulator/catalog/acceptance.json")
    draft_model: str | None = knob(None, "the draft's catalog id or config.json (--speculative draft)")
    draft_profile: str | None = knob(None, "a profile of the draft on this hardware (default: the target's cost "
                                           "model, draft shapes)", path=True)


class EngineChoice(Group):
    """The serving engine whose additions the step times carry (simulator/catalog/engines.py)."""

    deployment: ClassVar[bool] = False  # what calibration fits
    engine: str | None = knob(None, "serving engine whose overheads, scheduling and default limits the step times "
                                    "carry: vllm-v0.15 (fitted on real runs; the default on catalog GPUs), "
                                    "vllm-v0.12 (synchronous scheduling), vllm-v0.34, sglang-0.5 (prefill-first), "
                                    "a release they span (vllm-v0.18, sglang-0.5.6), or servecast (this project's "
                                    "engine; the default on profiled devices)", replayed=False)
    engine_file: str | None = knob(None, "an engine profile fitted on your own runs (servecast calibrate --runs)",
                                   path=True, replayed=False)


class HostTier(Group):
    """A host-memory tier for the prefix cache (simulator/fleet/tiered_pool.py)."""

    kv_offload_gb: float = knob(0.0, "GB of host memory per replica for a CPU tier of the prefix cache: evicted "
                                     "blocks move there and load back over the host link on a hit", ge=0.0, le=1e6)


class Disaggregation(Group):
    """Prefill/decode disaggregation (simulator/fleet/disaggregated.py): a pool of P prefill replicas
    and one of D decode replicas; the prefill pool's own accelerator, TP and weights where given
    (else the decode pool's, the fields of the other groups); the link each prompt's KV crosses."""

    disaggregate: str | None = knob(None, "P:D, e.g. 2:6: a pool of P prefill replicas and one of D decode replicas "
                                          "(instead of --replicas); each prompt's KV is sent from its prefill replica "
                                          "to a decode replica")
    prefill_hardware: str | None = knob(None, "--disaggregate: the prefill pool's accelerator (default: --hardware)")
    prefill_tp: int | None = knob(None, "--disaggregate: the prefill pool's TP (default: --tp)", ge=1, le=64)
    prefill_quant: WeightPrecision | None = knob(None, "--disaggregate: the prefill pool's weights (default: "
                                                       "--quant)")
    prefill_cp: int | None = knob(None, "--disaggregate: the prefill pool's CP (default: --cp)", ge=1, le=64)
    # Default: 400 Gb/s, a DGX H100's InfiniBand port per GPU; the latency is an assumption.
    kv_transfer_gbps: float = knob(50.0, "--disaggregate: GB/s per GPU, one way, of the link a prompt's KV crosses "
                                         "(default: 400 Gb/s InfiniBand per GPU)", gt=0.0)
    kv_transfer_latency_s: float = knob(1e-3, "--disaggregate: seconds each KV transfer takes beyond its bytes",
                                        ge=0.0)


# SimConfig's groups, in the order of its fields.
GROUPS = (Served, Parallelism, Fleet, Precision, KVCache, SchedulerLimits, RunSettings, Speculation, EngineChoice,
          HostTier, Disaggregation)
