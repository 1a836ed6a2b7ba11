"""A serving deployment as the simulator sees it: the SimConfig fields of what a server ran (model,
hardware, parallelism, precision, scheduler limits, KV pool), recorded beside a replay's
measurements so that the replay can be simulated again (servecast calibrate --runs, validate --runs).

Where the fields come from: servecast's own server reports them (engine_deployment, in the
`deployment` of its GET /v1/models card); for any other server `servecast replay --deployment
key=value,...` states them (parse_deployment), and they override what a server reported. No torch.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from engine.policy.dtypes import canonical_dtype
from simulator.fleet.knobs import GROUPS
from simulator.fleet.sim_config import SimConfig, validation_items

# SimConfig fields a deployment may not set: the groups that describe no server, the run's own
# (slo, seed, ...) and what calibration fits (the engine profile).
NOT_DEPLOYMENT = frozenset(name for group in GROUPS if not group.deployment for name in group.model_fields)
DEPLOYMENT_FIELDS = tuple(name for name in SimConfig.model_fields if name not in NOT_DEPLOYMENT)
# Fields that may name a file (model: a config.json, where it is not a catalog id).
FILE_FIELDS = ("model", "profile", "hardware_file", "acceptance_file", "draft_model", "draft_profile")


def engine_deployment(model: str, config, num_blocks: int, max_model_len: int, hardware: str | None = None) -> dict:
    """The deployment of servecast's engine under an EngineConfig: model, the simulator's name of
    its model (a catalog id or a config.json path); num_blocks and max_model_len as the engine
    resolved them; hardware, the device's name in the simulator (default: the profiled local
    device, cpu-local or cuda-local, as `servecast profile` names it)."""
    weights = canonical_dtype(config.dtype)
    device = "cuda" if str(config.device).startswith("cuda") else "cpu"
    return {"model": model, "hardware": hardware or f"{device}-local", "tp": config.tensor_parallel_size,
            "cp": config.context_parallel_size,
            "quant": config.quantization or weights,
            # The engine's quantized layers compute in its dtype (fp32 on CPU), not bf16 as W8A16 GPUs do.
            "activation_dtype": weights if config.quantization else "auto",
            "kv_dtype": config.kv_cache_dtype or "auto", "block_size": config.block_size,
            "num_gpu_blocks": num_blocks, "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens, "max_model_len": max_model_len,
            "enable_prefix_caching": config.enable_prefix_caching,
            "enable_chunked_prefill": config.enable_chunked_prefill, "expert_parallel": config.expert_parallel}


def parse_deployment(text: str) -> dict:
    """'hardware=h100-sxm,tp=2,max_num_batched_tokens=8192' -> the fields, typed as SimConfig types
    them (checked as far as they can be alone); ValueError naming the bad item and the fix."""
    fields: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not value.strip():
            raise ValueError(f"--deployment item {item!r} is not key=value, e.g. hardware=h100-sxm,tp=2")
        if key not in DEPLOYMENT_FIELDS:
            raise ValueError(f"--deployment: unknown field {key!r}; use SimConfig's fields: "
                             f"{', '.join(DEPLOYMENT_FIELDS)}")
        fields[key] = value.strip()
    for key in FILE_FIELDS:  # recorded as absolute paths: read the same from any folder
        if key in fields and Path(fields[key]).exists():
            fields[key] = str(Path(fields[key]).resolve())
    probe = {"model": "llama-3.1-8b", "hardware": "h100-sxm", **fields}
    try:
        typed = SimConfig(**probe)
    except ValidationError as exc:
        raise ValueError(f"--deployment: {deployment_error(exc)}") from None
    return {key: getattr(typed, key) for key in fields}


def deployment_config(fields: dict, where: str, **extra) -> SimConfig:
    """The deployment's SimConfig (extra: fields the caller adds, e.g. a profile or a seed);
    ValueError naming `where`, the field and the fix."""
    unknown = sorted(set(fields) - set(DEPLOYMENT_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown deployment field(s) {', '.join(unknown)}")
    for needed in ("model", "hardware"):
        if not fields.get(needed) and needed not in extra:
            raise ValueError(f"{where}: the deployment does not say its {needed}: replay with --deployment "
                             f"{needed}=..., or add it to the 'deployment' of its summary.json")
    try:
        return SimConfig(**{**fields, **extra})
    except ValidationError as exc:
        raise ValueError(f"{where}: {deployment_error(exc)}") from None


def deployment_error(exc: ValidationError) -> str:
    """A SimConfig error as one line in the deployment's words (field=value)."""
    return "; ".join(f"{field}: {message}" if field else message for field, message in validation_items(exc))
