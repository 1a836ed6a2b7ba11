"""The servecast command line."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="servecast: LLM-inference capacity planning on a real engine and a calibrated simulator.")
console = Console(stderr=True)


@app.callback()
def root() -> None:
    """servecast: LLM-inference capacity planning on a real engine and a calibrated simulator."""


def fail(message: str) -> None:
    """Bad input: one clear line on stderr, exit status 2, no traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def parse_rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        fail(f"--rate must be a number of requests/s or 'inf', got {text!r}")
    if math.isnan(rate) or rate <= 0:
        fail(f"--rate must be positive (requests/s) or 'inf', got {text!r}")
    return rate


@app.command()
def generate(
    model: Optional[Path] = typer.Option(None, help="HF config.json (random weights) or a local model directory "
                                                    "with safetensors; default: a small bundled Llama config"),
    num_requests: int = typer.Option(32, help="requests to serve"),
    rate: str = typer.Option("8", help="Poisson arrival rate in requests/s, or 'inf' for all at once"),
    lengths: Optional[Path] = typer.Option(None, help="CSV of prompt_tokens,output_tokens (default: bundled ShareGPT sample)"),
    length_scale: float = typer.Option(1 / 8, help="multiply trace lengths by this (fit a CPU / small model)"),
    max_total_tokens: int = typer.Option(512, help="cap prompt+output per request"),
    block_size: int = typer.Option(16),
    num_blocks: Optional[int] = typer.Option(None, help="KV pool size in blocks (default: a byte budget)"),
    max_num_seqs: int = typer.Option(64),
    max_num_batched_tokens: int = typer.Option(512),
    prefix_caching: bool = typer.Option(True, "--prefix-caching/--no-prefix-caching"),
    chunked_prefill: bool = typer.Option(True, "--chunked-prefill/--no-chunked-prefill"),
    device: str = typer.Option("cpu"),
    dtype: str = typer.Option("float32"),
    tp: int = typer.Option(1, "--tp", help="tensor-parallel ranks (one process each; gloo on CPU, NCCL on GPUs)"),
    quantization: Optional[str] = typer.Option(None, help="weight-only quantization: int8, int4 or fp8"),
    quant_group_size: int = typer.Option(128, help="int4 group size (32, 64, 128 or 256)"),
    kv_cache_dtype: Optional[str] = typer.Option(None, help="KV cache stored as int8 or fp8"),
    seed: int = typer.Option(0),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON on stdout, nothing else"),
    out: Optional[Path] = typer.Option(None, help="write summary.json and requests.csv here"),
) -> None:
    """Serve a workload through the real engine and print per-request timings (the bundled default job)."""
    from app.demo import DEMO_MODEL, DemoWorkload, demo_requests
    from app.report import request_rows, summarize
    from engine import EngineConfig, LLMEngine
    from engine.replay import replay
    from simulator.workload.requests import BUNDLED_LENGTHS

    rate_per_s = parse_rate(rate)
    try:
        workload = DemoWorkload(num_requests, rate_per_s, length_scale, max_total_tokens, seed)
        config = EngineConfig(block_size=block_size, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=prefix_caching,
                              enable_chunked_prefill=chunked_prefill, device=device, dtype=dtype, seed=seed,
                              max_model_len=max_total_tokens if model is None else None, tensor_parallel_size=tp,
                              quantization=quantization, quant_group_size=quant_group_size,
                              kv_cache_dtype=kv_cache_dtype)
        if model is None:
            engine = LLMEngine.from_config(DEMO_MODEL, config, seed=seed)
        elif model.is_dir() and any(model.glob("*.safetensors")):
            engine = LLMEngine.from_hf(model, config)
        else:
            engine = LLMEngine.from_config(model, config, seed=seed)
        requests = demo_requests(workload, engine.model_config.vocab_size, lengths or BUNDLED_LENGTHS)
        with Progress(TextColumn("serving"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=as_json) as progress:
            task = progress.add_task("serve", total=len(requests))
            outputs = replay(engine, requests, on_finish=lambda _: progress.advance(task))
        engine.close()
    except ValueError as exc:
        fail(str(exc))

    rows = request_rows(outputs)
    summary = summarize(outputs)
    summary["engine"] = {"model": str(model or "bundled demo llama (random weights)"),
                         "parameters": engine.model_config.num_parameters(), "device": device, "dtype": dtype,
                         "kv_blocks": engine.cache_config.num_blocks, "block_size": block_size,
                         "steps": engine.num_steps, "tensor_parallel_size": tp, "quantization": quantization,
                         "kv_cache_dtype": kv_cache_dtype}
    load = engine.expert_load()
    if load:  # a mixture-of-experts model: how its router spread the rows, and the simulator's knob for it
        from simulator.cost.moe import fit_routing_skew

        per_expert = [sum(layer[e] for layer in load) for e in range(len(load[0]))]
        summary["engine"]["expert_rows"] = per_expert
        summary["engine"]["routing_skew"] = round(fit_routing_skew(per_expert), 3)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        with (out / "requests.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    print_report(rows, summary)


def print_report(rows: list[dict], summary: dict) -> None:
    stdout = Console(width=max(Console().width, 110))
    table = Table(title="Per-request timings")
    for column in ("request", "arrival s", "prompt tok", "output tok", "queue ms", "TTFT ms", "TPOT ms",
                   "E2E s", "preempted", "cached tok"):
        table.add_column(column, justify="right")
    ms = lambda v: "-" if v is None else f"{v * 1e3:.1f}"  # noqa: E731
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


def _engine_model_config(model: str):
    """An engine ModelConfig from a catalog id, a config.json path or 'demo'."""
    from app.demo import DEMO_MODEL
    from engine.config import ModelConfig
    from simulator.catalog.models import model_config_path

    if model == "demo":
        return ModelConfig.from_hf(DEMO_MODEL)
    return ModelConfig.from_hf(model_config_path(model))


@app.command()
def profile(
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
    expert_parallel: bool = typer.Option(False, "--expert-parallel", help="MoE models under --tp: whole experts "
                                         "per rank, and time the all-to-all that feeds them"),
    threads: Optional[int] = typer.Option(None, help="CPU threads for torch (default: torch's choice); "
                                                     "recorded in the profile's fingerprint"),
    quant: str = typer.Option("", help="also time weight-only quantized linear layers: e.g. int8,int4,fp8"),
    quant_group_size: int = typer.Option(128, help="int4 group size for --quant"),
    kv_quant: str = typer.Option("", help="also time reads of a quantized KV cache: e.g. int8,fp8"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON summary on stdout"),
) -> None:
    """Time the engine's operators on this device over a grid and write (or resume) a profile."""
    from dataclasses import replace

    from calibrate.profiler import Profiler, ProfileGrid
    from engine.engine import resolve_device
    from simulator.catalog.hardware import get_accelerator
    from engine.config import DTYPE_BYTES, check_quantization

    try:
        config = _engine_model_config(model)
        if expert_parallel:
            if not config.num_experts:
                raise ValueError(f"--expert-parallel needs a mixture-of-experts model; {model} is dense: drop it")
            config = replace(config, expert_parallel=True)
        resolve_device(device)
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPE_BYTES)}")
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
        profiler = Profiler(config, device=device, dtype=dtype, hardware=hardware, grid=grid, tp=tp)
        with Progress(TextColumn("profiling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=as_json) as progress:
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


@app.command()
def predict(
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
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Per-operator and per-step time of one forward pass, with where each number comes from."""
    from simulator.catalog.models import load_model
    from simulator.cost.model import Chunk, CostModel

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
        cost_model = CostModel.load(hardware, profile=profile_path, hardware_file=hardware_file)
        chunks = ([Chunk(1, context)] * decode_batch if decode_batch else [Chunk(tokens, tokens)])
        step = cost_model.step_time(chunks, spec, tp=tp, dtype=dtype, expert_parallel=expert_parallel,
                                    routing_skew=routing_skew)
    except ValueError as exc:
        fail(str(exc))
    result = {"hardware": hardware, "model": spec.name, "tp": tp, "dtype": dtype,
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
    Console(width=max(Console().width, 100)).print(table)
    Console().print(f"step time: {step.total_s * 1e3:.3f} ms")


@app.command()
def calibrate(
    shared: Path = typer.Option(Path("../shared"), help="the shared data folder with profiles/vidur"),
    out: Optional[Path] = typer.Option(None, help="parameter file to write (default: the shipped one)"),
) -> None:
    """Refit the shipped efficiency curves on the Vidur A100 profiles; print the A40 held-out error."""
    from calibrate.fit import PARAMS_OUT, build_params

    try:
        params = build_params(shared.resolve(), out or PARAMS_OUT)
    except ValueError as exc:
        fail(str(exc))
    Console().print(f"wrote {out or PARAMS_OUT}; A40 held-out MAPE: " +
                    ", ".join(f"{k} {v:.1%}" for k, v in params["held_out_a40_mape"].items()))


@app.command("import-vidur")
def import_vidur(
    csv_path: Path = typer.Argument(..., help="a Vidur mlp.csv, attention.csv, all_reduce.csv or send_recv.csv"),
    out: Path = typer.Option(..., help="servecast profile to write"),
    hardware: Optional[str] = typer.Option(None, help="catalog id (default: from the Vidur path)"),
) -> None:
    """Convert a Vidur profiling CSV into a servecast profile."""
    from calibrate.vidur import import_vidur_attention, import_vidur_compute, import_vidur_network
    from simulator.catalog.hardware import get_accelerator

    try:
        if csv_path.name == "mlp.csv":
            result = import_vidur_compute(csv_path, hardware)
        elif csv_path.name == "attention.csv":
            result = import_vidur_attention(csv_path, hardware)
        else:
            if hardware is None:
                raise ValueError("--hardware is needed for a network CSV")
            result = import_vidur_network(csv_path, hardware)
        get_accelerator(result.hardware)
        result.save(out)
    except ValueError as exc:
        fail(str(exc))
    Console().print(f"{len(result.measurements)} measurements of {result.hardware} written to {out}")


@app.command("app")
def app_command(port: int = typer.Option(8501, help="port to serve the app on"),
                headless: bool = typer.Option(False, "--headless", help="do not open a browser")) -> None:
    """Open the Streamlit app: plan a fleet, look at a trace."""
    import subprocess
    import sys
    from importlib.util import find_spec

    if find_spec("streamlit") is None:
        fail("the app needs streamlit: pip install 'streamlit>=1.40'")
    if not 0 < port < 65536:
        fail(f"--port must be 1..65535, got {port}")
    main_page = Path(__file__).parent / "dashboard" / "main.py"
    command = [sys.executable, "-m", "streamlit", "run", str(main_page), "--server.port", str(port),
               "--server.headless", "true" if headless else "false", "--browser.gatherUsageStats", "false"]
    raise typer.Exit(subprocess.call(command))


def _register() -> None:
    from app.plan_command import plan_command
    from app.simulate_command import simulate_command
    from app.spec_pair_command import acceptance_command, train_pair_command
    from app.validate_command import validate_command

    app.command("simulate")(simulate_command)
    app.command("plan")(plan_command)
    app.command("validate")(validate_command)
    app.command("train-pair")(train_pair_command)
    app.command("acceptance")(acceptance_command)


_register()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
