"""`servecast replay`: a trace replayed against any OpenAI-compatible server, measured as
`servecast simulate` reports a simulation (calibrate/runs/http.py sends and records,
calibrate/runs/replay_summary.py summarises)."""

from __future__ import annotations

import contextlib
import math
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from app.common import console, dumps, fail, progress_bar, wide_console


def deployment_of(stated: dict, server: dict | None, model: str) -> dict | None:
    """The replayed server as the simulator sees it: what the server reported (servecast's does),
    overridden by --deployment; the model's catalog id from the served name (or the weights its
    card names) where neither gave one."""
    from calibrate.runs.http import reported_deployment
    from calibrate.runs.tables import RunsError, catalog_model

    deployment = {**reported_deployment(server, model), **stated}
    # vLLM's card names the weights it serves (root) where the served name is an alias.
    roots = [c.get("root") for c in (server or {}).get("data") or [] if isinstance(c, dict) and c.get("id") == model]
    for name in [model, *(r for r in roots if isinstance(r, str))]:
        if "model" not in deployment:
            with contextlib.suppress(RunsError):
                deployment["model"] = catalog_model(name)
    return deployment or None


@dataclass
class Prepared:
    """A replay ready to send: nothing past this point fails on bad input."""

    url: str
    model: str
    server: dict | None
    workload: object  # simulator.workload.requests.Workload
    prompts: list
    warmup: object  # the warm-up requests (a Workload, maybe empty)
    warmup_prompts: list
    vocab_size: int
    slos: dict
    deployment: dict | None
    warnings: list[str]  # said before anything is sent


# Exit status of a replay in which some requests failed (its figures are still printed and written):
# distinct from 0 (all served) and 2 (bad input).
REQUESTS_FAILED = 4

# Warm-up requests' ids start here: their prompts' ids (drawn per request id) are then no replay's.
WARMUP_IDS = 2**40


def warmup_workload(workload, count: int):
    """The first `count` requests' shapes, all at once, without shared segments and with ids of their
    own: they warm the server (allocations, caches, lazy set-up) and leave nothing in its prefix
    cache that this replay's prompts, or a later replay's under any prompt seed, could hit."""
    from simulator.workload.requests import Request, Workload

    return Workload("warm-up", [Request(WARMUP_IDS + r.request_id, 0.0, r.prompt_tokens, r.output_tokens)
                                for r in workload.requests[:count]])


def prepare(url: str, trace: str, model: Optional[str], tokenizer: Optional[Path], vocab_size: Optional[int],
            max_concurrency: Optional[int], slo: str, rate_scale: float, seed: int, prompt_seed: int,
            deployment: str = "", warmup: int = 0) -> Prepared:
    """Everything that can fail on bad input, before anything is sent: the SLOs, the deployment,
    the URL, the workload, the prompts, and the server (which must answer GET /models)."""
    from calibrate.runs.deployment import parse_deployment
    from calibrate.runs.http import base_url, first_model, served_max_model_len, server_models
    from calibrate.runs.prompts import load_tokenizer, text_prompts, token_prompts
    from simulator.fleet.sim_config import check_slos, parse_slos
    from simulator.workload.load import load_workload, with_max_concurrency

    slos = check_slos(parse_slos(slo))  # simulate's SLO rules, without a fleet to configure
    stated = parse_deployment(deployment)  # a bad --deployment fails before the server is asked anything
    for name, value, least in (("--vocab-size", vocab_size, 1),
                               ("--warmup", warmup, 0), ("--prompt-seed", prompt_seed, 0)):
        if value is not None and value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")
    url = base_url(url)
    workload = load_workload(trace, seed=seed, rate_scale=rate_scale)
    if not len(workload):
        raise ValueError(f"--trace {trace} holds no requests")
    workload = with_max_concurrency(workload, max_concurrency)
    for line in workload.skipped[:5]:
        console.print(f"skipped bad row {line}")
    server = server_models(url)
    model = model or first_model(server, url)
    if tokenizer is not None:
        loaded = load_tokenizer(tokenizer)
        vocab_size = vocab_size or len(loaded)
        make = lambda w, s: text_prompts(w, loaded, vocab_size, s)  # noqa: E731
    else:
        vocab_size = vocab_size or 256
        make = lambda w, s: token_prompts(w, vocab_size, s)  # noqa: E731
    warm = warmup_workload(workload, warmup)
    warnings = []
    longest = served_max_model_len(server, model)
    too_long = [r for r in workload.requests if longest is not None and r.prompt_tokens + r.output_tokens > longest]
    if too_long:
        warnings.append(f"{len(too_long)} of {len(workload)} requests ask for more than the server's max_model_len="
                        f"{longest} tokens (prompt + output): it will refuse or cut them short")
    return Prepared(url, model, server, workload, make(workload, prompt_seed), warm, make(warm, prompt_seed),
                    vocab_size, slos, deployment_of(stated, server, model), warnings)


