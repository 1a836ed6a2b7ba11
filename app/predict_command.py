"""`servecast predict`: one forward pass's time per operator, with where each number comes from, and
the KV cache the server would have (simulator/cost/memory.py: vLLM's accounting, checked against
its startup logs in docs/kv-capacity.md)."""

from __future__ import annotations

import json

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from app.common import fail, validation_message, wide_console
from app.knob_options import Knobs, Options, takes
from simulator.cost.step_timer import step_cost
from simulator.fleet.fleet import replica_shape
from simulator.fleet.knobs import EngineChoice, KVCache, Parallelism, Precision, SchedulerLimits, Served
from simulator.fleet.sim_config import SimConfig


# The knobs one forward pass's time depends on: what runs where, its sharding, the engine whose
# additions it carries and that engine's limits (which CUDA-graph sizes it captures).
KNOBS = (Options(Served), Options(Parallelism, only=("tp", "expert_parallel", "routing_skew")), Options(EngineChoice),
         Options(SchedulerLimits, only=("max_num_seqs", "max_num_batched_tokens", "max_model_len"),
                 notes={"max_num_seqs": "the CUDA-graph sizes the server captures follow it; and the KV cache",
                        "max_num_batched_tokens": "likewise"}),
         Options(Precision, only=("quant",), notes={"quant": "the weights' memory and the bytes each step reads"}),
         Options(KVCache, only=("kv_dtype", "gpu_memory_utilization", "block_size")))


@takes(*KNOBS)
def predict_command(
    knobs: Knobs = None,
    tokens: int = typer.Option(512, help="prefill: one sequence of this many tokens"),
    decode_batch: int = typer.Option(0, help="instead: this many decodes ..."),
    context: int = typer.Option(1024, help="... each at this context length"),
    dtype: str | None = typer.Option(None, help="what GEMMs compute in (default: what --quant implies: bf16, "
                                     "fp8 under fp8 or nvfp4 weights)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Per-operator and per-step time of one forward pass, with where each number comes from."""
    from simulator.catalog.models import load_model
    from calibrate.fitting.device import load_cost_model
    from simulator.cost.types import Chunk

    hardware, tp = knobs["hardware"], knobs["tp"]
    try:
        parallel, served, limits = knobs.of(Parallelism), knobs.of(Served), knobs.of(SchedulerLimits)
        spec = load_model(served.model)
        if spec.num_heads % tp != 0:
            raise ValueError(f"--tp {tp} must divide the model's {spec.num_heads} attention heads")
        if decode_batch < 0:
            raise ValueError(f"--decode-batch must be 0 (a prefill) or more (decodes), got {decode_batch}")
        if decode_batch and context < 1:  # each option checked only where the step uses it
            raise ValueError(f"--context must be positive for decodes, got {context}")
        if not decode_batch and tokens < 1:
            raise ValueError(f"--tokens must be positive for a prefill, got {tokens} (or give --decode-batch)")
        if parallel.expert_parallel:
            spec.check_expert_parallel(tp)
        from simulator.catalog.engines import load_engine

        device = load_cost_model(hardware, profile=served.profile, hardware_file=served.hardware_file)
        from simulator.fleet.sim_config import engine_defaults

        default = engine_defaults(dict(knobs.items()))  # the engine's limits for the GPU, where not given
        cost_model = device.with_engine(load_engine(knobs["engine"], knobs["engine_file"], device.accelerator.profiled),
                                        limits.max_num_seqs or default["max_num_seqs"],
                                        limits.max_num_batched_tokens or default["max_num_batched_tokens"], tp)
        chunks = ([Chunk(1, context)] * decode_batch if decode_batch else [Chunk(tokens, tokens)])
        # The simulator's own step for this replica: its weights' and cache's precisions as --quant and
        # --kv-dtype set them, decodes padded to the engine's block size.
        shape = replica_shape(SimConfig(**sim_fields(knobs), activation_dtype=dtype or "auto"), spec)
        dtype = shape.dtype
        step = step_cost(cost_model, shape, chunks)
        kv = kv_capacity(knobs, spec)
    except ValidationError as exc:
        fail(validation_message(exc))
    except ValueError as exc:
        fail(str(exc))
    result = {"hardware": hardware, "model": spec.name, "tp": tp, "dtype": dtype, "quant": knobs["quant"], "engine": cost_model.engine.id,
              "step": {"decode_batch": decode_batch, "context": context} if decode_batch else {"prefill_tokens": tokens},
              "step_time_s": step.total_s,
              "operators": {name: {"time_s": t, "provenance": step.provenance[name],
                                   "expected_error": step.expected_error[name]}
                            for name, t in step.by_operator.items()},
              "kv_cache": kv}
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    weights = "" if knobs["quant"] == dtype else f", {knobs['quant']} weights"
    table = Table(title=f"{spec.name} on {hardware} (tp={tp}, {dtype}{weights}): one step")
    for column in ("operator", "time ms", "share", "provenance", "± expected"):
        table.add_column(column, justify="right")
    for name, op in sorted(result["operators"].items(), key=lambda kv: -kv[1]["time_s"]):
        table.add_row(name, f"{op['time_s'] * 1e3:.3f}", f"{op['time_s'] / step.total_s:.1%}", op["provenance"],
                      f"{op['expected_error']:.0%}")
    wide_console(100).print(table)
    Console().print(f"step time: {step.total_s * 1e3:.3f} ms")
    if kv["error"]:
        Console().print(f"KV cache: none ({kv['error']})", highlight=False)
        return
    Console().print(f"KV cache per GPU: {kv['available_gib']:.2f} GiB after {kv['weights_gib']:.2f} GiB of weights and "
                    f"{kv['activations_gib'] + kv['reserve_gib']:.2f} GiB of activations and reserve: "
                    f"{kv['tokens']:,} tokens ({kv['blocks']:,} blocks of {kv['block_size']}); "
                    f"{kv['max_concurrency']:.2f} requests of {kv['max_model_len']:,} tokens at once", highlight=False)


def sim_fields(knobs) -> dict:
    """The knobs given, as SimConfig fields."""
    return {k: v for k, v in knobs.items() if k in SimConfig.model_fields and v is not None}


def kv_capacity(knobs, spec) -> dict:
    """The replica's KV cache as the server would size it (SimConfig's memory plan), or why none fits."""
    try:
        config = SimConfig(**sim_fields(knobs))
        _, _, plan = config.check()
    except ValueError as exc:
        return {"error": str(exc)}
    longest = config.resolved_max_model_len(spec, plan)
    gib = 2**30
    return {"error": None, "available_gib": plan.kv_bytes / gib, "weights_gib": plan.weight_bytes / gib,
            "activations_gib": plan.activation_bytes / gib, "reserve_gib": plan.reserve_bytes / gib,
            "tokens": plan.kv_tokens, "blocks": plan.num_blocks, "block_size": plan.block_size,
            "max_model_len": longest, "max_concurrency": plan.kv_tokens / longest}
