"""The servecast inference engine.

The policy modules (engine/policy/: config, sampling_params, sequence, block_manager, scheduler, ...)
import no torch; the torch-backed names below load on first use, so `import engine.policy.scheduler`
stays light.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from engine.policy.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.policy.sampling_params import SamplingParams

_LAZY = {
    "LLMEngine": "engine.engine",
    "RequestOutput": "engine.outputs",
}

__all__ = ["CacheConfig", "EngineConfig", "ModelConfig", "SchedulerConfig", "SamplingParams", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
