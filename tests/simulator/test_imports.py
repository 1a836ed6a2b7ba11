"""The policy code and the simulator import no torch (DESIGN.md contract): every module of
engine/policy/, the engine package itself, the simulator and calibrate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POLICY = sorted(f"engine.policy.{p.stem}" for p in (ROOT / "engine" / "policy").glob("*.py") if p.stem != "__init__")


def test_the_policy_room_is_found() -> None:
    assert {"engine.policy.scheduler", "engine.policy.block_manager", "engine.policy.sequence",
            "engine.policy.config"} <= set(POLICY)


@pytest.mark.parametrize("module", ["simulator", "calibrate", "engine", "engine.policy", *POLICY])
def test_module_does_not_import_torch(module: str) -> None:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