def print_summary(summary) -> None:
    out = wide_console(100)
    ms = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:,.1f}"  # noqa: E731
    info = summary.replay
    table = Table(title=f"{info.model} at {info.url}")
    for column in ("latency (ms)", "mean", "p50", "p90", "p95", "p99"):
        table.add_column(column, justify="right")
    for d, name in ((summary.ttft_s, "TTFT"), (summary.tpot_s, "TPOT"), (summary.itl_s, "ITL"), (summary.e2e_s, "E2E")):
        table.add_row(name, *(ms(v) for v in (d.mean, d.p50, d.p90, d.p95, d.p99)))
    out.print(table)
    t = summary.throughput
    out.print(f"{summary.num_finished}/{summary.num_requests} requests finished "
              f"({summary.num_rejected} failed) in {summary.duration_s:.1f} s: {t.requests_per_s:.2f} req/s, "
              f"{t.output_tokens_per_s:,.0f} output tok/s, {t.total_tokens_per_s:,.0f} total tok/s")
    delay = info.send_delay_s
    out.print(f"sent after their arrival by {ms(delay.mean)} ms on average, {ms(delay.p99)} ms at p99"
              + (f"; {info.short_outputs} finished short of the trace's output length" if info.short_outputs else ""))
    slo = summary.slo
    if slo.targets:
        verdict = ", ".join(f"{k} {ms(slo.measured[k])} ms {'<=' if slo.met[k] else '>'} {ms(v)} ms"
                            for k, v in slo.targets.items())
        out.print(f"SLOs {'met' if slo.all_met else 'NOT met'}: {verdict}; {slo.requests_within_slo:.1%} of "
                  f"requests within all; goodput {summary.goodput.requests_per_s:.2f} req/s")
    for reason, count in sorted(summary.rejections.items(), key=lambda kv: -kv[1]):  # every reason, once
        out.print(f"failed {count}: {reason}", highlight=False)


