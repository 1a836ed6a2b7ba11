"""A model named on the command line as an engine: "demo" (the bundled small Llama config), a
catalog id or an HF config.json (random weights), or a local model directory with safetensors (its
weights); and the name the simulator knows it by (sim_model)."""

from __future__ import annotations

from pathlib import Path

DEMO = "demo"


def sim_model(model: str | Path | None) -> str:
    """The simulator's name of an engine's model: the catalog id of 'demo' or of a catalog id,
    else the absolute path of its config.json."""
    from app.demo import DEMO_CATALOG_ID
    from simulator.catalog.models import MODELS_DIR, model_config_path

    if model is None or str(model) == DEMO:
        return DEMO_CATALOG_ID
    path = model_config_path(model)
    return path.stem if path.parent == MODELS_DIR else str(path.resolve())


def build_engine(model: str | Path | None, config, seed: int = 0, threads: int | None = None):
    """(the LLMEngine, its name in words); ValueError naming the problem for a bad source.
    threads: torch's CPU threads in this process (default: torch's choice)."""
    from app.demo import DEMO_MODEL
    from engine import LLMEngine
    from simulator.catalog.models import MODELS_DIR

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if model is None or str(model) == DEMO:
        return LLMEngine.from_config(DEMO_MODEL, config, seed=seed), "demo (bundled small llama, random weights)"
    path = Path(model)
    catalog = MODELS_DIR / f"{model}.json"
    if not path.exists() and catalog.is_file():
        return LLMEngine.from_config(catalog, config, seed=seed), f"{model} (catalog config, random weights)"
    if not path.exists():
        raise ValueError(f"--model {model}: no such file, folder or catalog id: give 'demo', a catalog id, an HF "
                         f"config.json or a local model folder")
    if path.is_dir() and any(path.glob("*.safetensors")):
        return LLMEngine.from_hf(path, config), str(path)
    return LLMEngine.from_config(path, config, seed=seed), f"{path} (random weights)"
