"""The policy code and the simulator import no torch (DESIGN.md contract)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["simulator", "calibrate", "engine", "engine.scheduler",
                                    "engine.block_manager", "engine.sequence", "engine.config"])
def test_module_does_not_import_torch(module: str) -> None:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
