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


def run_simulation(config, trace: str, rate_scale: float, as_json: bool, workers: int = 1):
    from calibrate.fitting.device import cost_models_for
    from simulator.fleet.run import simulate
    from simulator.workload.load import load_workload

    # Everything that can fail on bad input fails here, before the progress bar.
    config.check()
    cost_model, draft_cost_model = cost_models_for(config)
    workload = load_workload(trace, seed=config.seed, rate_scale=rate_scale)
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
        out.print("80 % intervals (" + (summary.cost_model.engine or "") + ", from its cross-validated "
                  "errors on real runs): " + ", ".join(
                      f"{k.replace('_s.', ' ')} {ms(lo)}-{ms(hi)} ms" for k, (lo, hi) in summary.intervals.items()))
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


# What --replay takes from the replay folder instead of the command line.
FROM_REPLAY = ("model", "trace", "tp", "pp", "cp", "replicas", "quant", "kv_dtype", "activation_dtype", "block_size",
               "max_num_seqs", "max_num_batched_tokens", "max_model_len", "gpu_memory_utilization", "num_gpu_blocks",
               "chunked_prefill", "prefix_caching", "scheduler", "router", "rate_scale", "seed", "speculative",
               "num_speculative_tokens", "acceptance", "acceptance_file", "draft_model", "draft_profile",
               "expert_parallel", "routing_skew", "kv_offload_gb", "disaggregate", "prefill_hardware", "prefill_tp",
               "prefill_quant", "prefill_cp", "kv_transfer_gbps", "kv_transfer_latency_s")


def replay_setup(ctx: typer.Context, folder: Path, hardware: str | None, profile: Path | None,
                 hardware_file: Path | None, slo: str, engine: str | None, engine_file: Path | None):
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
    # --hardware and --profile, where given, stand in for the recorded ones: the replay on another device.
    optional = {"engine_file": engine_file, "hardware_file": hardware_file, "hardware": hardware, "profile": profile}
    config = replay_config(replayed, slo=slo or targets, engine=engine,
                           **{k: str(v) for k, v in optional.items() if v is not None})
    return config, replayed.info.trace, replayed.info.rate_scale


