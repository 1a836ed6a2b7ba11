"""`servecast replay`: a trace replayed against any OpenAI-compatible server, measured as
`servecast simulate` reports a simulation (calibrate/http_replay.py sends and records,
calibrate/replay_summary.py summarises)."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from app.common import console, dumps, fail, progress_bar, wide_console


def prepare(url: str, trace: str, model: Optional[str], tokenizer: Optional[Path], vocab_size: Optional[int],
            max_concurrency: Optional[int], slo: str, rate_scale: float, seed: int):
    """Everything that can fail on bad input, before anything is sent: the SLOs, the URL, the
    workload, the prompts, and the server (which must answer GET /models)."""
    from calibrate.http_replay import base_url, first_model, server_models
    from calibrate.replay_prompts import load_tokenizer, text_prompts, token_prompts
    from simulator.fleet.sim_config import SimConfig, parse_slos
    from simulator.workload.load import load_workload

    slos = SimConfig._check_slo(parse_slos(slo))  # simulate's SLO rules, without a fleet to configure
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be at least 1, got {max_concurrency}")
    if vocab_size is not None and vocab_size < 1:
        raise ValueError(f"--vocab-size must be at least 1, got {vocab_size}")
    url = base_url(url)
    workload = load_workload(trace, seed=seed, rate_scale=rate_scale)
    if not len(workload):
        raise ValueError(f"--trace {trace} holds no requests")
    for line in workload.skipped[:5]:
        console.print(f"skipped bad row {line}")
    server = server_models(url)
    model = model or first_model(server, url)
    if tokenizer is not None:
        loaded = load_tokenizer(tokenizer)
        vocab_size = vocab_size or len(loaded)
        prompts = text_prompts(workload, loaded, vocab_size, seed)
    else:
        vocab_size = vocab_size or 256
        prompts = token_prompts(workload, vocab_size, seed)
    return url, model, server, workload, prompts, vocab_size, slos


def print_summary(summary: dict) -> None:
    out = wide_console(100)
    ms = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:,.1f}"  # noqa: E731
    info = summary["replay"]
    table = Table(title=f"{info['model']} at {info['url']}")
    for column in ("latency (ms)", "mean", "p50", "p90", "p95", "p99"):
        table.add_column(column, justify="right")
    for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E")):
        table.add_row(name, *(ms(summary[key][k]) for k in ("mean", "p50", "p90", "p95", "p99")))
    out.print(table)
    t = summary["throughput"]
    out.print(f"{summary['num_finished']}/{summary['num_requests']} requests finished "
              f"({summary['num_rejected']} failed) in {summary['duration_s']:.1f} s: {t['requests_per_s']:.2f} req/s, "
              f"{t['output_tokens_per_s']:,.0f} output tok/s, {t['total_tokens_per_s']:,.0f} total tok/s")
    delay = info["send_delay_s"]
    out.print(f"sent after their arrival by {ms(delay['mean'])} ms on average, {ms(delay['p99'])} ms at p99"
              + (f"; {info['short_outputs']} finished short of the trace's output length" if info["short_outputs"] else ""))
    slo = summary["slo"]
    if slo["targets"]:
        verdict = ", ".join(f"{k} {ms(slo['measured'][k])} ms {'<=' if slo['met'][k] else '>'} {ms(v)} ms"
                            for k, v in slo["targets"].items())
        out.print(f"SLOs {'met' if slo['all_met'] else 'NOT met'}: {verdict}; {slo['requests_within_slo']:.1%} of "
                  f"requests within all; goodput {summary['goodput']['requests_per_s']:.2f} req/s")
    for reason, count in list(summary["rejections"].items())[:3]:
        out.print(f"failed {count}: {reason}")


def replay_command(
    url: str = typer.Option(..., help="the server's OpenAI API base, e.g. http://127.0.0.1:8000/v1"),
    trace: str = typer.Option(..., help="trace file (Azure/Vidur CSV, Mooncake JSONL, lengths CSV,rate=R) or "
                                        "synthetic:num=N,input=I,output=O,rate=R (as servecast simulate takes)"),
    model: Optional[str] = typer.Option(None, help="the served model's name (default: the first of GET /models)"),
    tokenizer: Optional[Path] = typer.Option(None, help="a local HF tokenizer folder: send text prompts that it "
                                             "encodes to the trace's lengths (default: token ids)"),
    vocab_size: Optional[int] = typer.Option(None, help="draw prompt token ids from [0, N) (default: the "
                                             "tokenizer's size, else 256, valid for any model)"),
    max_concurrency: Optional[int] = typer.Option(None, help="requests in flight at most; later ones wait, and "
                                                  "the wait counts in their latency (default: no limit)"),
    slo: str = typer.Option("", help="e.g. ttft_p99=2s,tpot_p99=100ms"),
    rate_scale: float = typer.Option(1.0, help="multiply the trace's arrival rate"),
    seed: int = typer.Option(0, help="the workload's seed and the prompts' token ids'"),
    request_timeout: float = typer.Option(600.0, help="seconds without a byte from the server before a request "
                                          "fails"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON on stdout, nothing else"),
    out: Optional[Path] = typer.Option(None, help="write requests.parquet and summary.json"),
) -> None:
    """Replay a trace against an OpenAI-compatible server: TTFT, TPOT, ITL, E2E, throughput and SLOs,
    in the schema of servecast simulate's summary."""
    from calibrate.http_replay import records_frame, replay
    from calibrate.replay_summary import REQUESTS_FILE, SUMMARY_FILE, ReplayInfo, summarize

    if not request_timeout > 0:
        fail(f"--request-timeout must be a positive number of seconds, got {request_timeout}")
    try:
        url, model, server, workload, prompts, vocab_size, slos = prepare(
            url, trace, model, tokenizer, vocab_size, max_concurrency, slo, rate_scale, seed)
    except ValueError as exc:
        fail(str(exc))
    info = ReplayInfo(url=url, model=model, trace=trace, seed=seed, rate_scale=rate_scale,
                      max_concurrency=max_concurrency, tokenizer=str(tokenizer) if tokenizer else None,
                      vocab_size=vocab_size, started_at=datetime.now(timezone.utc).isoformat(), server=server)
    with progress_bar("replaying", transient=as_json, remaining=True) as progress:
        task = progress.add_task("replay", total=len(workload))
        records = replay(url, model, workload, prompts, max_concurrency, request_timeout,
                         on_done=lambda done: progress.update(task, completed=done))
    requests = records_frame(records)
    summary = summarize(requests, slos, info)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        requests.to_parquet(out / REQUESTS_FILE, index=False)
        (out / SUMMARY_FILE).write_text(dumps(summary))
    if as_json:
        typer.echo(dumps(summary))
        return
    print_summary(summary)
    if out is not None:
        Console().print(f"wrote {out}/{REQUESTS_FILE}, {SUMMARY_FILE}")
