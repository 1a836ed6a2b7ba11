"""`servecast simulate`: one fleet configuration on one workload."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from app import labels
from app.common import console, dumps, fail, progress_bar, validation_message, wide_console
from app.knob_options import Knobs, Options, takes
from simulator.fleet.knobs import GROUPS, Served, knob_extra


def run_simulation(config, trace: str, rate_scale: float, as_json: bool, workers: int = 1,
                   max_concurrency: int | None = None):
    from calibrate.fitting.device import cost_models_for
    from simulator.fleet.run import simulate
    from simulator.workload.load import load_workload, with_max_concurrency

    # Everything that can fail on bad input fails here, before the progress bar.
    config.check()
    cost_model, draft_cost_model = cost_models_for(config)
    workload = with_max_concurrency(load_workload(trace, seed=config.seed, rate_scale=rate_scale), max_concurrency)
    for line in workload.skipped[:5]:
        console.print(f"skipped bad row {line}")
    if len(workload.skipped) > 5:
        console.print(f"... {len(workload.skipped) - 5} more bad rows skipped")
    with progress_bar("simulating", transient=as_json, remaining=True) as progress:
        task = progress.add_task("simulate", total=len(workload))
        return simulate(config, workload, cost_model, draft_cost_model=draft_cost_model,
                        progress=lambda done, total: progress.update(task, completed=done), workers=workers)


def write_outputs(out: Path, result) -> None:
    from app.html_report import simulation_report

    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(dumps(result.summary))
    result.requests.to_parquet(out / "requests.parquet", index=False)
    result.timeseries.to_parquet(out / "timeseries.parquet", index=False)
    simulation_report(out / "report.html", result)


def print_summary(summary) -> None:
    out = wide_console(100)
    ms = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:,.1f}"  # noqa: E731
    table = Table(title=f"{summary.model} on {summary.replicas} x {summary.hardware} "
                        f"({labels.parallelism(summary)}, {summary.quant}, {summary.scheduler} batching)")
    for column in ("latency (ms)", "mean", "p50", "p90", "p95", "p99"):
        table.add_column(column, justify="right")
    for d, name in ((summary.ttft_s, "TTFT"), (summary.tpot_s, "TPOT"), (summary.itl_s, "ITL"),
                    (summary.e2e_s, "E2E"), (summary.queue_s, "queueing")):
        table.add_row(name, *(ms(v) for v in (d.mean, d.p50, d.p90, d.p95, d.p99)))
    out.print(table)
    if summary.intervals:
        # The table is as simulated; a prediction is its value times the engine profile's bias on
        # real runs, and sits inside its interval.
        out.print("predicted with 80 % intervals (" + (summary.cost_model.engine or "") + ", the simulated values "
                  "corrected by its cross-validated errors on real runs): " + ", ".join(
                      f"{k.replace('_s.', ' ')} {ms(summary.predicted.get(k))} ms ({ms(lo)}-{ms(hi)})"
                      for k, (lo, hi) in summary.intervals.items()))
        if summary.extrapolated_across:
            out.print("intervals widened: extrapolated across " + "; ".join(summary.extrapolated_across),
                      highlight=False)
    t, c, u = summary.throughput, summary.cost, summary.utilization
    out.print(f"{summary.num_finished}/{summary.num_requests} requests finished "
              f"({summary.num_rejected} rejected) in {summary.duration_s:.1f} simulated s: "
              f"{t.requests_per_s:.2f} req/s, {t.output_tokens_per_s:,.0f} output tok/s, "
              f"{t.total_tokens_per_s:,.0f} total tok/s")
    out.print(f"KV cache: mean {summary.kv_utilization.mean:.0%}, max {summary.kv_utilization.max:.0%} | "
              f"preemptions {summary.preemptions} | prefix-cache hit rate {summary.prefix_cache_hit_rate:.1%} | "
              f"MFU {u.mfu:.1%}, MBU {u.mbu:.1%}, busy {u.busy_fraction:.0%}")
    if summary.kv_offload is not None:
        out.print(labels.cache_words(summary))
    if summary.disaggregation is not None:
        out.print(labels.pool_words(summary))
    if labels.context_parallel_words(summary):
        out.print(labels.context_parallel_words(summary))
    if c.usd_per_hour is not None:
        per_m = c.usd_per_million_output_tokens
        out.print(f"cost: ${c.usd_per_hour:.2f}/hour, {c.gpu_hours:.2f} GPU-hours, "
                  f"${per_m:.3f} per million output tokens" if per_m is not None else "")
    slo = summary.slo
    if slo.targets:
        verdict = ", ".join(f"{k} {ms(slo.measured[k])} ms {'<=' if slo.met[k] else '>'} "
                            f"{ms(v)} ms" for k, v in slo.targets.items())
        out.print(f"SLOs {'met' if slo.all_met else 'NOT met'}: {verdict}; "
                  f"{slo.requests_within_slo:.1%} of requests within all; goodput "
                  f"{summary.goodput.requests_per_s:.2f} req/s")
    for reason, count in list(summary.rejections.items())[:3]:
        out.print(f"rejected {count}: {reason}")


# Every knob of every group (simulator/fleet/knobs.py) is an option; --model and --hardware may be
# left out for --replay.
OPTIONS = tuple(Options(group, defaults={"model": None, "hardware": None} if group is Served else {})
                for group in GROUPS)
# What --replay takes from the replay folder instead of the command line: the trace and every knob
# a replay records; those declared replayed=False stay the command line's.
KEPT_ON_REPLAY = tuple(name for options in OPTIONS for name in options.fields
                       if knob_extra(options.group.model_fields[name]).get("replayed", True) is False)
FROM_REPLAY = ("trace", "rate_scale", "max_concurrency", *(options.flag(name).replace("-", "_") for options in OPTIONS
                                         for name in options.fields if name not in KEPT_ON_REPLAY))


def replay_setup(ctx: typer.Context, folder: Path, knobs: Knobs):
    """(config, trace, rate scale) of what a replay folder sent, on the server it ran against;
    ValueError for flags the replay already sets."""
    from calibrate.runs.sources import replay_config
    from calibrate.runs.replay_summary import read_replay
    # By name: typer carries its own copy of click's ParameterSource.
    given = [name for name in FROM_REPLAY if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"]
    if given:
        raise ValueError(f"--replay takes the trace and the server from {folder}: drop "
                         + ", ".join(f"--{name.replace('_', '-')}" for name in given))
    replayed = read_replay(folder)
    targets = replayed.summary.slo.targets if replayed.summary.slo is not None else {}
    # The knobs a replay leaves to the command line, where given: --hardware and --profile stand in
    # for the recorded ones (the replay on another device), --slo for its targets.
    own = {name: knobs[name] for name in KEPT_ON_REPLAY if knobs[name] not in (None, "")}
    config = replay_config(replayed, **{**own, "slo": own.get("slo") or targets})
    return config, replayed.info.trace, replayed.info.rate_scale


@takes(*OPTIONS)
def simulate_command(
    ctx: typer.Context,
    trace: Optional[str] = typer.Option(None, help="trace file (Azure/Vidur CSV, Mooncake JSONL, lengths CSV,rate=R) "
                                        "or synthetic:num=N,input=I,output=O,rate=R"),
    replay: Optional[Path] = typer.Option(None, help="instead of --model/--trace and the fleet flags: simulate what a "
                                          "replay folder (servecast replay --out) sent, on the server it recorded "
                                          "(--hardware / --profile: on another device); then servecast compare the "
                                          "two summaries"),
    knobs: Knobs = None,
    rate_scale: float = typer.Option(1.0, help="multiply the trace's arrival rate"),
    max_concurrency: Optional[int] = typer.Option(None, help="closed-loop clients: at most this many requests in "
                                                  "flight, the next sent as one finishes (the trace's concurrency=C; "
                                                  "servecast replay --max-concurrency sends the same way)"),
    workers: int = typer.Option(max(1, os.cpu_count() or 1), help="processes for the replicas under round-robin "
                                "routing (the same results; other routers use one)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON on stdout, nothing else"),
    out: Optional[Path] = typer.Option(None, help="write summary.json, requests.parquet, timeseries.parquet, report.html"),
) -> None:
    """Simulate a serving fleet on a trace: latencies, throughput, SLOs, utilization and cost."""
    from simulator.fleet.sim_config import SimConfig

    try:
        if replay is not None:
            config, trace, rate_scale = replay_setup(ctx, replay, knobs)
        elif knobs["model"] is None or knobs["hardware"] is None or trace is None:
            missing = [f"--{n}" for n, v in (("model", knobs["model"]), ("hardware", knobs["hardware"]),
                                             ("trace", trace)) if v is None]
            raise ValueError(f"give {', '.join(missing)} (or --replay DIR to simulate a replay)")
        else:
            config = SimConfig(**knobs)
        config.engine_profile()  # an unknown engine is bad input
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, got {workers}")
        result = run_simulation(config, trace, rate_scale, as_json, workers, max_concurrency)
    except ValidationError as exc:
        fail(validation_message(exc))
    except ValueError as exc:
        fail(str(exc))
    if out is not None:
        write_outputs(out, result)
    if as_json:
        typer.echo(dumps(result.summary))
        return
    print_summary(result.summary)
    if out is not None:
        Console().print(f"wrote {out}/summary.json, requests.parquet, timeseries.parquet, report.html")
