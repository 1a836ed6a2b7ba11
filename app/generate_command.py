"""`servecast generate`: serve a workload through the real engine and print per-request timings."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from app import engine_flags as flags
from app.common import dumps, fail, progress_bar, wide_console
from app.knob_options import Knobs, takes


def parse_rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        fail(f"--rate must be a number of requests/s or 'inf', got {text!r}")
    if math.isnan(rate) or rate <= 0:
        fail(f"--rate must be positive (requests/s) or 'inf', got {text!r}")
    return rate


@takes(*flags.KNOBS)
def generate_command(
    model: Optional[Path] = typer.Option(None, help="HF config.json (random weights) or a local model directory "
                                                    "with safetensors; default: a small bundled Llama config"),
    num_requests: int = typer.Option(32, help="requests to serve"),
    rate: str = typer.Option("8", help="Poisson arrival rate in requests/s, or 'inf' for all at once"),
    lengths: Optional[Path] = typer.Option(None, help="CSV of prompt_tokens,output_tokens (default: bundled ShareGPT sample)"),
    length_scale: float = typer.Option(1 / 8, help="multiply trace lengths by this (fit a CPU / small model)"),
    max_total_tokens: int = typer.Option(512, help="cap prompt+output per request"),
    knobs: Knobs = None,
    device: str = flags.DEVICE, dtype: str = flags.DTYPE,
    quantization: Optional[str] = flags.QUANTIZATION, quant_group_size: int = flags.QUANT_GROUP_SIZE,
    quant_kernel: Optional[str] = flags.QUANT_KERNEL,
    kv_cache_dtype: Optional[str] = flags.KV_CACHE_DTYPE,
    seed: int = typer.Option(0),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON on stdout, nothing else"),
    out: Optional[Path] = typer.Option(None, help="write summary.json and requests.csv here"),
) -> None:
    """Serve a workload through the real engine and print per-request timings (the bundled default job)."""
    from app.demo import DemoWorkload, demo_requests
    from app.engine_source import build_engine
    from app.report import request_rows, summarize
    from engine.replay import replay
    from simulator.workload.requests import BUNDLED_LENGTHS

    rate_per_s = parse_rate(rate)
    try:
        workload = DemoWorkload(num_requests, rate_per_s, length_scale, max_total_tokens, seed)
        config = flags.engine_config(knobs, device, dtype, quantization, quant_group_size, kv_cache_dtype,
                                     quant_kernel=quant_kernel, seed=seed,
                                     max_model_len=max_total_tokens if model is None else None)
        engine, _ = build_engine(model, config, seed)
        requests = demo_requests(workload, engine.model_config.vocab_size, lengths or BUNDLED_LENGTHS)
        with progress_bar("serving", transient=as_json) as progress:
            task = progress.add_task("serve", total=len(requests))
            outputs = replay(engine, requests, on_finish=lambda _: progress.advance(task))
        engine.close()
    except ValueError as exc:
        fail(str(exc))

    rows = request_rows(outputs)
    summary = summarize(outputs)
    summary["engine"] = {"model": str(model or "bundled demo llama (random weights)"),
                         "parameters": engine.model_config.num_parameters(), "device": device, "dtype": dtype,
                         "kv_blocks": engine.cache_config.num_blocks, "block_size": config.block_size,
                         "steps": engine.num_steps, "tensor_parallel_size": config.tensor_parallel_size,
                         "context_parallel_size": config.context_parallel_size, "quantization": quantization,
                         "quant_kernels": sorted(set(engine.model.quant_kernels().values())),
                         "kv_cache_dtype": kv_cache_dtype}
    load = engine.expert_load()
    if load:  # a mixture-of-experts model: how its router spread the rows, and the simulator's knob for it
        from simulator.cost.moe import fit_routing_skew

        per_expert = [sum(layer[e] for layer in load) for e in range(len(load[0]))]
        summary["engine"]["expert_rows"] = per_expert
        summary["engine"]["routing_skew"] = round(fit_routing_skew(per_expert), 3)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(dumps(summary))
        with (out / "requests.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if as_json:
        typer.echo(dumps(summary))
        return
    print_report(rows, summary)


def print_report(rows: list[dict], summary: dict) -> None:
    stdout = wide_console(110)
    table = Table(title="Per-request timings")
    for column in ("request", "arrival s", "prompt tok", "output tok", "queue ms", "TTFT ms", "TPOT ms",
                   "E2E s", "preempted", "cached tok"):
        table.add_column(column, justify="right")
    ms = lambda v: "-" if v is None or math.isnan(v) else f"{v * 1e3:.1f}"  # noqa: E731
    for r in rows:
        table.add_row(r["request_id"], f"{r['arrival_s']:.3f}", str(r["prompt_tokens"]), str(r["output_tokens"]),
                      ms(r["queue_s"]), ms(r["ttft_s"]), ms(r["tpot_s"]), f"{r['e2e_s']:.3f}",
                      str(r["preemptions"]), str(r["cached_prompt_tokens"]))
    stdout.print(table)
    t, e = summary["throughput"], summary["engine"]
    stdout.print(
        f"{summary['num_requests']} requests in {summary['duration_s']:.2f} s on {e['device']} "
        f"({e['steps']} engine steps, {e['parameters'] / 1e6:.1f}M-parameter model): "
        f"{t['output_tokens_per_s']:.1f} output tok/s, {t['total_tokens_per_s']:.1f} total tok/s\n"
        f"TTFT p50 {ms(summary['ttft_s']['p50'])} ms, p99 {ms(summary['ttft_s']['p99'])} ms | "
        f"TPOT p50 {ms(summary['tpot_s']['p50'])} ms, p99 {ms(summary['tpot_s']['p99'])} ms | "
        f"preemptions {summary['preemptions']} | prefix-cache hits {summary['cached_prompt_tokens']} tokens")
