"""`servecast profile`: time the engine's operators on this device and write a profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from app.common import fail, progress_bar


def _engine_model_config(model: str):
    """An engine ModelConfig from a catalog id, a config.json path or 'demo'."""
    from app.demo import DEMO_MODEL
    from engine.policy.config import ModelConfig
    from simulator.catalog.models import model_config_path

    if model == "demo":
        return ModelConfig.from_hf(DEMO_MODEL)
    return ModelConfig.from_hf(model_config_path(model))


def profile_command(
    model: str = typer.Option("demo", help="catalog id, HF config.json path, or 'demo' (the bundled small Llama)"),
    out: Path = typer.Option(..., help="profile file (JSON Lines); an existing one is resumed"),
    device: str = typer.Option("cpu"),
    dtype: str = typer.Option("float32"),
    hardware: Optional[str] = typer.Option(None, help="catalog id of this device (e.g. h200), so the simulator "
                                           "uses the profile for that accelerator (default: cpu-local / cuda-local)"),
    max_batched_tokens: int = typer.Option(512, help="largest token count profiled for GEMMs and elementwise ops"),
    max_context: Optional[int] = typer.Option(None, help="longest decode context profiled (64, 256, 1024, ... up "
                                              "to it; default 1024): GPUs serve longer contexts"),
    quick: bool = typer.Option(False, help="a tiny grid (seconds; for smoke tests)"),
    tp: int = typer.Option(1, help="also time all-reduce across this many local processes (gloo / NCCL)"),
    cp: int = typer.Option(1, help="also time context parallelism's ring hop (a rank's K/V to the next) and the "
                                   "decode queries' all-reduce across this many local processes"),
    expert_parallel: bool = typer.Option(False, "--expert-parallel", help="MoE models under --tp: whole experts "
                                         "per rank, and time the all-to-all that feeds them"),
    threads: Optional[int] = typer.Option(None, help="CPU threads for torch (default: torch's choice); "
                                                     "recorded in the profile's fingerprint"),
    quant: str = typer.Option("", help="also time quantized linear layers (the kernels the engine chooses "
                                       "here, named in the fingerprint): e.g. int8,int4,fp8,w8a8"),
    quant_group_size: int = typer.Option(128, help="int4 group size for --quant"),
    kv_quant: str = typer.Option("", help="also time reads of a quantized KV cache: e.g. int8,fp8"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON summary on stdout"),
) -> None:
    """Time the engine's operators on this device over a grid and write (or resume) a profile."""
    from dataclasses import replace

    from calibrate.profiling.plan import ProfileGrid
    from calibrate.profiling.profiler import Profiler
    from engine.engine import resolve_device
    from simulator.catalog.hardware import get_accelerator
    from engine.policy.config import check_quantization
    from engine.policy.dtypes import ENGINE_DTYPES

    try:
        config = _engine_model_config(model)
        if expert_parallel:
            if not config.num_experts:
                raise ValueError(f"--expert-parallel needs a mixture-of-experts model; {model} is dense: drop it")
            config = replace(config, expert_parallel=True)
        resolve_device(device)
        if dtype not in ENGINE_DTYPES:
            raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(ENGINE_DTYPES)}")
        if max_batched_tokens < 1:
            raise ValueError("--max-batched-tokens must be positive")
        if threads is not None:
            if threads < 1:
                raise ValueError("--threads must be at least 1")
            import torch

            torch.set_num_threads(threads)
        if max_context is not None and max_context < 64:
            raise ValueError(f"--max-context must be at least 64 tokens, got {max_context}")
        grid = ProfileGrid.quick() if quick else ProfileGrid.for_budget(max_batched_tokens, max_context)
        modes = tuple(m.strip() for m in quant.split(",") if m.strip())
        for mode in modes:
            check_quantization(mode, quant_group_size)
        kv_modes = tuple(m.strip() for m in kv_quant.split(",") if m.strip())
        for mode in kv_modes:
            if mode not in ("int8", "fp8"):
                raise ValueError(f"--kv-quant {mode!r} is not supported; use int8, fp8 or both (int8,fp8)")
        grid = replace(grid, weight_quant=modes, quant_group_size=quant_group_size, kv_quant=kv_modes)
        if hardware is not None:
            get_accelerator(hardware)  # a catalog id, or a clear error naming the ids
        if out.is_dir():
            raise ValueError(f"--out {out} is a folder: give a profile file, e.g. {out / 'profile.jsonl'}")
        out.parent.mkdir(parents=True, exist_ok=True)
        profiler = Profiler(config, device=device, dtype=dtype, hardware=hardware, grid=grid, tp=tp, cp=cp)
        with progress_bar("profiling", transient=as_json) as progress:
            task = progress.add_task("profile", total=len(profiler.plan()))
            result = profiler.run(out, on_progress=lambda done, total: progress.update(task, completed=done))
    except ValueError as exc:
        fail(str(exc))
    summary = {"profile": str(out), "hardware": result.hardware, "measurements": len(result.measurements),
               "peaks": result.peaks, "fingerprint": result.fingerprint}
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        Console().print(f"{len(result.measurements)} measurements of {result.hardware} in {out} "
                        f"(matmul peak {result.peaks['matmul_flops'] / 1e9:.1f} GFLOP/s, "
                        f"copy bandwidth {result.peaks['memory_bandwidth'] / 1e9:.1f} GB/s)")