def simulate_command(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(None, help="catalog model id (llama-3.1-8b, ...) or an HF config.json path"),
    hardware: Optional[str] = typer.Option(None, help="catalog hardware id (a100-80gb, h100-sxm, ...) or cpu-local "
                                           "with --profile"),
    trace: Optional[str] = typer.Option(None, help="trace file (Azure/Vidur CSV, Mooncake JSONL, lengths CSV,rate=R) "
                                        "or synthetic:num=N,input=I,output=O,rate=R"),
    replay: Optional[Path] = typer.Option(None, help="instead of --model/--trace and the fleet flags: simulate what a "
                                          "replay folder (servecast replay --out) sent, on the server it recorded "
                                          "(--hardware / --profile: on another device); then servecast compare the "
                                          "two summaries"),
    tp: int = typer.Option(1), pp: int = typer.Option(1), replicas: int = typer.Option(1),
    cp: int = typer.Option(1, help="context-parallel ranks per replica, each a TP group: a replica uses tp x pp x cp "
                           "GPUs, each sequence's KV split over the ranks (cp x the KV tokens), prefills by ring "
                           "attention"),
    quant: str = typer.Option("bf16", help="weight precision: bf16, fp16, fp8, int8, int4"),
    kv_dtype: str = typer.Option("auto", help="KV-cache precision: auto, bf16, fp8, int8"),
    activation_dtype: str = typer.Option("auto", help="what GEMMs compute in: auto (bf16 under int8/int4 "
                                         "weights, fp8 with fp8), fp32 (servecast's CPU engine), bf16, fp16, fp8"),
    block_size: int = typer.Option(16), max_num_seqs: int = typer.Option(256),
    max_num_batched_tokens: int = typer.Option(8192), max_model_len: Optional[int] = typer.Option(None),
    gpu_memory_utilization: float = typer.Option(0.9),
    num_gpu_blocks: Optional[int] = typer.Option(None, help="KV blocks per replica instead of planning memory"),
    chunked_prefill: bool = typer.Option(True, "--chunked-prefill/--no-chunked-prefill"),
    prefix_caching: bool = typer.Option(True, "--prefix-caching/--no-prefix-caching"),
    scheduler: str = typer.Option("continuous", help="continuous or static batching"),
    router: str = typer.Option("round_robin", help="round_robin, least_outstanding_tokens, prefix_affinity"),
    slo: str = typer.Option("", help="e.g. ttft_p99=2s,tpot_p99=100ms"),
    rate_scale: float = typer.Option(1.0, help="multiply the trace's arrival rate"),
    profile: Optional[Path] = typer.Option(None, help="a servecast profile of the hardware (for *-local devices)"),
    hardware_file: Optional[Path] = typer.Option(None, help="YAML with extra accelerators"),
    seed: int = typer.Option(0),
    speculative: Optional[str] = typer.Option(None, help="speculative decoding: ngram or draft"),
    num_speculative_tokens: int = typer.Option(0, help="draft tokens per verification (1..8)"),
    acceptance: Optional[float] = typer.Option(None, help="probability a draft is accepted given the earlier ones"),
    acceptance_file: Optional[Path] = typer.Option(None, help="measured acceptance.json (servecast train-pair)"),
    draft_model: Optional[str] = typer.Option(None, help="the draft's catalog id or config.json (--speculative draft)"),
    draft_profile: Optional[Path] = typer.Option(None, help="a profile of the draft on this hardware (*-local devices)"),
    expert_parallel: bool = typer.Option(False, "--expert-parallel", help="MoE models: whole experts per TP rank "
                                         "with all-to-all, instead of a slice of every expert"),
    routing_skew: float = typer.Option(0.0, help="MoE router imbalance: 0 uniform, s > 0 Zipf shares 1/(e+1)^s"),
    kv_offload_gb: float = typer.Option(0.0, help="GB of host memory per replica for a CPU tier of the prefix "
                                        "cache: evicted blocks move there and load back over the host link on a hit"),
    disaggregate: Optional[str] = typer.Option(None, help="P:D, e.g. 2:6: a pool of P prefill replicas and one of D "
                                               "decode replicas (instead of --replicas); each prompt's KV is sent "
                                               "from its prefill replica to a decode replica"),
    prefill_hardware: Optional[str] = typer.Option(None, help="--disaggregate: the prefill pool's accelerator "
                                                   "(default: --hardware)"),
    prefill_tp: Optional[int] = typer.Option(None, help="--disaggregate: the prefill pool's TP (default: --tp)"),
    prefill_quant: Optional[str] = typer.Option(None, help="--disaggregate: the prefill pool's weights (default: "
                                                "--quant)"),
    prefill_cp: Optional[int] = typer.Option(None, help="--disaggregate: the prefill pool's CP (default: --cp)"),
    kv_transfer_gbps: float = typer.Option(50.0, help="--disaggregate: GB/s per GPU, one way, of the link a prompt's "
                                           "KV crosses (default: 400 Gb/s InfiniBand per GPU)"),
    kv_transfer_latency_s: float = typer.Option(0.001, help="--disaggregate: seconds each KV transfer takes beyond "
                                                "its bytes"),
    engine: Optional[str] = typer.Option(None, help="serving engine whose overheads the step times carry: vllm-v0.15 "
                                         "(the default on catalog GPUs) or servecast (this project's engine; the "
                                         "default on profiled devices)"),
    engine_file: Optional[Path] = typer.Option(None, help="an engine profile fitted on your own runs "
                                               "(servecast calibrate --runs)"),
    workers: int = typer.Option(max(1, os.cpu_count() or 1), help="processes for the replicas under round-robin "
                                "routing (the same results; other routers use one)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON on stdout, nothing else"),
    out: Optional[Path] = typer.Option(None, help="write summary.json, requests.parquet, timeseries.parquet, report.html"),
) -> None:
    """Simulate a serving fleet on a trace: latencies, throughput, SLOs, utilization and cost."""
    from simulator.fleet.sim_config import SimConfig

    try:
        if replay is not None:
            config, trace, rate_scale = replay_setup(ctx, replay, hardware, profile, hardware_file, slo, engine,
                                                     engine_file)
        elif model is None or hardware is None or trace is None:
            missing = [f"--{n}" for n, v in (("model", model), ("hardware", hardware), ("trace", trace)) if v is None]
            raise ValueError(f"give {', '.join(missing)} (or --replay DIR to simulate a replay)")
        else:
            config = SimConfig(model=model, hardware=hardware, tp=tp, pp=pp, cp=cp, replicas=replicas, quant=quant,
                               kv_dtype=kv_dtype, activation_dtype=activation_dtype, block_size=block_size, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                               gpu_memory_utilization=gpu_memory_utilization, num_gpu_blocks=num_gpu_blocks,
                               enable_chunked_prefill=chunked_prefill, enable_prefix_caching=prefix_caching,
                               scheduler=scheduler, router=router, slo=slo, seed=seed,
                               profile=str(profile) if profile else None,
                               hardware_file=str(hardware_file) if hardware_file else None,
                               speculative=speculative, num_speculative_tokens=num_speculative_tokens,
                               acceptance=acceptance, acceptance_file=str(acceptance_file) if acceptance_file else None,
                               draft_model=draft_model, draft_profile=str(draft_profile) if draft_profile else None,
                               expert_parallel=expert_parallel, routing_skew=routing_skew,
                               kv_offload_gb=kv_offload_gb, disaggregate=disaggregate,
                               prefill_hardware=prefill_hardware, prefill_tp=prefill_tp, prefill_quant=prefill_quant,
                               prefill_cp=prefill_cp,
                               kv_transfer_gbps=kv_transfer_gbps, kv_transfer_latency_s=kv_transfer_latency_s,
                               engine=engine,
                               engine_file=str(engine_file) if engine_file else None)
        config.engine_profile()  # an unknown engine is bad input
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, got {workers}")
        result = run_simulation(config, trace, rate_scale, as_json, workers)
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
