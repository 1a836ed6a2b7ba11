"""`servecast ablate`: what each serving technique buys for a model, an accelerator and a workload,
one stacked on the other (simulator/plan/ablate.py): static batching with padding, then continuous
batching, paged KV, prefix caching, chunked prefill, speculative decoding, weight and KV
quantization, more tensor parallelism. Each row: the peak output throughput per GPU of one
replica, the fewest GPUs that meet the SLOs on the workload, their p99s and $ per million output
tokens."""

from __future__ import annotations

import os

import typer
from pydantic import ValidationError
from rich.table import Table

from app.common import dumps, fail, progress_bar, validation_message, wide_console
from app.plan_defaults import SLO

# A chat service with a shared system prompt: lengths within a 4k context, so every model runs it.
WORKLOAD = "synthetic:num=400,input=uniform(100,1500),output=uniform(20,500),rate=4,prefixes=4,prefix_len=400"


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_table(rows: list[dict], title: str) -> None:
    table = Table(title=title)
    for column in ("technique", "adds", "config", "peak tok/s/GPU", "GPUs", "vs before", "TTFT p99", "TPOT p99",
                   "$/M tok"):
        table.add_column(column, justify="left" if column in ("technique", "adds", "config") else "right")
    before = None
    for row in rows:
        gpus = row["gpus"]
        versus = f"x{gpus / before:.2f}" if gpus and before else "-"
        table.add_row(row["technique"], row["change"], row["config"], _cell(row["peak_output_tok_s_per_gpu"], ",.0f"),
                      str(gpus) if gpus else row["reason"] or "-", versus,
                      _cell(row["ttft_p99_s"] and row["ttft_p99_s"] * 1e3, ",.0f") + " ms" if row["ttft_p99_s"] else "-",
                      _cell(row["tpot_p99_s"] and row["tpot_p99_s"] * 1e3, ",.1f") + " ms" if row["tpot_p99_s"] else "-",
                      _cell(row["usd_per_million_output_tokens"], ",.2f"))
        before = gpus or before
    wide_console(140).print(table)


def ablate_command(
    model: str = typer.Option("llama-2-70b", help="catalog model id or an HF config.json path"),
    hardware: str = typer.Option("a100-80gb", help="catalog accelerator id"),
    workload: str = typer.Option(WORKLOAD, help="trace: synthetic:... or a trace file (servecast simulate's)"),
    slo: str = typer.Option(SLO, help="the SLOs every rung is planned for, e.g. ttft_p99=2s,tpot_p99=100ms"),
    speculative: str = typer.Option("ngram", help="the speculation rung's proposer: ngram or draft"),
    num_speculative_tokens: int = typer.Option(3, min=1, max=8, help="drafts per verification"),
    acceptance: float = typer.Option(0.6, min=0.0, max=1.0, help="the speculation rung's acceptance per draft "
                                     "(assumed: give a measured one)"),
    acceptance_preset: str | None = typer.Option(None, help="published acceptance instead of --acceptance (and "
                                                 "its drafts): an id of simulator/catalog/acceptance.json"),
    seed: int = typer.Option(0, help="seed of the trace's random draws"),
    workers: int = typer.Option(0, min=0, help="processes for the rungs (0: one per CPU)"),
    as_json: bool = typer.Option(False, "--json", help="print the rows as JSON on stdout, nothing else"),
) -> None:
    from simulator.fleet.sim_config import SimConfig, parse_slos
    from simulator.plan.ablate import ablate, ladder, serving_length
    from simulator.plan.capacity import PlanSpec
    from simulator.workload.load import load_workload

    if speculative not in ("ngram", "draft"):
        fail(f"--speculative must be ngram or draft, got {speculative!r}")
    try:
        slos = parse_slos(slo)
        trace = load_workload(workload, seed=seed)
        max_len = serving_length(trace, SimConfig(model=model, hardware=hardware).model_spec().max_position_embeddings)
        rungs = ladder(model, hardware, {"max_model_len": max_len}, speculative, num_speculative_tokens, acceptance,
                       acceptance_preset)
    except ValidationError as exc:
        fail(validation_message(exc))
    except (ValueError, KeyError, OSError) as exc:
        fail(str(exc).strip("'\""))
    spec = PlanSpec(model, trace, slos, seed=seed)
    with progress_bar("ablating", transient=as_json) as bar:
        task = bar.add_task("ablate", total=len(rungs))
        results = ablate(spec, rungs, progress=lambda done, total: bar.update(task, completed=done),
                         workers=workers or os.cpu_count() or 1)
    rows = [r.row() for r in results]
    if as_json:
        typer.echo(dumps({"model": model, "hardware": hardware, "workload": workload, "slo": slos,
                          "max_model_len": max_len, "rows": rows}))
        return
    print_table(rows, f"{model} on {hardware}, max_model_len {max_len}: {workload} under {slo}")
