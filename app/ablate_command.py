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

from app import labels
from app.common import dumps, fail, progress_bar, validation_message, wide_console
from app.plan_defaults import SLO

# A chat service with a shared system prompt: lengths within a 4k context, so every model runs it.
# A row's fields as the CLI, the report and the app show them (app/labels.py names and units them).
ABLATION_FIELDS = ("technique", "change", "config", "peak_output_tok_s_per_gpu", "gpus", "ttft_p99_s", "tpot_p99_s",
                   "usd_per_million_output_tokens", "reason")
WORKLOAD = "synthetic:num=400,input=uniform(100,1500),output=uniform(20,500),rate=4,prefixes=4,prefix_len=400"


def print_table(rows: list[dict], title: str) -> None:
    """The rows in the labels' names and units, and each rung's GPUs against the one before."""
    table = Table(title=title)
    for field in ABLATION_FIELDS[:5]:
        table.add_column(labels.label(field), justify="left" if field in ("technique", "change", "config") else "right")
    table.add_column("vs before", justify="right")
    for field in ABLATION_FIELDS[5:-1]:
        table.add_column(labels.label(field), justify="right")
    before = None
    for row in rows:
        gpus = row["gpus"]
        cells = [labels.text(f, row[f]) for f in ABLATION_FIELDS[:4]] + [str(gpus) if gpus else row["reason"] or "-"]
        cells.append(f"x{gpus / before:.2f}" if gpus and before else "-")
        table.add_row(*cells, *(labels.text(f, row[f]) for f in ABLATION_FIELDS[5:-1]))
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
    from simulator.fleet.sim_config import parse_slos
    from simulator.plan.ablate import ablate, ladder_for
    from simulator.plan.capacity import PlanSpec
    from simulator.workload.load import load_workload

    if speculative not in ("ngram", "draft"):
        fail(f"--speculative must be ngram or draft, got {speculative!r}")
    try:
        spec = PlanSpec(model, load_workload(workload, seed=seed), parse_slos(slo), seed=seed)
        rungs = ladder_for(spec, hardware, speculative=speculative, num_speculative_tokens=num_speculative_tokens,
                           acceptance=acceptance, acceptance_preset=acceptance_preset)
    except ValidationError as exc:
        fail(validation_message(exc))
    except (ValueError, KeyError, OSError) as exc:
        fail(str(exc).strip("'\""))
    max_len = rungs[0].knobs["max_model_len"]
    with progress_bar("ablating", transient=as_json) as bar:
        task = bar.add_task("ablate", total=len(rungs))
        results = ablate(spec, rungs, progress=lambda done, total: bar.update(task, completed=done),
                         workers=workers or os.cpu_count() or 1)
    rows = [r.row() for r in results]
    if as_json:
        typer.echo(dumps({"model": model, "hardware": hardware, "workload": workload, "slo": spec.slo,
                          "max_model_len": max_len, "rows": rows}))
        return
    print_table(rows, f"{model} on {hardware}, max_model_len {max_len}: {workload} under {slo}")
