"""`servecast predict`: one forward pass's time per operator, with where each number comes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from app.common import fail, wide_console
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import step_cost


def predict_command(
    hardware: str = typer.Option(..., help="catalog hardware id (e.g. h100-sxm) or a profiled local device"),
    model: str = typer.Option(..., help="catalog model id or HF config.json path"),
    tokens: int = typer.Option(512, help="prefill: one sequence of this many tokens"),
    decode_batch: int = typer.Option(0, help="instead: this many decodes ..."),
    context: int = typer.Option(1024, help="... each at this context length"),
    tp: int = typer.Option(1, help="tensor-parallel degree"),
    dtype: str = typer.Option("bf16"),
    profile_path: Optional[Path] = typer.Option(None, "--profile", help="a profile of this hardware"),
    hardware_file: Optional[Path] = typer.Option(None, help="extra hardware YAML"),
    expert_parallel: bool = typer.Option(False, "--expert-parallel", help="MoE models: whole experts per TP rank"),
    routing_skew: float = typer.Option(0.0, help="MoE router imbalance: 0 uniform, s > 0 Zipf shares 1/(e+1)^s"),
    engine: Optional[str] = typer.Option(None, help="serving engine: vllm-v0.15 (default on catalog GPUs) or "
                                         "servecast (kernels alone on catalog GPUs)"),
    engine_file: Optional[Path] = typer.Option(None, help="an engine profile fitted on your own runs"),
    max_num_seqs: int = typer.Option(256, help="the server's limit (which CUDA-graph sizes it captures)"),
    max_num_batched_tokens: int = typer.Option(8192, help="the server's token budget (likewise)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Per-operator and per-step time of one forward pass, with where each number comes from."""
    from simulator.catalog.models import load_model
    from calibrate.fitting.device import load_cost_model
    from simulator.cost.types import Chunk

    try:
        spec = load_model(model)
        if tp < 1 or spec.num_heads % tp != 0:
            raise ValueError(f"--tp {tp} must divide the model's {spec.num_heads} attention heads")
        if tokens < 1 or decode_batch < 0 or context < 1:
            raise ValueError("--tokens and --context must be positive, --decode-batch non-negative")
        if expert_parallel:
            spec.check_expert_parallel(tp)
        if routing_skew < 0:
            raise ValueError("--routing-skew must be >= 0 (0: uniform)")
        from simulator.catalog.engines import load_engine

        device = load_cost_model(hardware, profile=profile_path, hardware_file=hardware_file)
        cost_model = device.with_engine(load_engine(engine, engine_file, device.accelerator.profiled), max_num_seqs,
                                        max_num_batched_tokens)
        chunks = ([Chunk(1, context)] * decode_batch if decode_batch else [Chunk(tokens, tokens)])
        # The simulator's own step for this shape (its default block size: the engine's padded decodes).
        shape = ReplicaShape(spec, tp=tp, dtype=dtype, expert_parallel=expert_parallel, routing_skew=routing_skew)
        step = step_cost(cost_model, shape, chunks)
    except ValueError as exc:
        fail(str(exc))
    result = {"hardware": hardware, "model": spec.name, "tp": tp, "dtype": dtype, "engine": cost_model.engine.id,
              "step": {"decode_batch": decode_batch, "context": context} if decode_batch else {"prefill_tokens": tokens},
              "step_time_s": step.total_s,
              "operators": {name: {"time_s": t, "provenance": step.provenance[name],
                                   "expected_error": step.expected_error[name]}
                            for name, t in step.by_operator.items()}}
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    table = Table(title=f"{spec.name} on {hardware} (tp={tp}, {dtype}): one step")
    for column in ("operator", "time ms", "share", "provenance", "± expected"):
        table.add_column(column, justify="right")
    for name, op in sorted(result["operators"].items(), key=lambda kv: -kv[1]["time_s"]):
        table.add_row(name, f"{op['time_s'] * 1e3:.3f}", f"{op['time_s'] / step.total_s:.1%}", op["provenance"],
                      f"{op['expected_error']:.0%}")
    wide_console(100).print(table)
    Console().print(f"step time: {step.total_s * 1e3:.3f} ms")
