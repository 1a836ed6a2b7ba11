"""The device the engine's tests run on: the CPU unless SERVECAST_TEST_DEVICE names another
(`SERVECAST_TEST_DEVICE=cuda pytest tests/engine` runs them on a GPU)."""

from __future__ import annotations

import os

from engine import EngineConfig

TEST_DEVICE = os.environ.get("SERVECAST_TEST_DEVICE", "cpu")
ON_CUDA = TEST_DEVICE.startswith("cuda")


def engine_config(**settings) -> EngineConfig:
    """EngineConfig on the test device (a test's own `device=` wins)."""
    return EngineConfig(**{"device": TEST_DEVICE, **settings})
