"""A model named on the command line as an engine: "demo" (the bundled small Llama config), an
HF config.json (random weights) or a local model directory with safetensors (its weights)."""

from __future__ import annotations

from pathlib import Path

DEMO = "demo"


def build_engine(model: str | Path | None, config, seed: int = 0):
    """(the LLMEngine, its name in words); ValueError naming the problem for a bad source."""
    from app.demo import DEMO_MODEL
    from engine import LLMEngine

    if model is None or str(model) == DEMO:
        return LLMEngine.from_config(DEMO_MODEL, config, seed=seed), "demo (bundled small llama, random weights)"
    path = Path(model)
    if not path.exists():
        raise ValueError(f"--model {model}: no such file or folder: give 'demo', an HF config.json or a "
                         f"local model folder")
    if path.is_dir() and any(path.glob("*.safetensors")):
        return LLMEngine.from_hf(path, config), str(path)
    return LLMEngine.from_config(path, config, seed=seed), f"{path} (random weights)"