def replay_command(
    url: str = typer.Option(..., help="the server's OpenAI API base, e.g. http://127.0.0.1:8000/v1"),
    trace: str = typer.Option(..., help="trace file (Azure/Vidur CSV, Mooncake JSONL, lengths CSV,rate=R) or "
                                        "synthetic:num=N,input=I,output=O,rate=R (as servecast simulate takes)"),
    model: Optional[str] = typer.Option(None, help="the served model's name (default: the first of GET /models)"),
    tokenizer: Optional[Path] = typer.Option(None, help="a local HF tokenizer folder: send text prompts that it "
                                             "encodes to the trace's lengths (default: token ids)"),
    vocab_size: Optional[int] = typer.Option(None, help="draw prompt token ids from [0, N) (default: the "
                                             "tokenizer's size, else 256, valid for any model)"),
    max_concurrency: Optional[int] = typer.Option(None, help="closed-loop clients: requests in flight at most, the "
                                                  "next sent in order as one finishes, its latency counted from "
                                                  "the send, as vllm bench serve --max-concurrency (the trace's "
                                                  "concurrency=C says the same; default: open loop)"),
    slo: str = typer.Option("", help="e.g. ttft_p99=2s,tpot_p99=100ms"),
    rate_scale: float = typer.Option(1.0, help="multiply the trace's arrival rate"),
    seed: int = typer.Option(0, help="the workload's seed (its lengths and arrivals)"),
    prompt_seed: Optional[int] = typer.Option(None, help="the prompts' token ids' seed (default: a new one each "
                                              "replay, recorded, so that a replay never hits prefix-cache entries "
                                              "an earlier replay of the same trace left on the server)"),
    warmup: int = typer.Option(0, help="first send this many requests (the trace's first shapes, at once, prompts "
                               "of their own) and wait for them: a server that just started runs its first requests "
                               "slower (not recorded)"),
    request_timeout: float = typer.Option(600.0, help="seconds without a byte from the server before a request "
                                          "fails"),
    deployment: str = typer.Option("", help="the server as the simulator should see it, SimConfig fields: e.g. "
                                   "model=llama-3.1-8b,hardware=h100-sxm,tp=2,max_num_batched_tokens=8192 (servecast "
                                   "serve reports its own); recorded for servecast calibrate --runs"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON on stdout, nothing else"),
    out: Optional[Path] = typer.Option(None, help="write requests.parquet and summary.json"),
) -> None:
    """Replay a trace against an OpenAI-compatible server: TTFT, TPOT, ITL, E2E, throughput and SLOs,
    in the schema of servecast simulate's summary."""
    from calibrate.runs.http import records_frame, replay
    from calibrate.runs.replay_summary import REQUESTS_FILE, SUMMARY_FILE, ReplayInfo, summarize
    from simulator.workload.load import portable_spec

    if not request_timeout > 0:
        fail(f"--request-timeout must be a positive number of seconds, got {request_timeout}")
    if prompt_seed is None:
        prompt_seed = secrets.randbelow(2**31)
    try:
        ready = prepare(url, trace, model, tokenizer, vocab_size, max_concurrency, slo, rate_scale, seed, prompt_seed,
                        deployment, warmup)
    except ValueError as exc:
        fail(str(exc))
    for warning in ready.warnings:
        console.print(f"warning: {warning}", highlight=False)
    clients = ready.workload.clients
    if clients is not None and max_concurrency is not None and "concurrency=" not in trace:
        trace = f"{trace},concurrency={max_concurrency}"  # read again (simulate --replay, calibrate) as sent
    info = ReplayInfo(url=ready.url, model=ready.model, trace=portable_spec(trace), seed=seed, rate_scale=rate_scale,
                      max_concurrency=clients.concurrency if clients else None, tokenizer=str(tokenizer) if tokenizer else None,
                      vocab_size=ready.vocab_size, started_at=datetime.now(timezone.utc).isoformat(),
                      server=ready.server, deployment=ready.deployment, prompt_seed=prompt_seed)
    with progress_bar("{task.description}", transient=as_json, remaining=True) as progress:
        if len(ready.warmup):
            task = progress.add_task("warming up", total=len(ready.warmup))
            warm = replay(ready.url, ready.model, ready.warmup.closed_loop(ready.workload.clients), ready.warmup_prompts,
                          request_timeout,
                          on_done=lambda done: progress.update(task, completed=done))
            failed = [r.error for r in warm if r.error]
            if failed:
                fail(f"{len(failed)} of {len(warm)} warm-up requests failed ({failed[0]}): nothing was replayed")
            progress.remove_task(task)
        task = progress.add_task("replaying", total=len(ready.workload))
        records = replay(ready.url, ready.model, ready.workload, ready.prompts, request_timeout,
                         on_done=lambda done: progress.update(task, completed=done))
    requests = records_frame(records)
    summary = summarize(requests, ready.slos, info)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        requests.to_parquet(out / REQUESTS_FILE, index=False)
        (out / SUMMARY_FILE).write_text(dumps(summary))
    if as_json:
        typer.echo(dumps(summary))
    else:
        print_summary(summary)
        if out is not None:
            Console().print(f"wrote {out}/{REQUESTS_FILE}, {SUMMARY_FILE}")
    if summary.num_rejected:  # measured, written, and said: but not a clean replay
        raise typer.Exit(REQUESTS_FAILED)
